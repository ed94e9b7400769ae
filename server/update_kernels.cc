#include "server/update_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/vector_clones.h"

namespace ps::update {

// Plain loops, so that the compiler vectorises them (this file is built
// with -fno-math-errno and -fno-trapping-math: server/meson.build); each
// reads and writes every array once, which keeps an update at memory speed.

PS_VECTOR_CLONES void sgd(float* __restrict w, const float* __restrict g, std::size_t n, float a) {
  for (std::size_t i = 0; i < n; ++i) w[i] -= a * g[i];
}

PS_VECTOR_CLONES void momentum(float* __restrict w, float* __restrict acc,
                               const float* __restrict g, std::size_t n, float lr, float mu,
                               float scale, bool nesterov) {
  if (nesterov) {
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i] * scale;
      acc[i] = mu * acc[i] + gi;
      w[i] -= lr * (gi + mu * acc[i]);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      acc[i] = mu * acc[i] + g[i] * scale;
      w[i] -= lr * acc[i];
    }
  }
}

PS_WIDE_VECTOR_CLONES void adam(float* __restrict w, float* __restrict m, float* __restrict v,
                                const float* __restrict g, std::size_t n, float lr_t, float b1,
                                float b2, float eps, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
  }
}

PS_WIDE_VECTOR_CLONES void adagrad(float* __restrict w, float* __restrict acc,
                                   const float* __restrict g, std::size_t n, float lr,
                                   float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    acc[i] += gi * gi;
    w[i] -= lr * gi / std::sqrt(acc[i]);
  }
}

PS_WIDE_VECTOR_CLONES void rmsprop(float* __restrict w, float* __restrict ms, float* __restrict mom,
                                   const float* __restrict g, std::size_t n, float lr, float rho,
                                   float mu, float eps, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    ms[i] = rho * ms[i] + (1.0f - rho) * gi * gi;
    mom[i] = mu * mom[i] + lr * gi / std::sqrt(ms[i] + eps);
    w[i] -= mom[i];
  }
}

namespace {

// One float's FTRL step: the new accumulator, linear term and weight.
// A select, not a branch: copysign(l1, lin) differs from (lin > 0 ? l1 : -l1)
// only where |lin| <= l1 sets w to 0; so the loops around it vectorise.
struct FtrlStep {
  float acc, lin, w;
};
template <typename Power>
inline FtrlStep ftrl_step(float w, float acc, float lin, float g, float lr, float l1, float l2,
                          Power power) {
  const float acc_new = acc + g * g;
  const float pow_new = power(acc_new);
  const float l = lin + (g - (pow_new - power(acc)) / lr * w);
  const float shrunk = (std::copysign(l1, l) - l) / (pow_new / lr + 2 * l2);
  return {acc_new, l, std::fabs(l) > l1 ? shrunk : 0.0f};
}

// fn(power) with acc^-lr_power as a function: the usual power, -1/2, as sqrt,
// which vectorises (pow does not).
template <typename Fn>
inline void with_power(float lr_power, Fn fn) {
  if (lr_power == -0.5f) {
    fn([](float a) { return std::sqrt(a); });
  } else {
    const float p = -lr_power;
    fn([p](float a) { return std::pow(a, p); });
  }
}

}  // namespace

PS_WIDE_VECTOR_CLONES void ftrl(float* __restrict w, float* __restrict acc, float* __restrict lin,
                                const float* __restrict g, std::size_t n, float lr, float l1,
                                float l2, float lr_power, float scale) {
  with_power(lr_power, [&](auto power) {
    for (std::size_t i = 0; i < n; ++i) {
      const FtrlStep s = ftrl_step(w[i], acc[i], lin[i], g[i] * scale, lr, l1, l2, power);
      acc[i] = s.acc;
      lin[i] = s.lin;
      w[i] = s.w;
    }
  });
}

// The check passes: the same arithmetic as the updates above, read only.

namespace {

inline int over(float x, float lim) { return !(std::fabs(x) <= lim); }

}  // namespace

