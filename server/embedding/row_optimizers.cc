#include "server/embedding/row_optimizers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ps/errors.h"

namespace ps {
namespace {

class RowSgd final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 0; }
  float slot_init(uint32_t) const override { return 0; }
  void apply(float* __restrict w, float* const*, const float* __restrict g, uint32_t dim,
             float scale, uint64_t) const override {
    const float a = config_.learning_rate * scale;
    for (uint32_t i = 0; i < dim; ++i) w[i] -= a * g[i];
  }
  // |a * g| under 2^102, below half the spacing of floats at FLT_MAX (2^103):
  // w - a * g then rounds to at most FLT_MAX in magnitude for any finite w.
  float safe_gradient_bound(float scale, std::size_t summed) const override {
    const double step = std::fabs(double(config_.learning_rate) * scale) * double(summed);
    const double bound = step > 0 ? 0x1p102 / step : std::numeric_limits<float>::max();
    return static_cast<float>(std::min<double>(bound, std::numeric_limits<float>::max()));
  }
};

class RowAdagrad final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 1; }
  float slot_init(uint32_t) const override { return config_.initial_accumulator; }
  void apply(float* __restrict w, float* const* slots, const float* __restrict g, uint32_t dim,
             float scale, uint64_t) const override {
    float* __restrict acc = slots[0];
    const float lr = config_.learning_rate;
    for (uint32_t i = 0; i < dim; ++i) {
      const float gi = g[i] * scale;
      acc[i] += gi * gi;
      w[i] -= lr * gi / std::sqrt(acc[i]);
    }
  }
};

class RowLazyAdam final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 2; }
  float slot_init(uint32_t) const override { return 0; }
  void apply(float* __restrict w, float* const* slots, const float* __restrict g, uint32_t dim,
             float scale, uint64_t t) const override {
    float* __restrict m = slots[0];
    float* __restrict v = slots[1];
    const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.epsilon;
    const double td = static_cast<double>(t);
    const float lr_t =
        static_cast<float>(config_.learning_rate * std::sqrt(1.0 - std::pow(double(b2), td)) /
                           (1.0 - std::pow(double(b1), td)));
    for (uint32_t i = 0; i < dim; ++i) {
      const float gi = g[i] * scale;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
};

// tf.train.FtrlOptimizer (l2_shrinkage 0):
//   acc' = acc + g^2
//   linear += g - (acc'^-p - acc^-p) / lr * w
//   quadratic = acc'^-p / lr + 2 l2
//   w = |linear| > l1 ? (sign(linear) l1 - linear) / quadratic : 0
class RowFtrl final : public RowOptimizer {
 public:
  using RowOptimizer::RowOptimizer;
  uint32_t num_slots() const override { return 2; }
  float slot_init(uint32_t k) const override { return k == 0 ? config_.initial_accumulator : 0.0f; }
  void apply(float* __restrict w, float* const* slots, const float* __restrict g, uint32_t dim,
             float scale, uint64_t) const override {
    float* __restrict acc = slots[0];
    float* __restrict lin = slots[1];
    const float lr = config_.learning_rate, l1 = config_.l1, l2 = config_.l2, p = -config_.lr_power;
    const bool sqrt_power = config_.lr_power == -0.5f;
    for (uint32_t i = 0; i < dim; ++i) {
      const float gi = g[i] * scale;
      const float acc_new = acc[i] + gi * gi;
      const float pow_new = sqrt_power ? std::sqrt(acc_new) : std::pow(acc_new, p);
      const float pow_old = sqrt_power ? std::sqrt(acc[i]) : std::pow(acc[i], p);
      lin[i] += gi - (pow_new - pow_old) / lr * w[i];
      const float quadratic = pow_new / lr + 2 * l2;
      w[i] = std::fabs(lin[i]) > l1 ? ((lin[i] > 0 ? l1 : -l1) - lin[i]) / quadratic : 0.0f;
      acc[i] = acc_new;
    }
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
