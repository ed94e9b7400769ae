#include "ps/tensor_spec.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ps/errors.h"

namespace ps {

uint64_t TensorSpec::num_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d) return UINT64_MAX;  // a 0 elsewhere still makes it empty
    n *= d;
  }
  for (uint64_t d : shape) {
    if (d == 0) return 0;
  }
  return n;
}

void glorot_fans(const std::vector<uint64_t>& shape, uint64_t* fan_in, uint64_t* fan_out) {
  if (shape.empty()) {
    *fan_in = *fan_out = 1;
  } else if (shape.size() == 1) {
    *fan_in = *fan_out = shape[0];
  } else {
    // Saturating products: UINT64_MAX rather than a wrapped count.
    auto times = [](uint64_t a, uint64_t b) { return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b; };
    uint64_t receptive = 1;  // a convolution kernel's spatial size
    for (std::size_t i = 0; i + 2 < shape.size(); ++i) receptive = times(receptive, shape[i]);
    *fan_in = times(receptive, shape[shape.size() - 2]);
    *fan_out = times(receptive, shape.back());
  }
}

std::string shape_to_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

OptimizerConfig OptimizerConfig::sgd(float lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.learning_rate = lr;
  return c;
}

OptimizerConfig OptimizerConfig::with_momentum(float lr, float momentum, bool nesterov) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kMomentum;
  c.learning_rate = lr;
  c.momentum = momentum;
  c.nesterov = nesterov;
  return c;
}

OptimizerConfig OptimizerConfig::adam(float lr, float beta1, float beta2, float epsilon) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.learning_rate = lr;
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.epsilon = epsilon;
  return c;
}

OptimizerConfig OptimizerConfig::adagrad(float lr, float initial_accumulator) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.learning_rate = lr;
  c.initial_accumulator = initial_accumulator;
  return c;
}

OptimizerConfig OptimizerConfig::rmsprop(float lr, float decay, float momentum, float epsilon) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kRmsProp;
  c.learning_rate = lr;
  c.decay = decay;
  c.momentum = momentum;
  c.epsilon = epsilon;
  return c;
}

OptimizerConfig OptimizerConfig::from_name(const std::string& name, float lr) {
  if (name == "sgd") return sgd(lr);
  if (name == "momentum") return with_momentum(lr, 0.9f, false);
  if (name == "nesterov") return with_momentum(lr, 0.9f, true);
  if (name == "adam") return adam(lr);
  if (name == "adagrad") return adagrad(lr);
  if (name == "rmsprop") return rmsprop(lr);
  throw ConfigError("unknown optimizer '" + name +
                    "' (expected sgd, momentum, nesterov, adam, adagrad or rmsprop)");
}

float OptimizerConfig::learning_rate_at(int64_t global_step) const {
  switch (schedule) {
    case LrSchedule::kConstant:
      return learning_rate;
    case LrSchedule::kExponentialDecay: {
      double p =
          static_cast<double>(global_step) / static_cast<double>(decay_steps > 0 ? decay_steps : 1);
      if (staircase) p = std::floor(p);
      return static_cast<float>(learning_rate * std::pow(static_cast<double>(decay_rate), p));
    }
    case LrSchedule::kPiecewise: {
      int passed = 0;
      // As tf.train.piecewise_constant: the old rate holds at the boundary itself.
      for (int64_t b : boundaries) passed += global_step > b ? 1 : 0;
      return static_cast<float>(learning_rate * std::pow(static_cast<double>(decay_rate), passed));
    }
    case LrSchedule::kCosineDecay: {
      // As tf.compat.v1.train.cosine_decay: alpha * lr from decay_steps on.
      const double steps = static_cast<double>(decay_steps > 0 ? decay_steps : 1);
      const double p =
          std::min(static_cast<double>(std::max<int64_t>(global_step, 0)), steps) / steps;
      const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * p));
      const double a = static_cast<double>(alpha);
      return static_cast<float>(learning_rate * (a + (1.0 - a) * cosine));
    }
  }
  return learning_rate;
}

}  // namespace ps
