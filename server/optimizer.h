// Update rules applied by psd to a tensor when a gradient arrives.
//
// Each rule follows TensorFlow 1.x's definition (tf.train.*Optimizer) so a
// job moved from TensorFlow trains the same way. Slots (momentum
// accumulators, Adam's moments, ...) live beside the tensor; the tensor's
// version (the number of updates already applied) is the step that Adam's
// bias correction and the learning-rate schedules use.
//
// Example:
//   auto opt = ps::make_optimizer(ps::OptimizerConfig::adam(1e-3f));
//   std::vector<std::vector<float>> slots = opt->make_slots(w.size());
//   opt->apply(w, grad, slots, /*step=*/0, /*scale=*/1.0f);
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ps/tensor_spec.h"

namespace ps {

class Optimizer {
 public:
  explicit Optimizer(const OptimizerConfig& config) : config_(config) {}
  virtual ~Optimizer() = default;

  // Slot vectors for a tensor of n elements, initialised as TensorFlow does.
  virtual std::vector<std::vector<float>> make_slots(std::size_t n) const = 0;

  // w -= update(scale * g). `step` is the number of updates applied before
  // this one. `scale` folds in the 1/N of a sync-mode average.
  virtual void apply(std::span<float> w, std::span<const float> g, std::vector<std::vector<float>>& slots,
                     int64_t step, float scale) const = 0;

  const OptimizerConfig& config() const { return config_; }

 protected:
  OptimizerConfig config_;
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);

// Throws RequestError when a configuration cannot train (negative or
// non-finite learning rate, beta outside [0, 1), ...).
void validate_optimizer(const OptimizerConfig& config);

}  // namespace ps
