#include "server/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "ps/errors.h"
#include "common/vector_clones.h"
#include "server/update_kernels.h"

namespace ps {
namespace {

// The largest learning rate the schedule reaches at any step: the first,
// but for a piecewise schedule that grows (make_optimizer refuses a
// decaying schedule with a rate above 1, and cosine's alpha above 1).
double max_learning_rate(const OptimizerConfig& c) {
  const double lr = std::fabs(double(c.learning_rate));
  if (c.schedule == LrSchedule::kPiecewise && c.decay_rate > 1)
    return lr * std::pow(double(c.decay_rate), double(c.boundaries.size()));
  return lr;
}

class Sgd final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::vector<float>> make_slots(std::size_t) const override { return {}; }
  void apply(std::span<float> w, std::span<const float> g, std::vector<std::vector<float>>&,
             int64_t step, float scale) const override {
    update::sgd(w.data(), g.data(), w.size(), config_.learning_rate_at(step) * scale);
  }
  bool result_finite(std::span<const float> w, std::span<const float> g,
                     const std::vector<std::vector<float>>&, int64_t step,
                     float scale) const override {
    return update::sgd_ok(w.data(), g.data(), w.size(), config_.learning_rate_at(step) * scale,
                          kResultLimit);
  }
  float safe_gradient_bound(float scale) const override {
    return update::sgd_safe_gradient_bound(max_learning_rate(config_), scale, 1);
  }
};

// accum = momentum * accum + g;  w -= lr * accum  (Nesterov: w -= lr * (g + momentum * accum))
class Momentum final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::vector<float>> make_slots(std::size_t n) const override {
    return {std::vector<float>(n, 0.0f)};
  }
  void apply(std::span<float> w, std::span<const float> g, std::vector<std::vector<float>>& slots,
             int64_t step, float scale) const override {
    update::momentum(w.data(), slots[0].data(), g.data(), w.size(), config_.learning_rate_at(step),
                     config_.momentum, scale, config_.nesterov);
  }
  bool result_finite(std::span<const float> w, std::span<const float> g,
                     const std::vector<std::vector<float>>& slots, int64_t step,
                     float scale) const override {
    return update::momentum_ok(w.data(), slots[0].data(), g.data(), w.size(),
                               config_.learning_rate_at(step), config_.momentum, scale,
                               config_.nesterov, kResultLimit);
  }
};

// m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// w -= lr * sqrt(1-b2^t) / (1-b1^t) * m / (sqrt(v) + eps),  t = step + 1
class Adam final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::vector<float>> make_slots(std::size_t n) const override {
    return {std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  }
  void apply(std::span<float> w, std::span<const float> g, std::vector<std::vector<float>>& slots,
             int64_t step, float scale) const override {
    update::adam(w.data(), slots[0].data(), slots[1].data(), g.data(), w.size(), lr_t(step),
                 config_.beta1, config_.beta2, config_.epsilon, scale);
  }
  bool result_finite(std::span<const float> w, std::span<const float> g,
                     const std::vector<std::vector<float>>& slots, int64_t step,
                     float scale) const override {
    return update::adam_ok(w.data(), slots[0].data(), slots[1].data(), g.data(), w.size(),
                           lr_t(step), config_.beta1, config_.beta2, config_.epsilon, scale,
                           kResultLimit);
  }

 private:
  float lr_t(int64_t step) const {
    const double t = static_cast<double>(step + 1);
    const float b1 = config_.beta1, b2 = config_.beta2;
    return static_cast<float>(config_.learning_rate_at(step) * std::sqrt(1.0 - std::pow(b2, t)) /
                              (1.0 - std::pow(b1, t)));
  }
};

// accum += g^2;  w -= lr * g / sqrt(accum)
class Adagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::vector<float>> make_slots(std::size_t n) const override {
    return {std::vector<float>(n, config_.initial_accumulator)};
  }
  void apply(std::span<float> w, std::span<const float> g, std::vector<std::vector<float>>& slots,
             int64_t step, float scale) const override {
    update::adagrad(w.data(), slots[0].data(), g.data(), w.size(), config_.learning_rate_at(step),
                    scale);
  }
  bool result_finite(std::span<const float> w, std::span<const float> g,
                     const std::vector<std::vector<float>>& slots, int64_t step,
                     float scale) const override {
    return update::adagrad_ok(w.data(), slots[0].data(), g.data(), w.size(),
                              config_.learning_rate_at(step), scale, kResultLimit);
  }
  // Its accumulator stays > 0: made so, kept so, checked on restore (validate_slots).
  float safe_gradient_bound(float scale) const override {
    return update::adagrad_safe_gradient_bound(max_learning_rate(config_), scale, 1);
  }
};

