// LogisticMlp: checks and buffers; the arithmetic is in logistic_mlp_math.cc.
// Also the checks CudaLogisticMlp shares, and its stand-in in a build without
// CUDA.
#include "ps/logistic_mlp.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "kernels/cpu_isa.h"
#include "kernels/logistic_mlp_checks.h"
#include "kernels/logistic_mlp_math.h"
#include "ps/errors.h"
#include "ps_config.h"

namespace ps {
namespace {

// The build of the arithmetic this CPU runs, as make_cpu_engine chooses.
const detail::LogisticMlpMath& math() {
  static const detail::LogisticMlpMath chosen = [] {
    switch (detail::cpu_isa()) {
#if PS_HAVE_CPU_AVX512
      case detail::CpuIsa::kAvx512:
        return detail::logistic_mlp_math_avx512();
#endif
#if PS_HAVE_CPU_AVX2
      case detail::CpuIsa::kAvx2:
        return detail::logistic_mlp_math_avx2();
#endif
      default:
        return detail::logistic_mlp_math_baseline();
    }
  }();
  return chosen;
}

}  // namespace

namespace detail {

void check_logistic_mlp_config(const MlpShape& shape, int max_batch, const char* who) {
  shape.validate();
  if (shape.classes != 1)
    throw ConfigError(
        fmt::format("{}: the output must be one logit (classes = 1), got {}", who, shape.classes));
  if (max_batch < 1)
    throw ConfigError(fmt::format("{}: max_batch must be >= 1, got {}", who, max_batch));
}

void check_logistic_mlp_input(const MlpShape& shape, std::span<const float> x, int64_t n,
                              std::span<const float> extra_logit, const char* what) {
  if (x.size() != static_cast<size_t>(n) * shape.inputs)
    throw Error(fmt::format("{}: x holds {} floats, {} examples x {} inputs need {}", what,
                            x.size(), n, shape.inputs, n * shape.inputs));
  if (!extra_logit.empty() && extra_logit.size() != static_cast<size_t>(n))
    throw Error(fmt::format("{}: extra_logit holds {} floats for {} examples", what,
                            extra_logit.size(), n));
}

void check_logistic_mlp_gradients_args(const MlpShape& shape, int max_batch,
                                       std::span<const float> x, std::span<const float> labels,
                                       std::span<const float> extra_logit,
                                       std::span<const float> dx, std::span<const float> dlogit,
                                       const char* what) {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n < 1 || n > max_batch)
    throw Error(fmt::format("{}: batch of {} outside [1, max_batch {}]", what, n, max_batch));
  check_logistic_mlp_input(shape, x, n, extra_logit, what);
  if (!dx.empty() && dx.size() != x.size())
    throw Error(fmt::format("{}: dx holds {} floats, x {}", what, dx.size(), x.size()));
  if (!dlogit.empty() && dlogit.size() != static_cast<size_t>(n))
    throw Error(fmt::format("{}: dlogit holds {} floats for {} examples", what, dlogit.size(), n));
  for (int64_t i = 0; i < n; ++i)
    if (!(labels[i] >= 0.0f && labels[i] <= 1.0f))
      throw Error(fmt::format("{}: label {} of example {} is outside [0, 1]", what, labels[i], i));
}

}  // namespace detail

LogisticMlp::LogisticMlp(const MlpShape& shape, int max_batch)
    : shape_(shape),
      layout_((detail::check_logistic_mlp_config(shape, max_batch, "LogisticMlp"), shape)),
      max_batch_(max_batch) {
  params_.assign(layout_.total(), 0.0f);
  grads_.assign(layout_.total(), 0.0f);
  for (int l = 0; l < shape.num_layers(); ++l)
    acts_.emplace_back(static_cast<size_t>(max_batch) * shape.layer_out(l), 0.0f);
  if (!shape.hidden.empty()) {
    const int widest_hidden = *std::max_element(shape.hidden.begin(), shape.hidden.end());
    for (auto& d : dbuf_) d.assign(static_cast<size_t>(max_batch) * widest_hidden, 0.0f);
  }
}

detail::LogisticMlpState LogisticMlp::state() {
  return {shape_, layout_, params_.data(), grads_.data(), acts_, dbuf_};
}

void LogisticMlp::forward(const float* x, const float* extra_logit, int batch) {
  math().forward(state(), x, extra_logit, batch);
}

double LogisticMlp::compute_gradients(std::span<const float> x, std::span<const float> labels,
                                      std::span<const float> extra_logit, std::span<float> dx,
                                      std::span<float> dlogit) {
  detail::check_logistic_mlp_gradients_args(shape_, max_batch_, x, labels, extra_logit, dx, dlogit,
                                            "LogisticMlp::compute_gradients");
  const int batch = static_cast<int>(labels.size());
  forward(x.data(), extra_logit.empty() ? nullptr : extra_logit.data(), batch);
  return math().gradients(state(), x.data(), labels.data(), batch, dx.empty() ? nullptr : dx.data(),
                          dlogit.empty() ? nullptr : dlogit.data());
}

void LogisticMlp::predict(std::span<const float> x, std::span<const float> extra_logit,
                          std::span<float> probs) {
  const int64_t n = static_cast<int64_t>(probs.size());
  detail::check_logistic_mlp_input(shape_, x, n, extra_logit, "LogisticMlp::predict");
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    forward(x.data() + start * shape_.inputs,
            extra_logit.empty() ? nullptr : extra_logit.data() + start, batch);
    for (int i = 0; i < batch; ++i) probs[start + i] = math().sigmoid(acts_.back()[i]);
  }
}

#if !PS_HAVE_CUDA
struct CudaLogisticMlp::Impl {};
CudaLogisticMlp::CudaLogisticMlp(const MlpShape& shape, int max_batch, int, bool)
    : shape_(shape), layout_(shape), max_batch_(max_batch) {
  throw Error("CudaLogisticMlp: this build has no CUDA support (configure with -Dcuda=enabled)");
}
CudaLogisticMlp::~CudaLogisticMlp() = default;
std::string CudaLogisticMlp::device_description() const { return {}; }
double CudaLogisticMlp::compute_gradients(std::span<const float>, std::span<const float>,
                                          std::span<const float>, std::span<float>,
                                          std::span<float>) {
  return 0;
}
void CudaLogisticMlp::predict(std::span<const float>, std::span<const float>, std::span<float>) {}
#endif

}  // namespace ps
