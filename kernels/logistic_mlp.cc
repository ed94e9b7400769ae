// LogisticMlp: checks and buffers; the arithmetic is in logistic_mlp_math.cc.
#include "ps/logistic_mlp.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "kernels/logistic_mlp_math.h"
#include "ps/errors.h"

namespace ps {
namespace {

// The build of the arithmetic this CPU runs: AVX2 + FMA where it has them,
// unless PS_CPU_BASELINE=1 (tests, comparisons), as make_cpu_engine chooses.
const detail::LogisticMlpMath& math() {
  static const detail::LogisticMlpMath chosen = [] {
#if PS_HAVE_CPU_AVX2
    const char* baseline = std::getenv("PS_CPU_BASELINE");
    if (!(baseline && *baseline == '1') && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
      return detail::logistic_mlp_math_avx2();
#endif
    return detail::logistic_mlp_math_baseline();
  }();
  return chosen;
}

}  // namespace

LogisticMlp::LogisticMlp(const MlpShape& shape, int max_batch)
    : shape_(shape), layout_((shape.validate(), shape)), max_batch_(max_batch) {
  if (shape.classes != 1)
    throw ConfigError(fmt::format("LogisticMlp: the output must be one logit (classes = 1), got {}",
                                  shape.classes));
  if (max_batch < 1)
    throw ConfigError(fmt::format("LogisticMlp: max_batch must be >= 1, got {}", max_batch));
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

void LogisticMlp::check(std::span<const float> x, int64_t n, std::span<const float> extra_logit,
                        const char* what) const {
  if (x.size() != static_cast<size_t>(n) * shape_.inputs)
    throw Error(fmt::format("LogisticMlp::{}: x holds {} floats, {} examples x {} inputs need {}",
                            what, x.size(), n, shape_.inputs, n * shape_.inputs));
  if (!extra_logit.empty() && extra_logit.size() != static_cast<size_t>(n))
    throw Error(fmt::format("LogisticMlp::{}: extra_logit holds {} floats for {} examples", what,
                            extra_logit.size(), n));
}

void LogisticMlp::forward(const float* x, const float* extra_logit, int batch) {
  math().forward(state(), x, extra_logit, batch);
}

double LogisticMlp::compute_gradients(std::span<const float> x, std::span<const float> labels,
                                      std::span<const float> extra_logit, std::span<float> dx,
                                      std::span<float> dlogit) {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n < 1 || n > max_batch_)
    throw Error(fmt::format("LogisticMlp::compute_gradients: batch of {} outside [1, max_batch {}]",
                            n, max_batch_));
  check(x, n, extra_logit, "compute_gradients");
  if (!dx.empty() && dx.size() != x.size())
    throw Error(fmt::format("LogisticMlp::compute_gradients: dx holds {} floats, x {}", dx.size(),
                            x.size()));
  if (!dlogit.empty() && dlogit.size() != static_cast<size_t>(n))
    throw Error(
        fmt::format("LogisticMlp::compute_gradients: dlogit holds {} floats for {} examples",
                    dlogit.size(), n));
  for (int64_t i = 0; i < n; ++i)
    if (!(labels[i] >= 0.0f && labels[i] <= 1.0f))
      throw Error(
          fmt::format("LogisticMlp::compute_gradients: label {} of example {} is outside [0, 1]",
                      labels[i], i));

  const int batch = static_cast<int>(n);
  forward(x.data(), extra_logit.empty() ? nullptr : extra_logit.data(), batch);
  return math().gradients(state(), x.data(), labels.data(), batch, dx.empty() ? nullptr : dx.data(),
                          dlogit.empty() ? nullptr : dlogit.data());
}

void LogisticMlp::predict(std::span<const float> x, std::span<const float> extra_logit,
                          std::span<float> probs) {
  const int64_t n = static_cast<int64_t>(probs.size());
  check(x, n, extra_logit, "predict");
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    forward(x.data() + start * shape_.inputs,
            extra_logit.empty() ? nullptr : extra_logit.data() + start, batch);
    for (int i = 0; i < batch; ++i) probs[start + i] = math().sigmoid(acts_.back()[i]);
  }
}

}  // namespace ps
