// MnistData::load and DataShard.
#include <sys/stat.h>

#include <algorithm>
#include <random>

#include "ps/errors.h"
#include "ps/mnist.h"

namespace ps {
namespace {

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// splitmix64: spreads (seed, worker, epoch) over the mt19937_64 seed space.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, n), by rejection: no modulo bias, same on every platform.
uint64_t below(std::mt19937_64& g, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  while (true) {
    uint64_t r = g();
    if (r >= threshold) return r % n;
  }
}

Examples slice(const IdxImages& im, const std::vector<int32_t>& labels, int64_t from, int64_t to) {
  Examples e;
  e.dim = im.rows * im.cols;
  e.size = to - from;
  e.images.assign(im.pixels.begin() + from * e.dim, im.pixels.begin() + to * e.dim);
  e.labels.assign(labels.begin() + from, labels.begin() + to);
  return e;
}

}  // namespace

MnistData MnistData::load(const std::string& dir, int64_t validation_size) {
  const char* names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  std::string paths[4];
  std::string missing;
  for (int i = 0; i < 4; ++i) {
    const std::string base = dir + "/" + names[i];
    if (exists(base))
      paths[i] = base;
    else if (exists(base + ".gz"))
      paths[i] = base + ".gz";
    else
      missing += (missing.empty() ? "" : ", ") + base + "[.gz]";
  }
  if (!missing.empty())
    throw ConfigError("MNIST data not found in '" + dir + "': looked for " + missing +
                      " (scripts/get_data.sh provides Fashion-MNIST)");

  IdxImages train_im = read_idx_images(paths[0]);
  std::vector<int32_t> train_lb = read_idx_labels(paths[1], kNumClasses);
  IdxImages test_im = read_idx_images(paths[2]);
  std::vector<int32_t> test_lb = read_idx_labels(paths[3], kNumClasses);
  auto same_count = [](const IdxImages& im, const std::vector<int32_t>& lb, const std::string& ip,
                       const std::string& lp) {
    if (im.count != static_cast<int64_t>(lb.size()))
      throw ConfigError("count mismatch: " + ip + " has " + std::to_string(im.count) +
                        " images but " + lp + " has " + std::to_string(lb.size()) + " labels");
  };
  same_count(train_im, train_lb, paths[0], paths[1]);
  same_count(test_im, test_lb, paths[2], paths[3]);
  // An empty test set would report an accuracy of 0 as a result.
  if (test_im.count == 0)
    throw ConfigError(paths[2] + " holds no images: there is nothing to test on");
  if (train_im.rows != test_im.rows || train_im.cols != test_im.cols)
    throw ConfigError("image size mismatch: " + paths[0] + " is " + std::to_string(train_im.rows) +
                      "x" + std::to_string(train_im.cols) + " but " + paths[2] + " is " +
                      std::to_string(test_im.rows) + "x" + std::to_string(test_im.cols));
  if (validation_size < 0 || validation_size >= train_im.count)
    throw ConfigError("validation size " + std::to_string(validation_size) + " must be in 0.." +
                      std::to_string(train_im.count - 1) + " (" + paths[0] + " has " +
                      std::to_string(train_im.count) + " images)");

  MnistData d;
  d.rows = train_im.rows;
  d.cols = train_im.cols;
  const int64_t n_train = train_im.count - validation_size;
  d.train = slice(train_im, train_lb, 0, n_train);
  d.validation = slice(train_im, train_lb, n_train, train_im.count);
  d.test = slice(test_im, test_lb, 0, test_im.count);
  return d;
}

DataShard::DataShard(const Examples& data, int worker, int num_workers, uint64_t seed)
    : data_(data), worker_(worker), seed_(seed) {
  if (num_workers < 1 || worker < 0 || worker >= num_workers)
    throw ConfigError("data shard: worker " + std::to_string(worker) + " of " +
                      std::to_string(num_workers) + " is out of range");
  begin_ = data.size * worker / num_workers;
  end_ = data.size * (worker + 1) / num_workers;
  if (end_ == begin_)
    throw ConfigError("data shard: worker " + std::to_string(worker) + " of " +
                      std::to_string(num_workers) + " gets no examples (" +
                      std::to_string(data.size) + " in all)");
  shuffle_into(0, order_);
}

void DataShard::shuffle_into(int64_t e, std::vector<int64_t>& out) const {
  out.resize(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) out[i] = begin_ + i;
  std::mt19937_64 g(
      mix(mix(mix(seed_) ^ static_cast<uint64_t>(worker_)) ^ static_cast<uint64_t>(e)));
  for (int64_t i = size() - 1; i > 0; --i)
    std::swap(out[i], out[below(g, static_cast<uint64_t>(i) + 1)]);
}

std::vector<int64_t> DataShard::order_for_epoch(int64_t e) const {
  std::vector<int64_t> out;
  shuffle_into(e, out);
  return out;
}

Batch DataShard::next_batch(int batch_size) {
  if (batch_size < 1) throw ConfigError("batch size " + std::to_string(batch_size) + " < 1");
  const int dim = data_.dim;
  const size_t want = static_cast<size_t>(batch_size);
  if (batch_labels_.size() < want) {
    batch_images_.resize(want * dim);
    batch_labels_.resize(want);
  }
  for (int b = 0; b < batch_size; ++b) {
    if (pos_ == size()) {
      ++epoch_;
      shuffle_into(epoch_, order_);  // same capacity: no allocation
      pos_ = 0;
    }
    const int64_t idx = order_[static_cast<size_t>(pos_++)];
    std::copy_n(data_.image(idx), dim, batch_images_.data() + static_cast<size_t>(b) * dim);
    batch_labels_[b] = data_.labels[static_cast<size_t>(idx)];
  }
  return Batch{batch_images_.data(), batch_labels_.data(), batch_size, dim, epoch_};
}

}  // namespace ps
