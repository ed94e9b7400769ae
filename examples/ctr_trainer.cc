// ctr_trainer: wide & deep click-through prediction with embedding tables on
// psd, between-graph replicated as mnist_trainer: the same program runs every
// role.
//
//   Deep part: the 26 categorical fields hashed to ids (ps/ctr_data.h), looked
//   up in a dynamic table of 16-float rows (Adagrad on psd), concatenated with
//   the 13 dense features into an MLP 429 -> 256 -> 128 -> 1 (weights dense
//   tensors on psd, --optimizer). Wide part: one weight per id of the 26 fields
//   and of 13 field crosses, in a dynamic table of dim 1 (FTRL on psd); its sum
//   is added to the MLP's logit. Logistic loss.
//
//   ctr_trainer --job_name=ps     --task_index=0 --ps_hosts=127.0.0.1:2222 --worker_hosts=...
//   ctr_trainer --job_name=worker --task_index=0 --ps_hosts=127.0.0.1:2222
//               --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 [--sync_replicas] --train_file
//               data/ctr/train.tsv
//   scripts/launch_local.sh --trainer build/examples/ctr_trainer -- --synthetic 300000
//
// --num_gpus 1 runs the deep part (its embedding bags and the dense head) on
// the worker's GPU (ps::CudaEmbeddingBag, ps::CudaLogisticMlp); the wide part,
// a sum of scalar weights per example, stays on the CPU.
//
// Data: a file in the Criteo TSV layout or a CSV with a header as Avazu's
// (--train_file, default <--data_dir>/train.tsv; the last --holdout of it is
// held out unless --eval_file is given; each worker reads and holds its
// share, ps::read_ctr_share), or --synthetic N examples drawn in memory from the
// planted model of ps/ctr_synthetic.h (its own held-out log-loss and AUC are
// printed: the best any learner can do). Each step: dedup the batch's ids per
// table, pull the rows of both tables (async, at once) and the dense weights,
// forward/backward, push rows and dense gradients. The chief evaluates the
// held-out log-loss and AUC at intervals and at the end.
// One file, like the other example trainers: the whole program in one place
// to read, from flags to model to training loop.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ps/flag_parsing.h"
#include "ps/binary_metrics.h"
#include "ps/client.h"
#include "ps/ctr_data.h"
#include "ps/ctr_synthetic.h"
#include "ps/embedding.h"
#include "ps/embedding_bag.h"
#include "ps/errors.h"
#include "ps/hooks.h"
#include "ps/logistic_mlp.h"
#include "ps/summary_writer.h"
#include "ps/trainer_flags.h"
#include "ps/trainer_main.h"
#include "ps/training_session.h"
#include "ps/worker_loop.h"
#include "server/ps_task.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr const char* kDeepTable = "ctr/deep_embeddings";
constexpr const char* kWideTable = "ctr/wide_weights";

struct CtrFlags {
  std::string train_file;  // empty: <data_dir>/train.tsv
  std::string eval_file;   // empty: the last `holdout` of the training data
  int64_t synthetic = 0;   // > 0: this many examples from the planted model, in memory
  uint64_t synthetic_seed = 1;
  int64_t synthetic_max_distinct = ps::CtrSyntheticOptions{}.max_distinct;
  double holdout = 0.1;
  std::string restore_from;  // chief: start from this checkpoint directory, tables included
  int embedding_dim = 16;
  std::string hidden_units = "256,128";
  float embedding_learning_rate = 0.05f;  // Adagrad on the deep table
  float wide_learning_rate = 0.01f;       // FTRL on the wide table
  float ftrl_l1 = 0.0f;
  float ftrl_l2 = 0.0f;
  float embedding_init = 0.0f;  // rows start uniform in [-x, x]
  bool stream_data = false;     // read (or draw) the share batch by batch, not held in memory
  uint64_t row_limit =
      0;  // per shard and table (0: none); at the limit the least recently used rows go
  uint32_t min_count = 0;           // a new id's row comes at its min_count-th push (0, 1: at once)
  uint32_t count_sketch_width = 0;  // min_count's counters per shard and table (0: psd's default)
  uint64_t expire_after_steps =
      0;               // rows untouched for this many global steps are dropped (0: never)
  int eval_every = 0;  // chief: evaluate every N local steps (0: twice per epoch)
  int eval_batch = 4096;
  int summary_every = 50;
};

// A worker's training batches, cycling through its share: a batch is cut
// short at the share's end, and the next starts over. The share is held in
// memory, or with --stream_data read from the file (or drawn) batch by batch.
class TrainBatches {
 public:
  virtual ~TrainBatches() = default;
  virtual int64_t share_size() const = 0;
  virtual std::span<const ps::CtrExample> next(std::size_t n) = 0;
};

class BatchesInMemory final : public TrainBatches {
 public:
  explicit BatchesInMemory(std::vector<ps::CtrExample> share) : share_(std::move(share)) {}
  int64_t share_size() const override { return static_cast<int64_t>(share_.size()); }
  std::span<const ps::CtrExample> next(std::size_t n) override {
    n = std::min(n, share_.size() - cursor_);
    const auto batch = std::span(share_).subspan(cursor_, n);
    cursor_ = cursor_ + n == share_.size() ? 0 : cursor_ + n;
    return batch;
  }

 private:
  std::vector<ps::CtrExample> share_;
  std::size_t cursor_ = 0;
};

