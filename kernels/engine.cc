// Shape, layout, parameter init, the validating wrappers of MlpEngine and the
// engine factories.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "kernels/cpu_isa.h"
#include "kernels/engine_impl.h"
#include "ps/errors.h"
#include "ps/mlp.h"
#include "ps_config.h"

namespace ps {

const char* to_string(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return "relu";
    case Activation::kSigmoid:
      return "sigmoid";
  }
  return "?";
}

Activation parse_activation(std::string_view name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "sigmoid") return Activation::kSigmoid;
  throw ConfigError(fmt::format("unknown activation '{}' (expected relu or sigmoid)", name));
}

int MlpShape::max_width() const {
  int w = classes;
  for (int h : hidden) w = std::max(w, h);
  return w;
}

void MlpShape::validate() const {
  if (inputs < 1) throw ConfigError(fmt::format("MLP: inputs must be >= 1, got {}", inputs));
  if (classes < 1) throw ConfigError(fmt::format("MLP: classes must be >= 1, got {}", classes));
  for (size_t i = 0; i < hidden.size(); ++i)
    if (hidden[i] < 1)
      throw ConfigError(
          fmt::format("MLP: hidden layer {} must have >= 1 units, got {}", i, hidden[i]));
  if (activation != Activation::kRelu && activation != Activation::kSigmoid)
    throw ConfigError("MLP: unknown activation");
}

std::string MlpShape::to_string() const {
  // fmt rather than string operator+: GCC 12 warns falsely (-Wrestrict) on the latter.
  return fmt::format("{}-{}{}{} {}", inputs, fmt::join(hidden, "-"), hidden.empty() ? "" : "-",
                     classes, ps::to_string(activation));
}

ParamLayout::ParamLayout(const MlpShape& shape) {
  shape.validate();
  for (int l = 0; l < shape.num_layers(); ++l) {
    const int64_t in = shape.layer_in(l), out = shape.layer_out(l);
    const std::string prefix = "layer" + std::to_string(l);
    tensors_.push_back({prefix + "/weights", {in, out}, total_, static_cast<size_t>(in * out)});
    total_ += static_cast<size_t>(in * out);
    tensors_.push_back({prefix + "/biases", {out}, total_, static_cast<size_t>(out)});
    total_ += static_cast<size_t>(out);
  }
}

const TensorSlot& ParamLayout::find(std::string_view name) const {
  for (const TensorSlot& t : tensors_)
    if (t.name == name) return t;
  throw ConfigError(fmt::format("MLP: no tensor named '{}'", name));
}

void init_params(const MlpShape& shape, std::span<float> params, uint64_t seed) {
  ParamLayout layout(shape);
  if (params.size() != layout.total())
    throw ConfigError(fmt::format("init_params: {} floats given, layout needs {}", params.size(),
                                  layout.total()));
  std::mt19937_64 rng(seed);
  for (int l = 0; l < shape.num_layers(); ++l) {
    const TensorSlot& w = layout.weights(l);
    const float limit =
        std::sqrt(6.0f / static_cast<float>(shape.layer_in(l) + shape.layer_out(l)));
    std::uniform_real_distribution<float> dist(-limit, limit);
    for (size_t i = 0; i < w.count; ++i) params[w.offset + i] = dist(rng);
    const TensorSlot& b = layout.biases(l);
    std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(b.offset), b.count, 0.0f);
  }
}

// ---------------------------------------------------------------------------
// MlpEngine: validation and call-order checks, then the virtual do_*().

MlpEngine::MlpEngine(const MlpShape& shape, const EngineOptions& options)
    : shape_(shape),
      layout_(shape),
      max_batch_(options.max_batch),
      eval_batch_(options.eval_batch) {
  if (max_batch_ < 1)
    throw ConfigError(fmt::format("MLP engine: max_batch must be >= 1, got {}", max_batch_));
  if (eval_batch_ < 1)
    throw ConfigError(fmt::format("MLP engine: eval_batch must be >= 1, got {}", eval_batch_));
}

MlpEngine::~MlpEngine() = default;

