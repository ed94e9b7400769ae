#include "common/finite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "common/vector_clones.h"

namespace ps {

PS_VECTOR_CLONES bool all_finite(std::span<const float> v, float limit) {
  // |x| <= limit is false for NaN and +-Inf whatever the (finite) limit. A compare and an OR
  // vectorise, even on SSE2; a float sum does not without -ffast-math, nor
  // does an unsigned max, which would be slower than the apply itself
  // (docs/performance.md).
  int bad = 0;
  for (float x : v) bad |= !(std::abs(x) <= limit);
  return bad == 0;
}

PS_VECTOR_CLONES bool copy_all_finite(float* __restrict dst, const float* __restrict src,
                                      std::size_t n, float limit) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = src[i];
    dst[i] = x;
    bad |= !(std::abs(x) <= limit);
  }
  return bad == 0;
}

uint32_t gradients_summed_per_step(const JobConfig& job) {
  return job.mode == SyncMode::kSync ? std::max<uint32_t>(job.replicas_to_aggregate, 1) : 1;
}

float gradient_limit(uint32_t summed) {
  constexpr float kMax = std::numeric_limits<float>::max();
  if (summed <= 1) return kMax;
  // Each of the summed - 1 float additions may round up by a factor of at
  // most 1 + 2^-24; the bound is then rounded down to a float.
  const double bound =
      double(kMax) / (double(summed) * std::pow(1.0 + 0x1p-24, double(summed - 1)));
  const auto limit = static_cast<float>(bound);
  return double(limit) > bound ? std::nextafter(limit, 0.0f) : limit;
}

std::string gradient_refusal(std::string_view tensor, std::span<const float> values,
                             uint32_t summed) {
  const std::string name = "push: gradient for '" + std::string(tensor) + "'";
  if (summed > 1 && all_finite(values)) {
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g", static_cast<double>(gradient_limit(summed)));
    return name + " holds a value over " + limit + " in magnitude: the sum of " +
           std::to_string(summed) +
           " workers' gradients, which sync mode averages, would overflow (refused)";
  }
  return name + " contains NaN or Inf (refused; psd --allow_nonfinite accepts it)";
}

bool draws_stay_finite(const InitConfig& init) {
  const double a = init.a, b = init.b, most = std::numeric_limits<float>::max();
  switch (init.kind) {
    case InitKind::kUniform:
      return b - a <= most;
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal:
      return std::fabs(a) + 16 * b <= most;
    default:
      return true;
  }
}

}  // namespace ps