class BatchesFromFile final : public TrainBatches {
 public:
  BatchesFromFile(const std::string& path, int worker, int workers, int64_t train_end)
      : stream_(path, worker, workers, train_end) {}
  int64_t share_size() const override { return stream_.share_size(); }
  std::span<const ps::CtrExample> next(std::size_t n) override {
    stream_.next(n, batch_);
    return batch_;
  }

 private:
  ps::CtrShareStream stream_;
  std::vector<ps::CtrExample> batch_;
};

class BatchesDrawn final : public TrainBatches {
 public:
  BatchesDrawn(const ps::CtrSyntheticOptions& opt, int worker, int workers)
      : gen_(opt), worker_(worker), workers_(workers) {
    share_ = ps::ctr_share_size(gen_.holdout_begin(), worker, workers);
  }
  int64_t share_size() const override { return share_; }
  std::span<const ps::CtrExample> next(std::size_t n) override {
    batch_.resize(
        static_cast<std::size_t>(std::min<int64_t>(static_cast<int64_t>(n), share_ - at_)));
    for (ps::CtrExample& e : batch_) gen_.example(worker_ + at_++ * workers_, e);
    if (at_ == share_) at_ = 0;
    return batch_;
  }

 private:
  ps::CtrSynthetic gen_;
  int worker_, workers_;
  int64_t share_ = 0, at_ = 0;  // the share's size; the next example's place in it
  std::vector<ps::CtrExample> batch_;
};

// The examples this worker trains on, and (chief) the held-out ones.
struct CtrDataSet {
  std::unique_ptr<TrainBatches> train;  // this worker's share
  std::vector<ps::CtrExample> holdout;  // chief only
  int64_t train_total = 0;              // training examples over all workers
  std::optional<ps::CtrPlantedStats>
      planted;  // --synthetic: the planted model on the held-out part
};

// Prints "worker W: <doing>: N%, S s" when called at least 5 s after the last
// line: a large file or --synthetic draw takes minutes, and says how far it is.
class LoadProgress {
 public:
  explicit LoadProgress(int worker) : worker_(worker) {}
  bool due() const { return std::chrono::steady_clock::now() >= next_; }
  void say(const std::string& doing, double percent) {
    const auto now = std::chrono::steady_clock::now();
    next_ = now + std::chrono::seconds(5);
    std::printf("worker %d: %s: %.0f%%, %.0f s\n", worker_, doing.c_str(), percent,
                std::chrono::duration<double>(now - start_).count());
    std::fflush(stdout);
  }

 private:
  int worker_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(),
                                        next_ = start_ + std::chrono::seconds(5);
};

CtrDataSet load_data(const ps::TrainerFlags& f, const CtrFlags& c, int worker, int workers,
                     bool chief) {
  CtrDataSet d;
  LoadProgress progress(worker);
  if (c.synthetic > 0) {
    ps::CtrSyntheticOptions opt;
    opt.examples = c.synthetic;
    opt.seed = c.synthetic_seed;
    opt.holdout_fraction = c.holdout;
    opt.max_distinct = c.synthetic_max_distinct;
    opt.validate();
    const ps::CtrSynthetic gen(opt);
    d.train_total = gen.holdout_begin();
    const int64_t share = ps::ctr_share_size(gen.holdout_begin(), worker, workers);
    ps::check_ctr_examples_fit(
        (c.stream_data ? 0 : share) + (chief ? opt.examples - gen.holdout_begin() : 0), 0,
        c.stream_data ? fmt::format("--synthetic {}: the held-out part", c.synthetic)
                      : fmt::format("--synthetic {}: worker {}'s share (--stream_data draws it "
                                    "batch by batch)",
                                    c.synthetic, worker));
    if (c.stream_data) {
      d.train = std::make_unique<BatchesDrawn>(opt, worker, workers);
    } else {
      const std::string doing = fmt::format("drawing its {} of --synthetic {}", share, c.synthetic);
      std::vector<ps::CtrExample> train;
      train.reserve(static_cast<std::size_t>(share));
      // Example i is a function of (seed, i): every worker draws its share only.
      for (int64_t i = worker; i < gen.holdout_begin(); i += workers) {
        gen.example(i, train.emplace_back());
        if ((train.size() & 65535) == 0 && progress.due())
          progress.say(doing,
                       100.0 * static_cast<double>(train.size()) / static_cast<double>(share));
      }
      d.train = std::make_unique<BatchesInMemory>(std::move(train));
    }
    if (chief) {
      std::vector<float> labels;
      std::vector<double> probs;
      for (int64_t i = gen.holdout_begin(); i < opt.examples; ++i) {
        probs.push_back(gen.example(i, d.holdout.emplace_back()));
        labels.push_back(d.holdout.back().label);
      }
      ps::CtrPlantedStats s;
      s.examples = opt.examples;
      s.holdout = static_cast<int64_t>(d.holdout.size());
      if (!d.holdout.empty()) {
        s.holdout_log_loss = ps::log_loss(labels, probs);
        s.holdout_auc = ps::roc_auc(labels, probs);
      }
      d.planted = s;
    }
    return d;
  }
  const std::string path = c.train_file.empty() ? f.data_dir + "/train.tsv" : c.train_file;
  ps::CtrShareOptions opt;
  opt.worker = worker;
  opt.workers = workers;
  opt.holdout = c.eval_file.empty() ? c.holdout : 0.0;
  opt.keep_holdout = chief && c.eval_file.empty();
  opt.keep_train = !c.stream_data;
  if (!c.stream_data) opt.too_large_hint = "; --stream_data reads it batch by batch";
  // A file's read, as LoadProgress says it: "reading <file> (N GB)" and a share done.
  auto reading = [&progress](std::string file) {
    return [&progress, file](const std::string& doing, uint64_t done, uint64_t total) {
      progress.say(
          fmt::format("{} {} ({:.2f} GB)", doing, file, static_cast<double>(total) / 1e9),
          total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 0.0);
    };
  };
  opt.progress = reading(path);
  ps::CtrShare share = ps::read_ctr_share(path, opt);
  if (share.train_end <= 0)
    throw ps::ConfigError(path + ": no training examples (after holding out " +
                          std::to_string(opt.holdout) + ")");
  d.train_total = share.train_end;
  if (c.stream_data)
    d.train = std::make_unique<BatchesFromFile>(path, worker, workers, share.train_end);
  else
    d.train = std::make_unique<BatchesInMemory>(std::move(share.train));
  if (chief && c.eval_file.empty()) d.holdout = std::move(share.holdout);
  if (chief && !c.eval_file.empty()) {
    ps::CtrShareOptions eval;
    eval.too_large_hint = "; --eval_file";
    eval.progress = reading(c.eval_file);
    d.holdout = ps::read_ctr_share(c.eval_file, eval).train;
  }
  return d;
}