void MlpEngine::check_batch(std::span<const float> x, std::span<const int32_t> labels,
                            int64_t limit, const char* what) const {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n < 1) throw Error(fmt::format("{}: empty batch", what));
  if (n > limit)
    throw Error(fmt::format("{}: batch of {} exceeds the limit of {}", what, n, limit));
  if (x.size() != static_cast<size_t>(n) * static_cast<size_t>(shape_.inputs))
    throw Error(fmt::format("{}: x has {} floats, expected {} samples x {} inputs = {}", what,
                            x.size(), n, shape_.inputs, n * shape_.inputs));
  if (x.data() == nullptr || labels.data() == nullptr)
    throw Error(fmt::format("{}: null pointer", what));
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= shape_.classes)
      throw Error(fmt::format("{}: label {} of sample {} is outside [0, {})", what, labels[i], i,
                              shape_.classes));
}

void MlpEngine::prefetch(std::span<const float> x, std::span<const int32_t> labels) {
  check_batch(x, labels, max_batch_, "MlpEngine::prefetch");
  do_prefetch(x.data(), labels.data(), static_cast<int>(labels.size()));
  staged_ = true;
}

void MlpEngine::start_step() {
  if (!staged_) throw Error("MlpEngine::start_step: no batch staged (call prefetch first)");
  do_start_step(false, 0.0f);
  pending_ = true;
}

void MlpEngine::start_train_step(float lr) {
  if (!staged_) throw Error("MlpEngine::start_train_step: no batch staged (call prefetch first)");
  if (!std::isfinite(lr)) throw Error("MlpEngine::start_train_step: learning rate is not finite");
  do_start_step(true, lr);
  pending_ = true;
}

StepStats MlpEngine::finish_step() {
  if (!pending_) throw Error("MlpEngine::finish_step: no step started");
  pending_ = false;
  return do_finish_step();
}

StepStats MlpEngine::compute_gradients(std::span<const float> x, std::span<const int32_t> labels) {
  prefetch(x, labels);
  start_step();
  return finish_step();
}

StepStats MlpEngine::compute_gradients(const float* x, const int32_t* labels, int batch) {
  if (batch < 0) throw Error("MlpEngine::compute_gradients: negative batch");
  return compute_gradients(std::span<const float>(x, static_cast<size_t>(batch) * shape_.inputs),
                           std::span<const int32_t>(labels, static_cast<size_t>(batch)));
}

StepStats MlpEngine::train_step(std::span<const float> x, std::span<const int32_t> labels,
                                float lr) {
  prefetch(x, labels);
  start_train_step(lr);
  return finish_step();
}

void MlpEngine::apply_sgd(float lr) {
  if (!std::isfinite(lr)) throw Error("MlpEngine::apply_sgd: learning rate is not finite");
  if (pending_) finish_step();
  do_apply_sgd(lr);
}

EvalStats MlpEngine::evaluate(std::span<const float> x, std::span<const int32_t> labels) {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n == 0 && x.empty()) return {};
  check_batch(x, labels, INT64_MAX, "MlpEngine::evaluate");
  if (pending_) finish_step();
  double loss_sum = 0;
  EvalStats total;
  for (int64_t i = 0; i < n; i += eval_batch_) {
    const int chunk = static_cast<int>(std::min<int64_t>(eval_batch_, n - i));
    StepStats s = do_forward_chunk(x.data() + i * shape_.inputs, labels.data() + i, chunk, nullptr);
    loss_sum += s.loss * chunk;
    total.correct += s.correct;
  }
  total.count = n;
  total.loss = loss_sum / static_cast<double>(n);
  return total;
}

EvalStats MlpEngine::evaluate(const float* x, const int32_t* labels, int64_t n) {
  if (n < 0) throw Error("MlpEngine::evaluate: negative count");
  return evaluate(std::span<const float>(x, static_cast<size_t>(n) * shape_.inputs),
                  std::span<const int32_t>(labels, static_cast<size_t>(n)));
}

void MlpEngine::predict(std::span<const float> x, std::span<float> logits) {
  if (x.size() % static_cast<size_t>(shape_.inputs) != 0)
    throw Error(fmt::format("MlpEngine::predict: x has {} floats, not a multiple of {} inputs",
                            x.size(), shape_.inputs));
  const int64_t n = static_cast<int64_t>(x.size() / shape_.inputs);
  if (logits.size() != static_cast<size_t>(n) * shape_.classes)
    throw Error(fmt::format("MlpEngine::predict: logits has {} floats, expected {} x {}",
                            logits.size(), n, shape_.classes));
  if (pending_) finish_step();
  for (int64_t i = 0; i < n; i += eval_batch_) {
    const int chunk = static_cast<int>(std::min<int64_t>(eval_batch_, n - i));
    do_forward_chunk(x.data() + i * shape_.inputs, nullptr, chunk,
                     logits.data() + i * shape_.classes);
  }
}

