// The optimizers' per-element updates, shared by dense tensors
// (server/optimizer.cc) and embedding-table rows
// (server/embedding/row_optimizers.cc): one loop per optimizer, built for
// SSE2 and for AVX2 with the CPU picking (common/vector_clones.h), the same
// bits either way. Free functions, not virtual methods, because GCC cannot
// clone virtual ones. Every array holds n floats; g is the gradient, used as
// g * scale.
//
//   update::adam(w, m, v, g, n, lr_t, beta1, beta2, epsilon, scale);  // lr_t: bias-corrected
#pragma once

#include <cstddef>

namespace ps::update {

// w -= a * g
void sgd(float* w, const float* g, std::size_t n, float a);
// acc = mu * acc + g; w -= lr * acc (nesterov: w -= lr * (g + mu * acc))
void momentum(float* w, float* acc, const float* g, std::size_t n, float lr, float mu, float scale,
              bool nesterov);
// m, v: Adam's moments; lr_t the learning rate with both bias corrections of the step.
void adam(float* w, float* m, float* v, const float* g, std::size_t n, float lr_t, float b1,
          float b2, float eps, float scale);
// acc += g^2; w -= lr * g / sqrt(acc)
void adagrad(float* w, float* acc, const float* g, std::size_t n, float lr, float scale);
// ms: mean square; mom: momentum (TF's RMSProp)
void rmsprop(float* w, float* ms, float* mom, const float* g, std::size_t n, float lr, float rho,
             float mu, float eps, float scale);
// tf.train.FtrlOptimizer (l2_shrinkage 0), acc the accumulator, lin the linear term:
//   acc' = acc + g^2;  lin += g - (acc'^-p - acc^-p) / lr * w
//   w = |lin| > l1 ? (sign(lin) l1 - lin) / (acc'^-p / lr + 2 l2) : 0,  p = lr_power (<= 0)
void ftrl(float* w, float* acc, float* lin, const float* g, std::size_t n, float lr, float l1,
          float l2, float lr_power, float scale);

// The checks: each the same arithmetic as its update, read only, false if
// any value or slot the update would write is over `lim` in magnitude or
// NaN (lim = FLT_MAX: would not stay finite). The same bits as the update
// computes, so a check that passes is an update that stays within lim.
bool sgd_ok(const float* w, const float* g, std::size_t n, float a, float lim);
bool momentum_ok(const float* w, const float* acc, const float* g, std::size_t n, float lr,
                 float mu, float scale, bool nesterov, float lim);
bool adam_ok(const float* w, const float* m, const float* v, const float* g, std::size_t n,
             float lr_t, float b1, float b2, float eps, float scale, float lim);
bool adagrad_ok(const float* w, const float* acc, const float* g, std::size_t n, float lr,
                float scale, float lim);
bool rmsprop_ok(const float* w, const float* ms, const float* mom, const float* g, std::size_t n,
                float lr, float rho, float mu, float eps, float scale, float lim);
bool ftrl_ok(const float* w, const float* acc, const float* lin, const float* g, std::size_t n,
             float lr, float l1, float l2, float lr_power, float scale, float lim);

// Safe gradient bounds: with every |g| at most the bound (g being the sum
// of at most `summed` gradients), the update leaves every finite weight and
// slot finite, so it needs no check pass. `lr`: the largest learning rate
// the update can use. 0 where no bound holds.
float sgd_safe_gradient_bound(double lr, double scale, double summed);
// Needs every accumulator > 0, which the updates keep and restores check.
float adagrad_safe_gradient_bound(double lr, double scale, double summed);

}  // namespace ps::update