// The deep part's arithmetic, on the CPU or on one GPU: its embedding bags
// (sums of the rows of each bag) and the dense head (ps::LogisticMlp's API).
class DeepPart {
 public:
  virtual ~DeepPart() = default;
  virtual std::string where() const = 0;
  virtual const ps::ParamLayout& layout() const = 0;
  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;
  virtual void bags_forward(std::span<const float> rows, int dim, std::span<const int64_t> offsets,
                            std::span<const int32_t> index, std::span<float> out) = 0;
  virtual void bags_backward(std::span<const float> grad_out, int dim,
                             std::span<const int64_t> offsets, std::span<const int32_t> index,
                             std::span<float> grad_rows) = 0;
  virtual double compute_gradients(std::span<const float> x, std::span<const float> labels,
                                   std::span<const float> extra_logit, std::span<float> dx,
                                   std::span<float> dlogit) = 0;
  virtual void predict(std::span<const float> x, std::span<const float> extra_logit,
                       std::span<float> probs) = 0;
};

// The CPU's embedding bags, with ps::CudaEmbeddingBag's member functions.
struct CpuBags {
  void forward(std::span<const float> rows, int dim, std::span<const int64_t> offsets,
               std::span<const int32_t> index, ps::BagCombiner combiner, std::span<float> out) {
    ps::embedding_bag_forward(rows, dim, offsets, index, combiner, out);
  }
  void backward(std::span<const float> grad_out, int dim, std::span<const int64_t> offsets,
                std::span<const int32_t> index, ps::BagCombiner combiner,
                std::span<float> grad_rows) {
    ps::embedding_bag_backward(grad_out, dim, offsets, index, combiner, grad_rows);
  }
};

// DeepPart over a head class (ps::LogisticMlp, ps::CudaLogisticMlp) and a
// bags class (CpuBags, ps::CudaEmbeddingBag), both made in place by the
// functions given.
template <class Head, class Bags>
class DeepPartOn final : public DeepPart {
 public:
  DeepPartOn(const auto& make_head, const auto& make_bags)
      : head_(make_head()), bags_(make_bags()) {}

  std::string where() const override {
    if constexpr (requires { head_.device_description(); })
      return head_.device_description();
    else
      return "the CPU";
  }
  const ps::ParamLayout& layout() const override { return head_.layout(); }
  std::span<float> params() override { return head_.params(); }
  std::span<float> grads() override { return head_.grads(); }
  void bags_forward(std::span<const float> rows, int dim, std::span<const int64_t> offsets,
                    std::span<const int32_t> index, std::span<float> out) override {
    bags_.forward(rows, dim, offsets, index, ps::BagCombiner::kSum, out);
  }
  void bags_backward(std::span<const float> grad_out, int dim, std::span<const int64_t> offsets,
                     std::span<const int32_t> index, std::span<float> grad_rows) override {
    bags_.backward(grad_out, dim, offsets, index, ps::BagCombiner::kSum, grad_rows);
  }
  double compute_gradients(std::span<const float> x, std::span<const float> labels,
                           std::span<const float> extra_logit, std::span<float> dx,
                           std::span<float> dlogit) override {
    return head_.compute_gradients(x, labels, extra_logit, dx, dlogit);
  }
  void predict(std::span<const float> x, std::span<const float> extra_logit,
               std::span<float> probs) override {
    head_.predict(x, extra_logit, probs);
  }

 private:
  Head head_;
  Bags bags_;
};