PS_VECTOR_CLONES bool sgd_ok(const float* __restrict w, const float* __restrict g, std::size_t n,
                             float a, float lim) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad |= over(w[i] - a * g[i], lim);
  return bad == 0;
}

PS_VECTOR_CLONES bool momentum_ok(const float* __restrict w, const float* __restrict acc,
                                  const float* __restrict g, std::size_t n, float lr, float mu,
                                  float scale, bool nesterov, float lim) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float a = mu * acc[i] + gi;
    bad |= over(a, lim) | over(nesterov ? w[i] - lr * (gi + mu * a) : w[i] - lr * a, lim);
  }
  return bad == 0;
}

PS_WIDE_VECTOR_CLONES bool adam_ok(const float* __restrict w, const float* __restrict m,
                                   const float* __restrict v, const float* __restrict g,
                                   std::size_t n, float lr_t, float b1, float b2, float eps,
                                   float scale, float lim) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    bad |= over(mi, lim) | over(vi, lim) | over(w[i] - lr_t * mi / (std::sqrt(vi) + eps), lim);
  }
  return bad == 0;
}

PS_WIDE_VECTOR_CLONES bool adagrad_ok(const float* __restrict w, const float* __restrict acc,
                                      const float* __restrict g, std::size_t n, float lr,
                                      float scale, float lim) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float a = acc[i] + gi * gi;
    bad |= over(a, lim) | over(w[i] - lr * gi / std::sqrt(a), lim);
  }
  return bad == 0;
}

PS_WIDE_VECTOR_CLONES bool rmsprop_ok(const float* __restrict w, const float* __restrict ms,
                                      const float* __restrict mom, const float* __restrict g,
                                      std::size_t n, float lr, float rho, float mu, float eps,
                                      float scale, float lim) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float s = rho * ms[i] + (1.0f - rho) * gi * gi;
    const float mo = mu * mom[i] + lr * gi / std::sqrt(s + eps);
    bad |= over(s, lim) | over(mo, lim) | over(w[i] - mo, lim);
  }
  return bad == 0;
}

PS_WIDE_VECTOR_CLONES bool ftrl_ok(const float* __restrict w, const float* __restrict acc,
                                   const float* __restrict lin, const float* __restrict g,
                                   std::size_t n, float lr, float l1, float l2, float lr_power,
                                   float scale, float lim) {
  int bad = 0;
  with_power(lr_power, [&](auto power) {
    for (std::size_t i = 0; i < n; ++i) {
      const FtrlStep s = ftrl_step(w[i], acc[i], lin[i], g[i] * scale, lr, l1, l2, power);
      bad |= over(s.acc, lim) | over(s.lin, lim) | over(s.w, lim);
    }
  });
  return bad == 0;
}

// |a * g| under 2^102, below half the spacing of floats at FLT_MAX (2^103):
// w - a * g then rounds to at most FLT_MAX in magnitude for any finite w.
float sgd_safe_gradient_bound(double lr, double scale, double summed) {
  constexpr double kMax = std::numeric_limits<float>::max();
  const double step = std::fabs(lr * scale) * summed;
  if (std::isnan(step)) return 0;
  return static_cast<float>(std::min(step > 0 ? 0x1p102 / step : kMax, kMax));
}

// With acc > 0: |g| <= 2^50 keeps acc + g^2 within half a spacing of
// FLT_MAX, so finite; and |g| / sqrt(acc + g^2) <= sqrt(2) even where g^2 is
// subnormal, so the step lr g / sqrt(acc) stays under 2^102 for
// lr <= 2^100, as SGD's does (lr g itself kept finite).
float adagrad_safe_gradient_bound(double lr, double scale, double summed) {
  constexpr double kMax = std::numeric_limits<float>::max();
  lr = std::fabs(lr);
  if (!(lr <= 0x1p100)) return 0;
  const double g = std::min(0x1p50, kMax / (4 * lr));
  const double per = std::fabs(scale) * summed;
  if (std::isnan(per)) return 0;
  return static_cast<float>(std::min(per > 0 ? g / per : kMax, kMax));
}

}  // namespace ps::update
