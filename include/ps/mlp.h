// The worker's compute: a multi-layer perceptron (inputs -> hidden... ->
// classes, ReLU or sigmoid, softmax cross-entropy, float32) with forward,
// backward, loss and accuracy, on a GPU (CUDA + cuBLAS) or on the CPU (Eigen).
//
// Plain C++: no CUDA types here, so trainers compile with any C++20 compiler.
//
// All parameters live in ONE flat float vector described by a ParamLayout
// ("layer<l>/weights" (in, out) row-major, "layer<l>/biases" (out)); the
// gradients use the same layout. A trainer pulls each named tensor from the
// parameter server straight into host_params() at its offset, and pushes the
// gradients from host_grads() at the same offsets.
//
// Example (one worker, a parameter server in between):
//
//   ps::MlpShape shape;                       // 784-100-10, ReLU
//   shape.hidden = {512, 512};
//   ps::EngineOptions opt;
//   opt.max_batch = 100;
//   auto engine = ps::make_engine(shape, opt); // GPU if there is one, else CPU
//   for (const ps::TensorSlot& t : engine->layout().tensors())
//     pull(t.name, engine->host_params().subspan(t.offset, t.count));
//   engine->upload_params();
//   ps::StepStats s = engine->compute_gradients(x, labels);  // x: (B, 784)
//   for (const ps::TensorSlot& t : engine->layout().tensors())
//     push(t.name, engine->host_grads().subspan(t.offset, t.count));
//
// Overlapping the next batch's upload with compute (split API):
//
//   engine->prefetch(x0, y0);
//   for (...) {
//     pull params; engine->upload_params();
//     engine->start_step();               // async on a GPU
//     engine->prefetch(x_next, y_next);   // upload overlaps the step
//     ps::StepStats s = engine->finish_step();   // grads now in host_grads()
//     push grads;
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ps {

enum class Activation { kRelu, kSigmoid };

const char* to_string(Activation a);
// "relu" or "sigmoid"; throws ConfigError otherwise.
Activation parse_activation(std::string_view name);

struct MlpShape {
  int inputs = 784;
  std::vector<int> hidden{100};  // empty: softmax regression
  int classes = 10;
  Activation activation = Activation::kRelu;  // of every hidden layer

  int num_layers() const { return static_cast<int>(hidden.size()) + 1; }
  int layer_in(int l) const { return l == 0 ? inputs : hidden[l - 1]; }
  int layer_out(int l) const { return l + 1 == num_layers() ? classes : hidden[l]; }
  int max_width() const;          // largest layer output (hidden or classes)
  void validate() const;          // throws ConfigError on a size < 1
  std::string to_string() const;  // "784-100-10 relu"
};

// One named tensor inside the flat parameter (or gradient) vector.
struct TensorSlot {
  std::string name;            // "layer0/weights", "layer0/biases", ...
  std::vector<int64_t> shape;  // {in, out} (row-major, y = x·W + b) or {out}
  size_t offset = 0;           // in floats, into the flat vector
  size_t count = 0;            // number of floats
};

class ParamLayout {
 public:
  explicit ParamLayout(const MlpShape& shape);
  // In order: layer0/weights, layer0/biases, layer1/weights, ...
  const std::vector<TensorSlot>& tensors() const { return tensors_; }
  size_t total() const { return total_; }  // floats in the flat vector
  const TensorSlot& weights(int layer) const { return tensors_.at(2 * layer); }
  const TensorSlot& biases(int layer) const { return tensors_.at(2 * layer + 1); }
  const TensorSlot& find(std::string_view name) const;  // throws ConfigError

 private:
  std::vector<TensorSlot> tensors_;
  size_t total_ = 0;
};

// Glorot-uniform weights, zero biases; deterministic for a given seed.
void init_params(const MlpShape& shape, std::span<float> params, uint64_t seed);

// Result of a step or an evaluation.
struct StepStats {
  double loss = 0;      // mean cross-entropy over the samples
  int64_t correct = 0;  // samples whose arg-max logit is the label
  int64_t count = 0;    // samples
  double accuracy() const { return count ? static_cast<double>(correct) / count : 0.0; }
};
using EvalStats = StepStats;

struct EngineOptions {
  bool prefer_gpu = true;  // make_engine: a GPU when built with CUDA and one exists
  int device = 0;          // CUDA device index
  bool tf32 = false;       // GPU: TF32 tensor cores for the matrix products
  int max_batch = 1024;    // largest training batch (memory is preallocated for it)
  int eval_batch = 4096;   // chunk size of evaluate() and predict()
};

// Forward/backward engine for one MlpShape on one device. Not thread-safe: one
// thread drives one engine (Towers drives several in parallel).
//
// Bad input (batch > max_batch, sizes that do not match, labels outside
// [0, classes), calls out of order) throws ps::Error and leaves the engine usable.
class MlpEngine {
 public:
  virtual ~MlpEngine();
  MlpEngine(const MlpEngine&) = delete;
  MlpEngine& operator=(const MlpEngine&) = delete;

  const MlpShape& shape() const { return shape_; }
  const ParamLayout& layout() const { return layout_; }
  int max_batch() const { return max_batch_; }
  int eval_batch() const { return eval_batch_; }

  // Flat parameter and gradient vectors (layout()), pinned host memory on a GPU.
  virtual std::span<float> host_params() = 0;
  virtual std::span<float> host_grads() = 0;
  // host_params() -> the engine's working copy (synchronous).
  virtual void upload_params() = 0;
  // The engine's working copy -> host_params() (after train_step()).
  virtual void download_params() = 0;
  virtual std::string device_description() const = 0;
  virtual bool on_gpu() const = 0;

  // Forward + backward on one batch; x is (B, inputs) in row-major order,
  // labels (B). Leaves the gradient of the MEAN cross-entropy in host_grads().
  StepStats compute_gradients(std::span<const float> x, std::span<const int32_t> labels);
  StepStats compute_gradients(const float* x, const int32_t* labels, int batch);

  // params -= lr * host_grads(), on the engine and in host_params().
  void apply_sgd(float lr);

  // Forward + backward + SGD update entirely on the engine, no host transfer
  // of parameters or gradients (single-process training, benchmarks):
  // host_params() is stale until download_params().
  StepStats train_step(std::span<const float> x, std::span<const int32_t> labels, float lr);

  // Loss and accuracy over n samples, in chunks of eval_batch().
  EvalStats evaluate(std::span<const float> x, std::span<const int32_t> labels);
  EvalStats evaluate(const float* x, const int32_t* labels, int64_t n);

  // Logits (n, classes) for x (n, inputs).
  void predict(std::span<const float> x, std::span<float> logits);

  // Split API. prefetch() stages a batch (on a GPU: copied into pinned memory
  // and uploaded asynchronously on a copy stream, so it overlaps a running
  // step; on the CPU x and labels are read by start_step(), so keep them valid
  // until it returns). A staged batch stays staged until the next prefetch().
  void prefetch(std::span<const float> x, std::span<const int32_t> labels);
  // Starts forward + backward on the staged batch, gradients to host_grads().
  void start_step();
  // Starts forward + backward + SGD (as train_step) on the staged batch.
  void start_train_step(float lr);
  // Waits for the last started step and returns its stats.
  StepStats finish_step();

 protected:
  MlpEngine(const MlpShape& shape, const EngineOptions& options);

  // Implementations; arguments are validated by the public wrappers.
  virtual void do_prefetch(const float* x, const int32_t* labels, int batch) = 0;
  virtual void do_start_step(bool sgd, float lr) = 0;
  virtual StepStats do_finish_step() = 0;
  virtual void do_apply_sgd(float lr) = 0;
  // n <= eval_batch(); logits (n, classes) may be null (stats only) and
  // labels may be null (logits only).
  virtual StepStats do_forward_chunk(const float* x, const int32_t* labels, int n,
                                     float* logits) = 0;

 private:
  void check_batch(std::span<const float> x, std::span<const int32_t> labels, int64_t limit,
                   const char* what) const;

  MlpShape shape_;
  ParamLayout layout_;
  int max_batch_;
  int eval_batch_;
  bool staged_ = false;
  bool pending_ = false;
};

// Number of usable CUDA devices; 0 when built without CUDA or none is present.
int cuda_device_count();

// The CPU engine (Eigen). Always available.
std::unique_ptr<MlpEngine> make_cpu_engine(const MlpShape& shape,
                                           const EngineOptions& options = {});
// The CUDA engine on options.device; throws ps::Error when this build has no
// CUDA or there is no such device.
std::unique_ptr<MlpEngine> make_cuda_engine(const MlpShape& shape,
                                            const EngineOptions& options = {});
// GPU when options.prefer_gpu and one is present, else CPU; logs the choice.
std::unique_ptr<MlpEngine> make_engine(const MlpShape& shape, const EngineOptions& options = {});

// Data parallelism inside one worker: one engine ("tower") per GPU (or N CPU
// engines), a batch split evenly over them, gradients averaged (weighted by
// each tower's share of the batch) into host_grads() before one push.
//
//   auto towers = ps::Towers::make(shape, opt, ps::cuda_device_count());
//   pull into towers.host_params(); towers.upload_params();
//   towers.compute_gradients(x, labels);   // batch up to towers.max_batch()
//   push towers.host_grads();
class Towers {
 public:
  explicit Towers(std::vector<std::unique_ptr<MlpEngine>> engines);
  ~Towers();
  Towers(Towers&&) noexcept;
  Towers& operator=(Towers&&) noexcept;

  // n engines: GPUs options.device .. options.device+n-1 when options.prefer_gpu
  // and that many exist, else n CPU engines. options.max_batch is per tower.
  static Towers make(const MlpShape& shape, const EngineOptions& options, int n);

  int size() const;
  MlpEngine& engine(int i);
  const ParamLayout& layout() const;
  int max_batch() const;  // sum over towers

  std::span<float> host_params();  // tower 0's; upload_params() copies it to all
  std::span<float> host_grads();   // the averaged gradient (tower 0's buffer)
  void upload_params();
  StepStats compute_gradients(std::span<const float> x, std::span<const int32_t> labels);
  // params -= lr * host_grads() on every tower (same values everywhere).
  void apply_sgd(float lr);
  EvalStats evaluate(std::span<const float> x, std::span<const int32_t> labels);

 private:
  struct Pool;
  std::vector<std::unique_ptr<MlpEngine>> engines_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace ps