// The deep part on the CPU (num_gpus 0) or on CUDA device `device` (num_gpus
// 1); throws ConfigError, naming --num_gpus, when that GPU cannot be used.
std::unique_ptr<DeepPart> make_deep_part(const ps::MlpShape& shape, int max_batch, int num_gpus,
                                         int device) {
  if (num_gpus == 0) {
    return std::make_unique<DeepPartOn<ps::LogisticMlp, CpuBags>>(
        [&] { return ps::LogisticMlp(shape, max_batch); }, [] { return CpuBags{}; });
  }
  if (num_gpus > 1)
    throw ps::ConfigError(fmt::format(
        "--num_gpus={}: ctr_trainer computes on one GPU per worker (give --num_gpus 0 or 1)",
        num_gpus));
  try {
    return std::make_unique<DeepPartOn<ps::CudaLogisticMlp, ps::CudaEmbeddingBag>>(
        [&] { return ps::CudaLogisticMlp(shape, max_batch, device); },
        [&] { return ps::CudaEmbeddingBag(device); });
  } catch (const ps::ConfigError&) {
    throw;
  } catch (const ps::Error& e) {
    throw ps::ConfigError(fmt::format("--num_gpus=1: {}", e.what()));
  }
}

// The model's worker-side state: the deep part, the wide part's feature
// crosses and the buffers of a step.
class WideDeep {
 public:
  WideDeep(std::unique_ptr<DeepPart> deep, int dim)
      : dim_(dim), deep_part_(std::move(deep)), crosses_(ps::default_ctr_crosses()) {}

  DeepPart& head() { return *deep_part_; }  // its layout(), params() and grads() are the head's
  int wide_per_example() const { return ps::kCtrCategorical + static_cast<int>(crosses_.size()); }

  // Lays out a batch and deduplicates its ids per table.
  void prepare(std::span<const ps::CtrExample> examples) {
    ps::make_ctr_batch(examples, crosses_, batch_);
    ps::dedup_ids_into(batch_.ids, deep_);
    ps::dedup_ids_into(batch_.wide_ids, wide_);
    deep_rows_.resize(deep_.ids.size() * dim_);
    wide_rows_.resize(wide_.ids.size());
    deep_grads_.resize(deep_rows_.size());  // sized now: bind() hands them to the session
    wide_grads_.resize(wide_rows_.size());
    const int64_t b = batch_.size;
    if (deep_offsets_.size() != static_cast<size_t>(b * ps::kCtrCategorical + 1)) {
      deep_offsets_ = ps::fixed_offsets(b * ps::kCtrCategorical, 1);
      wide_offsets_ = ps::fixed_offsets(b, wide_per_example());
    }
  }
  int64_t size() const { return batch_.size; }
  size_t deep_rows() const { return deep_.ids.size(); }  // distinct ids of the prepared batch
  size_t wide_rows() const { return wide_.ids.size(); }

  // The rows of both tables, all at once; each future the step read at.
  std::pair<std::future<int64_t>, std::future<int64_t>> pull_rows_async(ps::Client& client,
                                                                        int64_t min_step) {
    return {client.pull_rows_async(kDeepTable, ps::as_table_ids(deep_.ids), deep_rows_, min_step),
            client.pull_rows_async(kWideTable, ps::as_table_ids(wide_.ids), wide_rows_, min_step)};
  }
  // The same rows for evaluation: the tables create no row for an id they
  // have not seen (ps::Client::lookup_rows).
  void lookup_rows(ps::Client& client) {
    auto deep = client.lookup_rows_async(kDeepTable, ps::as_table_ids(deep_.ids), deep_rows_);
    auto wide = client.lookup_rows_async(kWideTable, ps::as_table_ids(wide_.ids), wide_rows_);
    deep.get();
    wide.get();
  }

  // x (B, 13 + 26 * dim) and the wide logits (B) from the pulled rows.
  void forward() {
    const int64_t b = batch_.size;
    const int emb = ps::kCtrCategorical * dim_, in = ps::kCtrDense + emb;
    emb_.resize(b * emb);
    deep_part_->bags_forward(deep_rows_, dim_, deep_offsets_, deep_.index, emb_);
    x_.resize(b * in);
    for (int64_t i = 0; i < b; ++i) {
      std::copy_n(batch_.dense.data() + i * ps::kCtrDense, ps::kCtrDense, x_.data() + i * in);
      std::copy_n(emb_.data() + i * emb, emb, x_.data() + i * in + ps::kCtrDense);
    }
    wide_logit_.resize(b);
    ps::embedding_bag_forward(wide_rows_, 1, wide_offsets_, wide_.index, ps::BagCombiner::kSum,
                              wide_logit_);
  }

  // Gradients of the batch: the dense head's (of the mean loss) in
  // head().grads(), the tables' rows (of the summed loss: each example's
  // own gradient, as per-example Adagrad and FTRL take them) ready to push.
  double backward() {
    const int64_t b = batch_.size;
    const int emb = ps::kCtrCategorical * dim_, in = ps::kCtrDense + emb;
    dx_.resize(b * in);
    dlogit_.resize(b);
    const double loss = deep_part_->compute_gradients(x_, batch_.labels, wide_logit_, dx_, dlogit_);
    const float scale = static_cast<float>(b);
    for (int64_t i = 0; i < b; ++i) {
      const float* src = dx_.data() + i * in + ps::kCtrDense;
      float* dst = emb_.data() + i * emb;
      for (int j = 0; j < emb; ++j) dst[j] = src[j] * scale;
      dlogit_[i] *= scale;
    }
    deep_grads_.resize(deep_rows_.size());
    wide_grads_.resize(wide_rows_.size());
    deep_part_->bags_backward(emb_, dim_, deep_offsets_, deep_.index, deep_grads_);
    ps::embedding_bag_backward(dlogit_, 1, wide_offsets_, wide_.index, ps::BagCombiner::kSum,
                               wide_grads_);
    return loss;
  }

