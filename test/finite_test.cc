// The gradient check psd and libpsclient share (common/finite.h): NaN/Inf
// anywhere in a vector, sync mode's bound on values, and the refusal text.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/finite.h"

using namespace ps;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kMax = std::numeric_limits<float>::max();
}  // namespace

TEST_CASE("all_finite finds a bad value at any position, vector body or tail") {
  // Lengths around the vector widths, so that both the vectorised body and
  // the scalar tail are tried.
  for (std::size_t n : {1u, 7u, 8u, 9u, 31u, 64u, 1001u}) {
    std::vector<float> v(n, 1.5f);
    CHECK(all_finite(v));
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      for (float bad : {kNaN, kInf, -kInf}) {
        v[at] = bad;
        CHECK_FALSE(all_finite(v));
        std::vector<float> dst(n, 0.0f);
        CHECK_FALSE(copy_all_finite(dst.data(), v.data(), n));
        // The copy is whole, bit for bit, whatever the verdict.
        CHECK(std::memcmp(dst.data(), v.data(), n * sizeof(float)) == 0);
        v[at] = 1.5f;
      }
    }
  }
  CHECK(all_finite(std::vector<float>{}));
  CHECK(all_finite(std::vector<float>{kMax, -kMax}));
}

TEST_CASE("all_finite with a limit refuses values beyond it, not at it") {
  const std::vector<float> at_limit{1.0f, -4.0f, 4.0f};
  CHECK(all_finite(at_limit, 4.0f));
  CHECK_FALSE(all_finite(std::vector<float>{1.0f, std::nextafter(4.0f, kInf)}, 4.0f));
  CHECK_FALSE(all_finite(std::vector<float>{-4.5f}, 4.0f));
  std::vector<float> dst(3);
  CHECK(copy_all_finite(dst.data(), at_limit.data(), 3, 4.0f));
  CHECK(dst == at_limit);
}

TEST_CASE("gradients_summed_per_step: replicas_to_aggregate in sync mode, 1 otherwise") {
  CHECK(gradients_summed_per_step({.mode = SyncMode::kAsync, .replicas_to_aggregate = 3}) == 1);
  CHECK(gradients_summed_per_step({.mode = SyncMode::kBoundedStaleness, .max_staleness = 2}) == 1);
  CHECK(gradients_summed_per_step(
            {.mode = SyncMode::kSync, .replicas_to_aggregate = 3, .total_replicas = 4}) == 3);
  CHECK(gradients_summed_per_step({.mode = SyncMode::kSync, .replicas_to_aggregate = 0}) == 1);
}

TEST_CASE("gradient_limit keeps the sum of that many gradients finite, and no more") {
  CHECK(gradient_limit(1) == kMax);
  CHECK(gradient_limit(0) == kMax);
  for (uint32_t summed : {2u, 3u, 7u, 1000u}) {
    const float limit = gradient_limit(summed);
    float sum = 0;
    for (uint32_t i = 0; i < summed; ++i) sum += limit;
    CHECK(std::isfinite(sum));
    CHECK(all_finite(std::vector<float>{limit, -limit}, limit));
    CHECK_FALSE(all_finite(std::vector<float>{std::nextafter(limit, kInf)}, limit));
    // A bound twice as high would let that many sum to Inf.
    CHECK(std::isinf(2 * limit * static_cast<float>(summed)));
  }
}

TEST_CASE("gradient_limit holds for every count, however the float sum rounds") {
  // psd adds the workers' gradients one at a time in float: each addition
  // rounds, and the rounded limit itself may lie just above FLT_MAX / summed.
  // Float addition is monotone, so n values within the limit sum to no more
  // (in magnitude) than n copies of it.
  int overflows = 0, low = 0;
  uint32_t first_overflow = 0;
  for (uint32_t summed = 2; summed <= 5000; ++summed) {
    const float limit = gradient_limit(summed);
    float up = 0, down = 0;
    for (uint32_t i = 0; i < summed; ++i) {
      up += limit;
      down -= limit;
    }
    if (!std::isfinite(up) || !std::isfinite(down)) {
      if (overflows++ == 0) first_overflow = summed;
    }
    low += double(limit) < double(kMax) / summed * (1 - 1e-3);  // not much below the quotient
  }
  INFO("first count whose sum overflows: " << first_overflow);
  CHECK(overflows == 0);
  CHECK(low == 0);
}

TEST_CASE("gradient_refusal names the tensor and why: NaN/Inf, or sync mode's overflow bound") {
  const std::vector<float> nan{1.0f, kNaN};
  const std::vector<float> big{1.0f, 3e38f};
  CHECK(gradient_refusal("w", nan, 1) ==
        "push: gradient for 'w' contains NaN or Inf (refused; psd --allow_nonfinite accepts it)");
  CHECK(gradient_refusal("w", nan, 2) ==
        "push: gradient for 'w' contains NaN or Inf (refused; psd --allow_nonfinite accepts it)");
  CHECK(gradient_refusal("layer/b", big, 2) ==
        "push: gradient for 'layer/b' holds a value over 1.70141e+38 in magnitude: the sum of 2 "
        "workers' "
        "gradients, which sync mode averages, would overflow (refused)");
}
