// Row-wise optimizers for embedding tables: each update touches only the
// rows a push names, and their slots (per-row state, `dim` floats each).
//   SGD:      w -= lr g
//   Adagrad:  acc += g^2; w -= lr g / sqrt(acc)                    (tf.train.AdagradOptimizer)
//   LazyAdam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//             w -= lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps)   (tfa LazyAdam: untouched rows
//             keep m, v)
//   FTRL:     tf.train.FtrlOptimizer's FTRL-Proximal with L1/L2 (slots: accumulator, linear)
// where g is the (summed, scaled) gradient of the row and t counts the
// table's updates (1 for the first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ps/embedding.h"

namespace ps {

class RowOptimizer {
 public:
  // Throws RequestError (naming `table`) for parameters that would make NaN
  // or break the optimizer's preconditions.
  static std::unique_ptr<RowOptimizer> make(const RowOptimizerConfig& config,
                                            const std::string& table);
  virtual ~RowOptimizer() = default;

  const RowOptimizerConfig& config() const { return config_; }
  virtual uint32_t num_slots() const = 0;
  // The value every float of slot k starts at.
  virtual float slot_init(uint32_t k) const = 0;
  // What every row of one update shares, worked out once per update rather
  // than per row: the gradients' scale, and LazyAdam's bias-corrected
  // learning rate for t, the table's update count (from 1).
  struct Step {
    float scale = 1;
    float learning_rate = 0;
  };
  virtual Step step(float scale, uint64_t /*t*/) const { return {scale, config_.learning_rate}; }
  // Updates one row: w and slots[k] point at its `dim` floats; g is the
  // gradient (times s.scale).
  virtual void apply(float* w, float* const* slots, const float* g, uint32_t dim,
                     const Step& s) const = 0;
  // Whether apply() with the same arguments would leave the row and its
  // slots finite; reads them only (the same arithmetic, the same bits).
  virtual bool stays_finite(const float* w, const float* const* slots, const float* g, uint32_t dim,
                            const Step& s) const = 0;
  // A magnitude such that gradients all within it, each row's summed over at
  // most `summed` positions, leave every finite row and slot finite: psd
  // then applies a push without trying it on copies first. 0 where no such
  // bound is known (the slots' own size matters).
  virtual float safe_gradient_bound(float /*scale*/, std::size_t /*summed*/) const { return 0; }
  // What restored values of slot k must satisfy beyond being finite (the
  // invariant the updates keep, which safe_gradient_bound relies on), as
  // "must be > 0"; nullptr if every value is fine.
  virtual const char* slot_violation(uint32_t /*k*/, std::span<const float> /*values*/) const {
    return nullptr;
  }

 protected:
  explicit RowOptimizer(const RowOptimizerConfig& c) : config_(c) {}
  RowOptimizerConfig config_;
};

const char* row_optimizer_name(RowOptimizerKind kind);

}  // namespace ps