  // The prepared batch's rows for the session's next step: its pull reads
  // them with the dense weights, its push sends their gradients with theirs.
  void bind(ps::TrainingSession& session) {
    session.set_rows(kDeepTable, ps::as_table_ids(deep_.ids), deep_rows_, deep_grads_);
    session.set_rows(kWideTable, ps::as_table_ids(wide_.ids), wide_rows_, wide_grads_);
  }

  // probs (B) of the prepared batch with the pulled rows.
  void predict(std::span<float> probs) {
    forward();
    deep_part_->predict(x_, wide_logit_, probs);
  }
  std::span<const float> labels() const { return batch_.labels; }

 private:
  int dim_;
  std::unique_ptr<DeepPart> deep_part_;
  std::vector<ps::FieldCross> crosses_;
  ps::CtrBatch batch_;
  ps::UniqueIds deep_, wide_;
  std::vector<int64_t> deep_offsets_, wide_offsets_;
  std::vector<float> deep_rows_, wide_rows_, deep_grads_, wide_grads_;
  std::vector<float> emb_, x_, wide_logit_, dx_, dlogit_;
};

ps::MlpShape make_shape(const CtrFlags& c) {
  ps::MlpShape shape;
  shape.inputs = ps::kCtrDense + ps::kCtrCategorical * c.embedding_dim;
  shape.hidden = ps::parse_positive_ints("--hidden_units", c.hidden_units, "256,128");
  shape.classes = 1;
  shape.activation = ps::Activation::kRelu;
  shape.validate();
  return shape;
}

std::vector<ps::TableSpec> table_specs(const CtrFlags& c, uint64_t seed) {
  const ps::OnRowLimit on_limit = ps::OnRowLimit::kEvictLru;
  return {{.name = kDeepTable,
           .dim = static_cast<uint32_t>(c.embedding_dim),
           .dynamic = true,
           .placement = ps::TablePlacement::kHash,
           .optimizer = ps::RowOptimizerConfig::adagrad(c.embedding_learning_rate),
           .init = c.embedding_init > 0
                       ? ps::InitConfig::uniform(-c.embedding_init, c.embedding_init, seed)
                       : ps::InitConfig::zeros(),
           .row_limit = c.row_limit,
           .on_limit = on_limit,
           .min_count = c.min_count,
           .count_sketch_width = c.count_sketch_width,
           .expire_after_steps = c.expire_after_steps},
          {.name = kWideTable,
           .dim = 1,
           .dynamic = true,
           .placement = ps::TablePlacement::kHash,
           .optimizer = ps::RowOptimizerConfig::ftrl(c.wide_learning_rate, c.ftrl_l1, c.ftrl_l2),
           .init = ps::InitConfig::zeros(),
           .row_limit = c.row_limit,
           .on_limit = on_limit,
           .min_count = c.min_count,
           .count_sketch_width = c.count_sketch_width,
           .expire_after_steps = c.expire_after_steps}};
}

struct Metrics {
  double log_loss = 0, auc = 0;
};

// The chief's evaluation on the held-out examples with the dense weights in
// the head and the rows as the tables hold them now (a held-out id the
// tables have not seen reads as its initial values and is not created).
Metrics evaluate(ps::Client& client, WideDeep& model, const std::vector<ps::CtrExample>& holdout,
                 int eval_batch) {
  std::vector<float> labels, probs;
  labels.reserve(holdout.size());
  probs.resize(holdout.size());
  for (size_t i = 0; i < holdout.size(); i += eval_batch) {
    const size_t n = std::min<size_t>(eval_batch, holdout.size() - i);
    model.prepare(std::span(holdout).subspan(i, n));
    model.lookup_rows(client);
    model.predict(std::span(probs).subspan(i, n));
    labels.insert(labels.end(), model.labels().begin(), model.labels().end());
  }
  return {ps::log_loss(labels, probs), ps::roc_auc(labels, probs)};
}

struct Evaluator {
  ps::Client& client;
  WideDeep& model;
  const CtrDataSet& data;
  int eval_batch;
  ps::SummaryWriter* summaries;
  ps::LoggingHook* log;
  Clock::time_point start;
  std::optional<std::pair<int64_t, Metrics>> last{};

  Metrics run(int64_t global_step, double epoch) {
    if (last && last->first == global_step) return last->second;
    Metrics m = evaluate(client, model, data.holdout, eval_batch);
    last.emplace(global_step, m);
    if (log) log->clear_bar();
    std::printf(
        "eval  | epoch %.2f | global step %lld | held-out log-loss %.5f | AUC %.5f | %.1f s\n",
        epoch, static_cast<long long>(global_step), m.log_loss, m.auc,
        seconds(start, Clock::now()));
    std::fflush(stdout);
    if (summaries) {
      summaries->add_scalar("log_loss/holdout", static_cast<float>(m.log_loss), global_step);
      summaries->add_scalar("auc/holdout", static_cast<float>(m.auc), global_step);
      summaries->flush();
    }
    return m;
  }
};

