// MNIST / Fashion-MNIST data in IDX format, and per-worker shards of it.
//
// Usage:
//   auto data = ps::MnistData::load(flags.data_dir);        // 55000/5000/10000
//   ps::DataShard shard(data.train, spec.worker_index(), spec.num_workers(),
//                       /*seed=*/42);
//   for (int step = 0; step < steps; ++step) {
//     ps::Batch b = shard.next_batch(100);  // b.images: (100, 784), b.labels: (100)
//     ...
//   }
//
// Files: train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each plain or gzipped
// (name + ".gz"; gzip is recognised by its magic bytes). scripts/get_data.sh
// makes such a directory from Debian's dataset-fashion-mnist package.
// Every problem with the files throws ps::ConfigError naming file and cause.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ps {

// An IDX3 image file (magic 0x00000803, uint8), as floats pixel/255 in [0,1].
struct IdxImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> pixels;  // (count, rows*cols), row-major
};
IdxImages read_idx_images(const std::string& path);

// An IDX1 label file (magic 0x00000801, uint8); every label must be in
// 0..num_classes-1.
std::vector<int32_t> read_idx_labels(const std::string& path, int num_classes = 10);

// Examples stored contiguously.
struct Examples {
  int64_t size = 0;
  int dim = 0;                  // rows*cols, 784 for MNIST
  std::vector<float> images;    // (size, dim)
  std::vector<int32_t> labels;  // (size)
  const float* image(int64_t i) const { return images.data() + i * dim; }
};

struct MnistData {
  Examples train;       // training set minus the validation tail
  Examples validation;  // the last validation_size examples of the training files
  Examples test;        // t10k
  int rows = 0;
  int cols = 0;
  static constexpr int kNumClasses = 10;

  // Loads the four files from dir. validation_size must be below the number
  // of training examples (0 allowed).
  static MnistData load(const std::string& dir, int64_t validation_size = 5000);
};

// A batch points into the shard's reused buffers: valid until the next
// next_batch() call on the same shard.
struct Batch {
  const float* images = nullptr;    // (size, dim)
  const int32_t* labels = nullptr;  // (size)
  int size = 0;
  int dim = 0;
  int64_t epoch = 0;  // epoch of the batch's last example (0-based)
};

// Worker `worker` of `num_workers`: the contiguous block
// [worker*N/num_workers, (worker+1)*N/num_workers) of `data` (disjoint
// blocks that cover all N examples), visited in a fresh random order every
// epoch. The order of epoch e is a Fisher-Yates shuffle driven by
// std::mt19937_64 seeded from (seed, worker, e) only, with our own bounded
// draw (std::shuffle and uniform_int_distribution differ between standard
// libraries), so it is the same on every platform and can be recomputed when
// resuming. Batches run across epoch boundaries: every batch is full.
// `data` must outlive the shard.
class DataShard {
 public:
  DataShard(const Examples& data, int worker, int num_workers, uint64_t seed);

  // Gathers the next batch_size examples into the reused buffers (they grow
  // only when batch_size does).
  Batch next_batch(int batch_size);

  int64_t size() const { return end_ - begin_; }
  int64_t begin() const { return begin_; }  // first index into data
  int64_t end() const { return end_; }
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return pos_; }  // examples used in this epoch
  // The current epoch's visiting order (indices into data).
  const std::vector<int64_t>& order() const { return order_; }
  // The order epoch e would use, without changing the shard.
  std::vector<int64_t> order_for_epoch(int64_t e) const;

 private:
  void shuffle_into(int64_t e, std::vector<int64_t>& out) const;

  const Examples& data_;
  int worker_;
  uint64_t seed_;
  int64_t begin_ = 0, end_ = 0;
  int64_t epoch_ = 0;
  int64_t pos_ = 0;
  std::vector<int64_t> order_;
  std::vector<float> batch_images_;    // (B, dim), reused
  std::vector<int32_t> batch_labels_;  // (B), reused
};

}  // namespace ps