// ms = decay ms + (1-decay) g^2;  mom = momentum mom + lr g / sqrt(ms + eps);  w -= mom
// ms starts at 1, as in tf.train.RMSPropOptimizer.
class RmsProp final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::vector<float>> make_slots(std::size_t n) const override {
    return {std::vector<float>(n, 1.0f), std::vector<float>(n, 0.0f)};
  }
  void apply(std::span<float> w, std::span<const float> g, std::vector<std::vector<float>>& slots,
             int64_t step, float scale) const override {
    update::rmsprop(w.data(), slots[0].data(), slots[1].data(), g.data(), w.size(),
                    config_.learning_rate_at(step), config_.decay, config_.momentum,
                    config_.epsilon, scale);
  }
  bool result_finite(std::span<const float> w, std::span<const float> g,
                     const std::vector<std::vector<float>>& slots, int64_t step,
                     float scale) const override {
    return update::rmsprop_ok(w.data(), slots[0].data(), slots[1].data(), g.data(), w.size(),
                              config_.learning_rate_at(step), config_.decay, config_.momentum,
                              config_.epsilon, scale, kResultLimit);
  }
};

void require(bool ok, const std::string& what) {
  if (!ok) throw RequestError("optimizer: " + what);
}

}  // namespace

void validate_optimizer(const OptimizerConfig& c) {
  require(std::isfinite(c.learning_rate) && c.learning_rate >= 0,
          "learning rate must be finite and >= 0, got " + std::to_string(c.learning_rate));
  require(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum < 1,
          "momentum must be in [0, 1)");
  require(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
          "Adam's beta1 and beta2 must be in [0, 1)");
  require(std::isfinite(c.epsilon) && c.epsilon >= 0, "epsilon must be finite and >= 0");
  // Both divide by sqrt(v) + eps (sqrt(ms + eps)): 0 / 0 where a gradient is 0.
  require(c.epsilon > 0 || (c.kind != OptimizerKind::kAdam && c.kind != OptimizerKind::kRmsProp),
          "Adam's and RMSProp's epsilon must be > 0 (0 makes NaN weights where a gradient is 0)");
  require(std::isfinite(c.initial_accumulator) && c.initial_accumulator > 0,
          "Adagrad's initial accumulator must be > 0");
  require(c.decay >= 0 && c.decay < 1, "RMSProp's decay must be in [0, 1)");
  require(std::isfinite(c.decay_rate) && c.decay_rate > 0, "decay rate must be finite and > 0");
  require((c.schedule != LrSchedule::kExponentialDecay && c.schedule != LrSchedule::kCosineDecay) ||
              c.decay_steps > 0,
          "decay steps must be > 0");
  require(c.schedule != LrSchedule::kCosineDecay || (c.alpha >= 0 && c.alpha <= 1),
          "cosine decay's alpha (the final fraction of the learning rate) must be in [0, 1]");
  require(
      c.schedule != LrSchedule::kExponentialDecay || c.decay_rate <= 1,
      "exponential decay's decay rate must be <= 1 (above, the learning rate grows without bound)");
  require(c.boundaries.size() <= kMaxBoundaries,
          "a piecewise schedule has at most " + std::to_string(kMaxBoundaries) +
              " boundaries, not " + std::to_string(c.boundaries.size()));
  if (c.schedule == LrSchedule::kPiecewise) {
    const double last =
        c.learning_rate * std::pow(static_cast<double>(c.decay_rate), c.boundaries.size());
    require(std::isfinite(last) && last <= std::numeric_limits<float>::max(),
            "the piecewise learning rate overflows after " + std::to_string(c.boundaries.size()) +
                " boundaries");
  }
}

void validate_slots(const OptimizerConfig& c, const std::vector<std::vector<float>>& slots) {
  auto all = [](const std::vector<float>& s, auto ok) {
    return std::all_of(s.begin(), s.end(), ok);
  };
  switch (c.kind) {
    case OptimizerKind::kAdam:
      if (slots.size() == 2)
        require(all(slots[1], [](float x) { return x >= 0; }), "Adam's restored v must be >= 0");
      return;
    case OptimizerKind::kAdagrad:
      if (slots.size() == 1) {
        require(all(slots[0], [](float x) { return x > 0; }),
                "Adagrad's restored accumulator must be > 0");
      }
      return;
    case OptimizerKind::kRmsProp:
      if (slots.size() == 2) {
        require(all(slots[0], [](float x) { return x >= 0; }),
                "RMSProp's restored mean square must be >= 0");
      }
      return;
    default:
      return;
  }
}

std::string nonfinite_update_refusal(const TensorSpec& t) {
  return "update of tensor '" + t.name + "' not applied: with learning rate " +
         std::to_string(t.optimizer.learning_rate) +
         " it would make a value or optimizer slot NaN or Inf " +
         "(over 3.4e38); the tensor is unchanged (lower the learning rate, or clip the gradients)";
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config) {
  validate_optimizer(config);
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return std::make_unique<Sgd>(config);
    case OptimizerKind::kMomentum:
      return std::make_unique<Momentum>(config);
    case OptimizerKind::kAdam:
      return std::make_unique<Adam>(config);
    case OptimizerKind::kAdagrad:
      return std::make_unique<Adagrad>(config);
    case OptimizerKind::kRmsProp:
      return std::make_unique<RmsProp>(config);
  }
  throw RequestError("optimizer: unknown kind");
}

}  // namespace ps