// The flags psd would refuse, refused here first: the chief configures the
// job and creates the dense variables before the tables, and a refusal
// there would leave psd holding them.
void check_flags(const CtrFlags& c) {
  if (!(c.holdout >= 0 && c.holdout < 1)) throw ps::ConfigError("--holdout must be in [0, 1)");
  if (c.embedding_dim < 1 || c.embedding_dim > 1024)
    throw ps::ConfigError("--embedding_dim must be in [1, 1024]");
  if (c.eval_batch < 1) throw ps::ConfigError("--eval_batch must be >= 1");
  if (c.synthetic < 0) throw ps::ConfigError("--synthetic must be >= 0 (0: read --train_file)");
  for (const auto& [flag, v] : {std::pair{"--embedding_learning_rate", c.embedding_learning_rate},
                                std::pair{"--wide_learning_rate", c.wide_learning_rate}}) {
    if (!(std::isfinite(v) && v > 0)) throw ps::ConfigError(std::string(flag) + " must be > 0");
  }
  for (const auto& [flag, v] : {std::pair{"--ftrl_l1", c.ftrl_l1}, std::pair{"--ftrl_l2", c.ftrl_l2},
                                std::pair{"--embedding_init", c.embedding_init}}) {
    if (!(std::isfinite(v) && v >= 0)) throw ps::ConfigError(std::string(flag) + " must be >= 0");
  }
  (void)make_shape(c);  // --hidden_units
}

