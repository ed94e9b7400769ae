#include "server/initializer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "ps/errors.h"

namespace ps {

void validate_initializer(const InitConfig& init, const std::string& name) {
  const auto refuse = [&](const std::string& why) {
    return RequestError("create: tensor '" + name + "': initializer " + why);
  };
  const double a = init.a, b = init.b, most = std::numeric_limits<float>::max();
  switch (init.kind) {
    case InitKind::kConstant:
      if (!std::isfinite(init.a)) throw refuse("constant must be finite");
      return;
    case InitKind::kUniform:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || a > b || b - a > most) {
        throw refuse("uniform needs finite low <= high, got [" + std::to_string(a) + ", " + std::to_string(b) + "]");
      }
      return;
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal:
      // Far enough out that no draw (a float normal stays within about 6
      // sigma; a truncated one within 2) reaches Inf.
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || !(b > 0) || std::fabs(a) + 16 * b > most) {
        throw refuse("normal needs a finite mean and a stddev > 0 (not so large that values overflow), got mean " +
                     std::to_string(a) + ", stddev " + std::to_string(b));
      }
      return;
    default:
      return;  // zeros, Glorot: no parameters; values: checked by the store
  }
}

void initialize(std::span<float> out, const InitConfig& init, const std::vector<uint64_t>& full_shape,
                uint32_t part_index) {
  std::mt19937_64 rng(init.seed * 0x9E3779B97F4A7C15ull + part_index);
  uint64_t fan_in = 1, fan_out = 1;
  glorot_fans(full_shape, &fan_in, &fan_out);
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
      const float limit = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
      std::uniform_real_distribution<float> d(-limit, limit);
      for (float& x : out) x = d(rng);
      return;
    }
    case InitKind::kGlorotNormal: {
      // TF's glorot_normal is a truncated normal with this stddev.
      const float stddev = std::sqrt(2.0f / static_cast<float>(fan_in + fan_out)) / 0.87962566103423978f;
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
        throw RequestError("initial values: expected " + std::to_string(out.size()) + " floats, got " +
                           std::to_string(init.values.size()));
      }
      std::copy(init.values.begin(), init.values.end(), out.begin());
      return;
  }
}

}  // namespace ps
