// What a tensor is, independent of where it lives: name, shape, optimizer and
// initializer. The same value type is used by libpsclient (to declare tensors)
// and by psd (to hold them).
//
// Example:
//   ps::TensorSpec w{.name = "layer0/weights", .shape = {784, 100},
//                    .optimizer = ps::OptimizerConfig::adam(1e-3f),
//                    .init = ps::InitConfig::glorot_uniform(/*seed=*/42)};
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ps {

enum class OptimizerKind { kSgd, kMomentum, kAdam, kAdagrad, kRmsProp };

// How the learning rate changes with the global step (applied on psd).
enum class LrSchedule {
  kConstant,
  kExponentialDecay,  // lr * decay_rate ^ (step / decay_steps), as tf.train.exponential_decay
  kPiecewise,         // lr * decay_rate ^ (number of boundaries passed): step-wise
  kCosineDecay,       // lr * (alpha + (1 - alpha) * (1 + cos(pi * min(step, decay_steps) /
                      // decay_steps)) / 2), as tf.compat.v1.train.cosine_decay
};

// The most dimensions a tensor's shape may have (a split tensor's whole
// shape too).
inline constexpr std::size_t kMaxDims = 16;

// The most boundaries a piecewise schedule may have: psd walks them at
// every update and keeps them with each tensor.
inline constexpr std::size_t kMaxBoundaries = 1024;

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;  // momentum, and RMSProp's momentum term (0 = none)
  bool nesterov = false;
  float beta1 = 0.9f;                // Adam
  float beta2 = 0.999f;              // Adam
  float epsilon = 1e-7f;             // Adam, Adagrad (unused), RMSProp
  float initial_accumulator = 0.1f;  // Adagrad
  float decay = 0.9f;                // RMSProp's moving-average decay
  LrSchedule schedule = LrSchedule::kConstant;
  float decay_rate = 1.0f;  // exponential / piecewise
  int64_t decay_steps = 1;  // exponential; cosine: the steps over which it falls to alpha * lr
  float alpha = 0.0f;       // cosine: the final rate as a fraction of learning_rate, in [0, 1]
  bool staircase = false;   // exponential: integer division of step / decay_steps
  std::vector<int64_t> boundaries;  // piecewise: lr *= decay_rate for steps past each
                                    // (tf.train.piecewise_constant); at most kMaxBoundaries

  static OptimizerConfig sgd(float lr);
  static OptimizerConfig with_momentum(float lr, float momentum, bool nesterov = false);
  static OptimizerConfig adam(float lr, float beta1 = 0.9f, float beta2 = 0.999f,
                              float epsilon = 1e-7f);
  static OptimizerConfig adagrad(float lr, float initial_accumulator = 0.1f);
  static OptimizerConfig rmsprop(float lr, float decay = 0.9f, float momentum = 0.0f,
                                 float epsilon = 1e-7f);
  // Parses "sgd", "momentum", "nesterov", "adam", "adagrad", "rmsprop"; throws ConfigError.
  static OptimizerConfig from_name(const std::string& name, float lr);

  // Learning rate in effect at `global_step`.
  float learning_rate_at(int64_t global_step) const;
};

enum class InitKind {
  kZeros,
  kConstant,
  kUniform,
  kNormal,
  kTruncatedNormal,
  kGlorotUniform,
  kGlorotNormal,
  kValues,
};

struct InitConfig {
  InitKind kind = InitKind::kZeros;
  float a = 0.0f;  // constant value; uniform low; normal mean
  float b = 0.0f;  // uniform high; normal stddev
  uint64_t seed = 0;
  std::vector<float> values;  // kValues

  static InitConfig zeros() { return {}; }
  static InitConfig constant(float v) { return {InitKind::kConstant, v, 0, 0, {}}; }
  static InitConfig uniform(float lo, float hi, uint64_t seed) {
    return {InitKind::kUniform, lo, hi, seed, {}};
  }
  static InitConfig normal(float mean, float stddev, uint64_t seed) {
    return {InitKind::kNormal, mean, stddev, seed, {}};
  }
  static InitConfig truncated_normal(float mean, float stddev, uint64_t seed) {
    return {InitKind::kTruncatedNormal, mean, stddev, seed, {}};
  }
  static InitConfig glorot_uniform(uint64_t seed) {
    return {InitKind::kGlorotUniform, 0, 0, seed, {}};
  }
  static InitConfig glorot_normal(uint64_t seed) {
    return {InitKind::kGlorotNormal, 0, 0, seed, {}};
  }
  static InitConfig from_values(std::vector<float> v) {
    return {InitKind::kValues, 0, 0, 0, std::move(v)};
  }
};

// Longest name psd stores, a split tensor's "/part_<i>" suffix included.
inline constexpr std::size_t kMaxNameBytes = 512;

struct TensorSpec {
  // Every member has a default initialiser: designated initialisers that
  // leave some out stay free of -Wmissing-field-initializers.
  std::string name{};
  std::vector<uint64_t> shape{};
  OptimizerConfig optimizer{};
  InitConfig init{};
  bool trainable = true;
  // Restore only (ps/checkpoint.h): optimizer slots in the optimizer's order
  // (each num_elements() floats) and the number of updates already applied.
  // Empty / 0 for a fresh tensor: slots start as the optimizer defines.
  std::vector<std::vector<float>> slots{};
  uint64_t version = 0;

  // UINT64_MAX for a shape whose count overflows (Placement refuses it).
  uint64_t num_elements() const;
  uint64_t num_bytes() const { return num_elements() * sizeof(float); }
};

// Fan-in / fan-out as Glorot initialisation counts them, as TensorFlow
// does: (in, out) for a matrix; for a convolution kernel (..., in, out)
// each times the product of the leading (spatial) dimensions.
void glorot_fans(const std::vector<uint64_t>& shape, uint64_t* fan_in, uint64_t* fan_out);

std::string shape_to_string(const std::vector<uint64_t>& shape);

}  // namespace ps