int run_worker(const ps::ClusterSpec& spec, const ps::TrainerFlags& f, const CtrFlags& c) {
  const bool chief = spec.is_chief();
  const int worker = spec.worker_index();
  const ps::MlpShape shape = make_shape(c);
  // The deep part first: a GPU that cannot be used fails before the data loads.
  WideDeep model(make_deep_part(shape, std::max(f.batch_size, c.eval_batch), f.num_gpus,
                                spec.local_gpu() >= 0 ? spec.local_gpu() : 0),
                 c.embedding_dim);
  // Data first: a bad file fails before anything connects.
  const auto load_start = Clock::now();
  const CtrDataSet data = load_data(f, c, worker, spec.num_workers(), chief);
  if (data.train->share_size() == 0)
    throw ps::ConfigError("worker " + std::to_string(worker) + " has no training examples");
  if (chief && data.holdout.empty())
    throw ps::ConfigError("no held-out examples (--holdout 0 without --eval_file)");
  std::printf("worker %d: %lld training examples (of %lld)%s%s in %.1f s\n", worker,
              static_cast<long long>(data.train->share_size()),
              static_cast<long long>(data.train_total), c.stream_data ? ", streamed" : "",
              chief ? fmt::format(", {} held out", data.holdout.size()).c_str() : "",
              seconds(load_start, Clock::now()));
  std::printf("worker %d: deep part (embedding bags + dense head) on %s\n", worker,
              model.head().where().c_str());
  if (data.planted) {
    std::printf("planted model on the held-out part: log-loss %.5f AUC %.5f\n",
                data.planted->holdout_log_loss, data.planted->holdout_auc);
  }
  std::fflush(stdout);

  int64_t steps = f.global_steps(spec, data.train_total);
  const ps::JobConfig job = f.job_config(spec, steps);
  int64_t per_global = f.examples_per_global_step(spec);
  const ps::OptimizerConfig oc =
      f.optimizer_config(std::max<int64_t>(1, data.train_total / per_global), steps);
  spdlog::info("{}: {}", spec.to_string(), to_string(job));

  ps::Client client(f.client_options(spec));
  ps::TrainingSession session(client,
                              {.job = job, .restore_from = chief ? c.restore_from : std::string()});
  const uint64_t seed =
      session.add_variables(model.head().layout().tensors(), model.head().params(),
                            model.head().grads(), oc, f.seed, "ctr/");
  // The chief creates the tables with the variables, before it marks the
  // model ready; the others check them once it is.
  for (const ps::TableSpec& t : table_specs(c, seed)) session.add_table(t);
  session.initialize();
  const ps::SyncMode mode = session.job().mode;
  if (session.job().train_steps > 0) steps = session.job().train_steps;
  per_global = session.examples_per_global_step(f.batch_size);
  const auto epoch_of = [&](int64_t global) {
    return static_cast<double>(global) * per_global / static_cast<double>(data.train_total);
  };
  if (chief) {
    std::printf(
        "worker %d (chief): wide & deep, %s + wide (26 fields + %d crosses), embeddings dim %d "
        "(Adagrad %g), "
        "wide FTRL %g (l1 %g, l2 %g), dense %s lr %g, batch %d, %s, %lld global steps (%.2f epochs "
        "of %lld "
        "examples), %d workers, %d ps\n",
        worker, shape.to_string().c_str(), model.wide_per_example() - ps::kCtrCategorical,
        c.embedding_dim, c.embedding_learning_rate, c.wide_learning_rate, c.ftrl_l1, c.ftrl_l2,
        f.optimizer.c_str(), f.learning_rate, f.batch_size, to_string(session.job()).c_str(),
        static_cast<long long>(steps), epoch_of(steps), static_cast<long long>(data.train_total),
        spec.num_workers(), spec.num_ps());
  } else {
    ps::print_model_ready(worker, session.job());
  }
  std::fflush(stdout);

  ps::WorkerHooks wh(chief ? f.logdir : std::string(), f.log_every, worker, c.summary_every);
  ps::HookList& hooks = wh.hooks;
  const std::unique_ptr<ps::SummaryWriter>& summaries = wh.summaries;
  const auto start = Clock::now();
  Evaluator ev{.client = client,
               .model = model,
               .data = data,
               .eval_batch = c.eval_batch,
               .summaries = summaries.get(),
               .log = wh.log,
               .start = start};
  int64_t pulled_step = 0;
  if (chief) {
    const int every =
        c.eval_every > 0
            ? c.eval_every
            : static_cast<int>(std::max<int64_t>(
                  1, data.train_total / (int64_t{f.batch_size} * spec.num_workers()) / 2));
    // Evaluated: the dense weights pulled for the step, not yet updated by it.
    hooks.add<ps::EveryNStepsHook>(
        every, [&](const ps::StepInfo&) { ev.run(pulled_step, epoch_of(pulled_step)); });
  }
  ps::StepInfo info = wh.start(client, f.log_every, steps, f.batch_size, per_global);
  // Where a worker's time goes: pulling rows and weights (network, psd and, in
  // sync mode, waiting for the other workers), computing, pushing.
  ps::StepTimes times;
  double deep_rows = 0, wide_rows = 0;  // distinct ids per step, summed
  while (!session.should_stop() && !hooks.stop_requested()) {
    const auto t0 = Clock::now();
    model.prepare(data.train->next(static_cast<std::size_t>(f.batch_size)));
    deep_rows += static_cast<double>(model.deep_rows());
    wide_rows += static_cast<double>(model.wide_rows());
    const auto t1 = Clock::now();
    // The rows and the dense weights in one pull, at one step in sync mode;
    // their gradients and the step report in one push.
    model.bind(session);
    pulled_step = session.pull();
    if (session.should_stop()) break;  // the job ended while this worker waited for its step
    const auto t2 = Clock::now();
    model.forward();
    const double loss = model.backward();
    const auto t3 = Clock::now();
    ps::StepOutcome out = session.push();
    const auto t4 = Clock::now();
    times.add_step(t0, t1, t2, t3, t4);
    ps::fill_step_info(info, session, out, oc);
    info.epoch = epoch_of(out.global_step);
    info.loss = loss;
    info.accuracy = -1;
    wh.after_step(info, times);
  }
  const double secs = seconds(start, Clock::now());
  hooks.end(info);
  const int64_t local = session.steps_run();
  const double n = std::max<double>(1, static_cast<double>(local));
  const double step_total = times.total();
  std::printf(
      "%spull %.3f ms (%.0f%%), compute %.3f ms (%.0f%%), push %.3f ms (%.0f%%), data+hooks %.3f "
      "ms (%.0f%%)\n",
      ps::done_line_start(worker, session, secs, f.batch_size, "examples").c_str(),
      ps::StepTimes::per_step_ms(times.pull, local), 100 * times.pull / step_total,
      ps::StepTimes::per_step_ms(times.compute, local), 100 * times.compute / step_total,
      ps::StepTimes::per_step_ms(times.push, local), 100 * times.push / step_total,
      ps::StepTimes::per_step_ms(times.other, local), 100 * times.other / step_total);
  std::printf(
      "SHARES worker=%d pull=%.3f compute=%.3f push=%.3f other=%.3f examples_per_sec=%.0f "
      "deep_rows_per_step=%.0f wide_rows_per_step=%.0f\n",
      worker, times.pull / step_total, times.compute / step_total, times.push / step_total,
      times.other / step_total, static_cast<double>(session.steps_run()) * f.batch_size / secs,
      deep_rows / n, wide_rows / n);
  std::fflush(stdout);

  // Everyone meets once more so the chief evaluates the final model.
  ps::end_barrier(session, "ctr_trainer/end", spec.num_workers(), worker);
  if (chief) {
    ps::PullResult final_pull = session.pull_latest();
    const int64_t global = std::max(final_pull.step, info.global_step);
    const Metrics m = ev.run(global, epoch_of(global));
    // This run's examples: a restored job's steps before it are not its.
    const double examples = static_cast<double>(global - session.start_step()) * per_global;
    uint64_t deep_rows = 0, wide_rows = 0, filtered = 0, expired = 0, table_bytes = 0;
    for (const auto& t : client.list_tables()) {
      (t.name == kDeepTable ? deep_rows : wide_rows) += t.rows;
      filtered += t.ids_filtered;
      expired += t.rows_expired;
      table_bytes += t.bytes;
    }
    std::printf("\n== %s: held-out log-loss %.5f, AUC %.5f", ps::sync_mode_name(mode), m.log_loss,
                m.auc);
    if (data.planted) {
      std::printf(" (planted model: log-loss %.5f, AUC %.5f)", data.planted->holdout_log_loss,
                  data.planted->holdout_auc);
    }
    std::printf(
        "\n== %lld global steps, %.2f epochs in %s: %s examples/s; table rows: %llu deep, %llu "
        "wide (%.1f MiB on psd)",
        static_cast<long long>(global), epoch_of(global), ps::format_duration(secs).c_str(),
        ps::format_rate(examples / secs).c_str(), static_cast<unsigned long long>(deep_rows),
        static_cast<unsigned long long>(wide_rows), static_cast<double>(table_bytes) / (1 << 20));
    if (c.min_count > 1) {
      std::printf(" (min_count %u: %llu pushed ids not yet admitted)", c.min_count,
                  static_cast<unsigned long long>(filtered));
    }
    if (c.expire_after_steps > 0) {
      std::printf(" (expire_after_steps %llu: %llu rows expired)",
                  static_cast<unsigned long long>(c.expire_after_steps),
                  static_cast<unsigned long long>(expired));
    }
    std::printf("\n");
    // One machine-readable line (test/ctr_trainer_test.sh reads it).
    std::printf(
        "RESULT mode=%s holdout_log_loss=%.5f holdout_auc=%.5f planted_log_loss=%.5f "
        "planted_auc=%.5f "
        "seconds=%.3f examples_per_sec=%.0f deep_rows=%llu wide_rows=%llu ids_filtered=%llu "
        "table_bytes=%llu rows_expired=%llu\n",
        ps::sync_mode_name(mode), m.log_loss, m.auc,
        data.planted ? data.planted->holdout_log_loss : -1.0,
        data.planted ? data.planted->holdout_auc : -1.0, secs, examples / secs,
        static_cast<unsigned long long>(deep_rows), static_cast<unsigned long long>(wide_rows),
        static_cast<unsigned long long>(filtered), static_cast<unsigned long long>(table_bytes),
        static_cast<unsigned long long>(expired));
    std::fflush(stdout);
    if (summaries) summaries->flush();
    session.end();  // the ps tasks exit once every worker has disconnected
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ctr_trainer: wide & deep click-through prediction with embedding tables on psd"};
  ps::TrainerFlags f;
  f.epochs = 1;
  f.batch_size = 512;
  f.learning_rate = 0.001f;
  f.data_dir = "data/ctr";
  ps::add_trainer_flags(app, f);
  app.get_option("--data_dir")
      ->description("directory of train.tsv, Criteo TSV layout (scripts/make_ctr_data.sh)");
  CtrFlags c;
  app.add_option("--train_file", c.train_file,
                 "training data: Criteo's TSV layout, or a CSV with a header as Avazu's train.csv "
                 "(default: <data_dir>/train.tsv)");
  app.add_option("--eval_file", c.eval_file,
                 "held-out data (default: the last --holdout of the training data)");
  app.add_option("--synthetic", c.synthetic,
                 "draw this many examples from a planted model in memory (no file)")
      ->capture_default_str();
  app.add_option("--synthetic_seed", c.synthetic_seed,
                 "--synthetic: the generator's seed (make_ctr_data --seed)")
      ->capture_default_str();
  app.add_option("--synthetic_max_distinct", c.synthetic_max_distinct,
                 "--synthetic: distinct values of C26 (make_ctr_data --max_distinct)")
      ->capture_default_str();
  app.add_flag("--stream_data", c.stream_data,
               "read this worker's share from --train_file (or draw it, --synthetic) batch by "
               "batch instead of holding it in memory: data larger than memory");
  app.add_option("--holdout", c.holdout,
                 "share of the examples, at the end, held out for evaluation")
      ->capture_default_str();
  app.add_option("--embedding_dim", c.embedding_dim, "floats per embedding row")
      ->capture_default_str();
  app.add_option("--hidden_units", c.hidden_units, "the deep part's hidden layers")
      ->capture_default_str();
  app.add_option("--embedding_learning_rate", c.embedding_learning_rate,
                 "Adagrad rate of the embedding table")
      ->capture_default_str();
  app.add_option("--wide_learning_rate", c.wide_learning_rate, "FTRL rate of the wide table")
      ->capture_default_str();
  app.add_option("--ftrl_l1", c.ftrl_l1, "FTRL L1 regularization strength")->capture_default_str();
  app.add_option("--ftrl_l2", c.ftrl_l2, "FTRL L2 regularization strength")->capture_default_str();
  app.add_option("--embedding_init", c.embedding_init,
                 "embedding rows start uniform in [-x, x] (0: zeros)")
      ->capture_default_str();
  app.add_option("--row_limit", c.row_limit,
                 "rows per table and shard (0: none); beyond it the least recently "
                 "used rows are evicted")
      ->capture_default_str();
  app.add_option("--min_count", c.min_count,
                 "a new id gets a row at its Nth push (0, 1: at once); until then it reads as "
                 "its initial values and its gradients are dropped (ids_filtered)")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  app.add_option("--count_sketch_width", c.count_sketch_width,
                 "--min_count's counters per shard and table, 4 bytes each, a power of two "
                 "(0: 4194304); about the distinct ids a shard sees")
      ->capture_default_str();
  app.add_option("--expire_after_steps", c.expire_after_steps,
                 "rows neither pulled nor pushed in this many global steps are dropped (0: never)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--eval_every", c.eval_every,
                 "chief: evaluate every N local steps (0: twice per epoch)")
      ->capture_default_str();
  app.add_option("--eval_batch", c.eval_batch, "examples per evaluation batch")
      ->capture_default_str();
  app.add_option("--summary_every", c.summary_every,
                 "chief: TensorBoard scalars every N local steps")
      ->capture_default_str();
  app.add_option("--restore_from", c.restore_from,
                 "chief: start the job from the newest checkpoint in this directory (a ps "
                 "--checkpoint_dir), tables included, and go on from its step");
  ps::PsTaskFlags psf;
  ps::add_ps_task_flags(app, psf);
  PS_PARSE_FLAGS(app, argc, argv);
  return ps::run_trainer_roles(
      "ctr_trainer", f,
      {.prepare = [&] { ps::apply_log_level(psf); },
       .check = [&] { check_flags(c); },
       .ps =
           [&](int task, int num_ps, const std::string& address) {
             return ps::run_ps_task(task, num_ps, address, psf);
           },
       .worker = [&](const ps::ClusterSpec& spec) { return run_worker(spec, f, c); }});
}