// ---------------------------------------------------------------------------
// Factories.

int cuda_device_count() {
#if PS_HAVE_CUDA
  return detail::cuda_device_count_impl();
#else
  return 0;
#endif
}

namespace {

// A CPU engine preallocates its buffers for its largest batch: one too large
// for the machine is refused before anything is allocated, naming the batch
// (a trainer with --batch_size 2e9 ended in "std::bad_alloc", and one just
// under the memory could be killed by the OOM killer instead). Counts the
// batch the caller holds, the activations of every layer for
// max(max_batch, eval_batch) rows and the two gradient buffers of the widest
// hidden layer, as cpu_engine.cc allocates them.
void check_fits_in_memory(const MlpShape& shape, const EngineOptions& options) {
  const double batch = std::max(options.max_batch, 1);
  const double rows = std::max({options.max_batch, options.eval_batch, 1});
  double floats = batch * shape.inputs;
  for (int l = 0; l < shape.num_layers(); ++l) floats += rows * shape.layer_out(l);
  int widest_hidden = 0;
  for (int h : shape.hidden) widest_hidden = std::max(widest_hidden, h);
  floats += 2 * batch * widest_hidden;
  const double need = floats * sizeof(float);
  const double have =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (have > 0 && need > have) {
    constexpr double kGiB = 1024.0 * 1024 * 1024;
    throw ConfigError(fmt::format(
        "MLP {}: a batch of {} examples (evaluation in batches of {}) needs {:.1f} GiB "
        "for the batch and its activations, more than this machine's {:.1f} GiB of "
        "memory: lower the batch size",
        shape.to_string(), options.max_batch, options.eval_batch, need / kGiB, have / kGiB));
  }
}

}  // namespace

std::unique_ptr<MlpEngine> make_cpu_engine(const MlpShape& shape, const EngineOptions& options) {
  check_fits_in_memory(shape, options);
  switch (detail::cpu_isa()) {
#if PS_HAVE_CPU_AVX512
    case detail::CpuIsa::kAvx512:
      return detail::new_cpu_engine_avx512(shape, options);
#endif
#if PS_HAVE_CPU_AVX2
    case detail::CpuIsa::kAvx2:
      return detail::new_cpu_engine_avx2(shape, options);
#endif
    default:
      return detail::new_cpu_engine_baseline(shape, options);
  }
}

std::unique_ptr<MlpEngine> make_cuda_engine(const MlpShape& shape, const EngineOptions& options) {
#if PS_HAVE_CUDA
  const int n = detail::cuda_device_count_impl();
  if (n == 0) throw Error("make_cuda_engine: no CUDA device found");
  if (options.device < 0 || options.device >= n)
    throw Error(fmt::format("make_cuda_engine: device {} requested, {} CUDA device(s) present",
                            options.device, n));
  return detail::new_cuda_engine(shape, options);
#else
  (void)shape;
  (void)options;
  throw Error("make_cuda_engine: this build has no CUDA support (configure with -Dcuda=enabled)");
#endif
}

std::unique_ptr<MlpEngine> make_engine(const MlpShape& shape, const EngineOptions& options) {
  std::unique_ptr<MlpEngine> engine;
  const char* why = "";
  if (!options.prefer_gpu) {
    why = "GPU not requested";
  } else if (!PS_HAVE_CUDA) {
    why = "built without CUDA";
  } else if (cuda_device_count() <= options.device) {
    why = "no CUDA device";
  }
  if (*why == '\0') {
    engine = make_cuda_engine(shape, options);
    spdlog::info("MLP {}: forward/backward on GPU, {}", shape.to_string(),
                 engine->device_description());
  } else {
    engine = make_cpu_engine(shape, options);
    spdlog::info("MLP {}: forward/backward on CPU ({}), {}", shape.to_string(), why,
                 engine->device_description());
  }
  return engine;
}

}  // namespace ps
