#include "server/initializer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "common/finite.h"
#include "ps/errors.h"

namespace ps {

namespace {

// Glorot's bound of the uniform (limit) and its truncated normal's stddev.
double glorot_uniform_limit(const std::vector<uint64_t>& shape) {
  return std::sqrt(6.0 / glorot_fan_sum(shape));
}
double glorot_normal_stddev(const std::vector<uint64_t>& shape) {
  return std::sqrt(2.0 / glorot_fan_sum(shape)) / 0.87962566103423978;
}

// A scale usable as a float distribution parameter.
bool usable_scale(double x) {
  return std::isfinite(x) && x > 0 && x <= std::numeric_limits<float>::max() &&
         static_cast<float>(x) >= std::numeric_limits<float>::min();
}

}  // namespace

double glorot_fan_sum(const std::vector<uint64_t>& shape) {
  if (shape.empty()) return 2.0;
  if (shape.size() == 1) return 2.0 * static_cast<double>(shape[0]);
  double receptive = 1;
  for (std::size_t i = 0; i + 2 < shape.size(); ++i) receptive *= static_cast<double>(shape[i]);
  return receptive * (static_cast<double>(shape[shape.size() - 2]) + static_cast<double>(shape.back()));
}

void validate_initializer(const InitConfig& init, const std::string& name,
                          const std::vector<uint64_t>& full_shape) {
  const auto refuse = [&](const std::string& why) {
    return RequestError("create: tensor '" + name + "': initializer " + why);
  };
  const double a = init.a, b = init.b;
  switch (init.kind) {
    case InitKind::kConstant:
      if (!std::isfinite(init.a)) throw refuse("constant must be finite");
      return;
    case InitKind::kUniform:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || a > b || !draws_stay_finite(init)) {
        throw refuse("uniform needs finite low <= high, got [" + std::to_string(a) + ", " +
                     std::to_string(b) + "]");
      }
      return;
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || !(b > 0) ||
          !draws_stay_finite(init)) {
        throw refuse(
            "normal needs a finite mean and a stddev > 0 (not so large that values overflow), got "
            "mean " +
            std::to_string(a) + ", stddev " + std::to_string(b));
      }
      return;
    case InitKind::kGlorotUniform:
    case InitKind::kGlorotNormal: {
      const double scale = init.kind == InitKind::kGlorotUniform ? glorot_uniform_limit(full_shape)
                                                                 : glorot_normal_stddev(full_shape);
      if (!usable_scale(scale)) {
        throw refuse("Glorot's scale for shape " + shape_to_string(full_shape) + " is " +
                     std::to_string(scale) + ", not a float > 0 (fan_in + fan_out = " +
                     std::to_string(glorot_fan_sum(full_shape)) + ")");
      }
      return;
    }
    default:
      return;  // zeros: no parameters; values: checked by the store
  }
}

void initialize(std::span<float> out, const InitConfig& init,
                const std::vector<uint64_t>& full_shape, uint32_t part_index) {
  std::mt19937_64 rng(init.seed * 0x9E3779B97F4A7C15ull + part_index);
  switch (init.kind) {
    case InitKind::kZeros:
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    case InitKind::kConstant:
      std::fill(out.begin(), out.end(), init.a);
      return;
    case InitKind::kUniform: {
      std::uniform_real_distribution<float> d(init.a, init.b);
      for (float& x : out) x = d(rng);
      return;
    }
    case InitKind::kNormal: {
      std::normal_distribution<float> d(init.a, init.b);
      for (float& x : out) x = d(rng);
      return;
    }
    case InitKind::kTruncatedNormal: {
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (float& x : out) {
        float z;
        do z = d(rng);
        while (std::fabs(z) > 2.0f);
        x = init.a + init.b * z;
      }
      return;
    }
    case InitKind::kGlorotUniform: {
      const auto limit = static_cast<float>(glorot_uniform_limit(full_shape));
      std::uniform_real_distribution<float> d(-limit, limit);
      for (float& x : out) x = d(rng);
      return;
    }
    case InitKind::kGlorotNormal: {
      // TF's glorot_normal is a truncated normal with this stddev.
      const auto stddev = static_cast<float>(glorot_normal_stddev(full_shape));
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (float& x : out) {
        float z;
        do z = d(rng);
        while (std::fabs(z) > 2.0f);
        x = stddev * z;
      }
      return;
    }
    case InitKind::kValues:
      if (init.values.size() != out.size()) {
        throw RequestError("initial values: expected " + std::to_string(out.size()) +
                           " floats, got " + std::to_string(init.values.size()));
      }
      std::copy(init.values.begin(), init.values.end(), out.begin());
      return;
  }
}

}  // namespace ps
