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
#include <string>
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
  virtual void apply(std::span<float> w, std::span<const float> g,
                     std::vector<std::vector<float>>& slots, int64_t step, float scale) const = 0;

  // Whether apply() with the same arguments would leave every weight and
  // slot value within kResultLimit (no NaN, no Inf); changes nothing.
  virtual bool result_finite(std::span<const float> w, std::span<const float> g,
                             const std::vector<std::vector<float>>& slots, int64_t step,
                             float scale) const = 0;

  // A magnitude such that apply() with every |g| within it leaves every
  // finite weight and slot finite at any step (the schedule's largest
  // learning rate): psd, which checks each gradient as it arrives, then
  // skips result_finite()'s pass. 0 where no such bound is known.
  virtual float safe_gradient_bound(float /*scale*/) const { return 0; }

  // apply() only when result_finite(): false (nothing changed) otherwise.
  // This is what keeps a finite gradient with an extreme hyper-parameter
  // (SGD at learning rate 3e38) from storing Inf.
  bool apply_if_finite(std::span<float> w, std::span<const float> g,
                       std::vector<std::vector<float>>& slots, int64_t step, float scale) const {
    if (!result_finite(w, g, slots, step, scale)) return false;
    apply(w, g, slots, step, scale);
    return true;
  }

  // The largest magnitude result_finite() lets a value reach: a little
  // under FLT_MAX, so that the check pass and the applying pass, should the
  // compiler contract them differently (FMA), cannot disagree about Inf.
  static constexpr float kResultLimit = 3.4e38f;

  const OptimizerConfig& config() const { return config_; }

 protected:
  OptimizerConfig config_;
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);

// Throws RequestError when restored slots hold values the optimizer can
// never produce and would divide by the root of: a negative second moment
// (Adam's v, RMSProp's mean square) or an Adagrad accumulator <= 0. Their
// updates would be NaN (and refused) for good.
void validate_slots(const OptimizerConfig& config, const std::vector<std::vector<float>>& slots);

// psd's refusal of an update that result_finite() turned down.
std::string nonfinite_update_refusal(const TensorSpec& tensor);

// Throws RequestError when a configuration cannot train (negative or
// non-finite learning rate, beta outside [0, 1), ...).
void validate_optimizer(const OptimizerConfig& config);

}  // namespace ps
