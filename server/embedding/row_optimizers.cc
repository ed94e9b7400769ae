#include "server/embedding/row_optimizers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ps/errors.h"
#include "server/update_kernels.h"

namespace ps {
namespace {

// Each row's update is the dense optimizers' loop over its dim floats
// (server/update_kernels.h): the same arithmetic, vectorised the same way.

// Within FLT_MAX in magnitude (and not NaN): finite.
constexpr float kFloatMax = std::numeric_limits<float>::max();

bool all_positive(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return x > 0; });
}
bool all_non_negative(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return x >= 0; });
}

class RowSgd final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 0; }
  float slot_init(uint32_t) const override { return 0; }
  void apply(float* w, float* const*, const float* g, uint32_t dim, const Step& s) const override {
    update::sgd(w, g, dim, s.learning_rate * s.scale);
  }
  bool stays_finite(const float* w, const float* const*, const float* g, uint32_t dim,
                    const Step& s) const override {
    return update::sgd_ok(w, g, dim, s.learning_rate * s.scale, kFloatMax);
  }
  float safe_gradient_bound(float scale, std::size_t summed) const override {
    return update::sgd_safe_gradient_bound(config_.learning_rate, scale, double(summed));
  }
};

class RowAdagrad final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 1; }
  float slot_init(uint32_t) const override { return config_.initial_accumulator; }
  void apply(float* w, float* const* slots, const float* g, uint32_t dim,
             const Step& s) const override {
    update::adagrad(w, slots[0], g, dim, s.learning_rate, s.scale);
  }
  bool stays_finite(const float* w, const float* const* slots, const float* g, uint32_t dim,
                    const Step& s) const override {
    return update::adagrad_ok(w, slots[0], g, dim, s.learning_rate, s.scale, kFloatMax);
  }
  float safe_gradient_bound(float scale, std::size_t summed) const override {
    return update::adagrad_safe_gradient_bound(config_.learning_rate, scale, double(summed));
  }
  const char* slot_violation(uint32_t, std::span<const float> acc) const override {
    return all_positive(acc) ? nullptr : "Adagrad's accumulator must be > 0";
  }
};

class RowLazyAdam final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 2; }
  float slot_init(uint32_t) const override { return 0; }
  Step step(float scale, uint64_t t) const override {
    const double td = static_cast<double>(t);
    return {scale, static_cast<float>(config_.learning_rate *
                                      std::sqrt(1.0 - std::pow(double(config_.beta2), td)) /
                                      (1.0 - std::pow(double(config_.beta1), td)))};
  }
  void apply(float* w, float* const* slots, const float* g, uint32_t dim,
             const Step& s) const override {
    update::adam(w, slots[0], slots[1], g, dim, s.learning_rate, config_.beta1, config_.beta2,
                 config_.epsilon, s.scale);
  }
  bool stays_finite(const float* w, const float* const* slots, const float* g, uint32_t dim,
                    const Step& s) const override {
    return update::adam_ok(w, slots[0], slots[1], g, dim, s.learning_rate, config_.beta1,
                           config_.beta2, config_.epsilon, s.scale, kFloatMax);
  }
  const char* slot_violation(uint32_t k, std::span<const float> values) const override {
    return k == 0 || all_non_negative(values) ? nullptr
                                              : "LazyAdam's second moment (v) must be >= 0";
  }
};

// tf.train.FtrlOptimizer (l2_shrinkage 0): update::ftrl.
class RowFtrl final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 2; }
  float slot_init(uint32_t k) const override { return k == 0 ? config_.initial_accumulator : 0.0f; }
  void apply(float* w, float* const* slots, const float* g, uint32_t dim,
             const Step& s) const override {
    update::ftrl(w, slots[0], slots[1], g, dim, s.learning_rate, config_.l1, config_.l2,
                 config_.lr_power, s.scale);
  }
  bool stays_finite(const float* w, const float* const* slots, const float* g, uint32_t dim,
                    const Step& s) const override {
    return update::ftrl_ok(w, slots[0], slots[1], g, dim, s.learning_rate, config_.l1, config_.l2,
                           config_.lr_power, s.scale, kFloatMax);
  }
  const char* slot_violation(uint32_t k, std::span<const float> values) const override {
    return k != 0 || all_positive(values) ? nullptr : "FTRL's accumulator must be > 0";
  }
};

void require(bool ok, const std::string& table, const char* what) {
  if (!ok) throw RequestError("table '" + table + "': " + what);
}

}  // namespace

const char* row_optimizer_name(RowOptimizerKind kind) {
  switch (kind) {
    case RowOptimizerKind::kSgd:
      return "sgd";
    case RowOptimizerKind::kAdagrad:
      return "adagrad";
    case RowOptimizerKind::kLazyAdam:
      return "lazy_adam";
    case RowOptimizerKind::kFtrl:
      return "ftrl";
  }
  return "?";
}

std::unique_ptr<RowOptimizer> RowOptimizer::make(const RowOptimizerConfig& c,
                                                 const std::string& table) {
  require(std::isfinite(c.learning_rate) && c.learning_rate > 0, table,
          "learning rate must be finite and > 0");
  switch (c.kind) {
    case RowOptimizerKind::kSgd:
      return std::unique_ptr<RowOptimizer>(new RowSgd(c));
    case RowOptimizerKind::kAdagrad:
      require(std::isfinite(c.initial_accumulator) && c.initial_accumulator > 0, table,
              "Adagrad's initial accumulator must be > 0");
      return std::unique_ptr<RowOptimizer>(new RowAdagrad(c));
    case RowOptimizerKind::kLazyAdam:
      require(c.beta1 >= 0 && c.beta1 < 1, table, "Adam's beta1 must be in [0, 1)");
      require(c.beta2 >= 0 && c.beta2 < 1, table, "Adam's beta2 must be in [0, 1)");
      require(std::isfinite(c.epsilon) && c.epsilon > 0, table, "Adam's epsilon must be > 0");
      return std::unique_ptr<RowOptimizer>(new RowLazyAdam(c));
    case RowOptimizerKind::kFtrl:
      require(std::isfinite(c.initial_accumulator) && c.initial_accumulator > 0, table,
              "FTRL's initial accumulator must be > 0");
      require(std::isfinite(c.l1) && c.l1 >= 0, table, "FTRL's l1 must be >= 0");
      require(std::isfinite(c.l2) && c.l2 >= 0, table, "FTRL's l2 must be >= 0");
      require(std::isfinite(c.lr_power) && c.lr_power <= 0, table,
              "FTRL's learning rate power must be <= 0");
      return std::unique_ptr<RowOptimizer>(new RowFtrl(c));
  }
  throw RequestError("table '" + table + "': unknown optimizer");
}

}  // namespace ps
