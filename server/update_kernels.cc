#include "server/update_kernels.h"

#include <cmath>

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

PS_VECTOR_CLONES void adam(float* __restrict w, float* __restrict m, float* __restrict v,
                           const float* __restrict g, std::size_t n, float lr_t, float b1, float b2,
                           float eps, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
  }
}

PS_VECTOR_CLONES void adagrad(float* __restrict w, float* __restrict acc, const float* __restrict g,
                              std::size_t n, float lr, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    acc[i] += gi * gi;
    w[i] -= lr * gi / std::sqrt(acc[i]);
  }
}

PS_VECTOR_CLONES void rmsprop(float* __restrict w, float* __restrict ms, float* __restrict mom,
                              const float* __restrict g, std::size_t n, float lr, float rho,
                              float mu, float eps, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    ms[i] = rho * ms[i] + (1.0f - rho) * gi * gi;
    mom[i] = mu * mom[i] + lr * gi / std::sqrt(ms[i] + eps);
    w[i] -= mom[i];
  }
}

PS_VECTOR_CLONES void ftrl(float* __restrict w, float* __restrict acc, float* __restrict lin,
                           const float* __restrict g, std::size_t n, float lr, float l1, float l2,
                           float lr_power, float scale) {
  // The usual power, -1/2, as a loop of its own: sqrt vectorises, pow does not.
  // A select, not a branch, in both: copysign(l1, lin) differs from
  // (lin > 0 ? l1 : -l1) only where |lin| <= l1 sets w to 0.
  auto update = [&](auto power) {
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i] * scale;
      const float acc_new = acc[i] + gi * gi;
      const float pow_new = power(acc_new);
      const float pow_old = power(acc[i]);
      const float l = lin[i] + (gi - (pow_new - pow_old) / lr * w[i]);
      const float quadratic = pow_new / lr + 2 * l2;
      const float shrunk = (std::copysign(l1, l) - l) / quadratic;
      w[i] = std::fabs(l) > l1 ? shrunk : 0.0f;
      lin[i] = l;
      acc[i] = acc_new;
    }
  };
  if (lr_power == -0.5f) {
    update([](float a) { return std::sqrt(a); });
  } else {
    const float p = -lr_power;
    update([p](float a) { return std::pow(a, p); });
  }
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

PS_VECTOR_CLONES bool adam_ok(const float* __restrict w, const float* __restrict m,
                              const float* __restrict v, const float* __restrict g, std::size_t n,
                              float lr_t, float b1, float b2, float eps, float scale, float lim) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    bad |= over(mi, lim) | over(vi, lim) | over(w[i] - lr_t * mi / (std::sqrt(vi) + eps), lim);
  }
  return bad == 0;
}

PS_VECTOR_CLONES bool adagrad_ok(const float* __restrict w, const float* __restrict acc,
                                 const float* __restrict g, std::size_t n, float lr, float scale,
                                 float lim) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float a = acc[i] + gi * gi;
    bad |= over(a, lim) | over(w[i] - lr * gi / std::sqrt(a), lim);
  }
  return bad == 0;
}

PS_VECTOR_CLONES bool rmsprop_ok(const float* __restrict w, const float* __restrict ms,
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

PS_VECTOR_CLONES bool ftrl_ok(const float* __restrict w, const float* __restrict acc,
                              const float* __restrict lin, const float* __restrict g,
                              std::size_t n, float lr, float l1, float l2, float lr_power,
                              float scale, float lim) {
  int bad = 0;
  auto check = [&](auto power) {
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i] * scale;
      const float acc_new = acc[i] + gi * gi;
      const float pow_new = power(acc_new);
      const float pow_old = power(acc[i]);
      const float l = lin[i] + (gi - (pow_new - pow_old) / lr * w[i]);
      const float quadratic = pow_new / lr + 2 * l2;
      const float shrunk = (std::copysign(l1, l) - l) / quadratic;
      bad |= over(acc_new, lim) | over(l, lim) | over(std::fabs(l) > l1 ? shrunk : 0.0f, lim);
    }
  };
  if (lr_power == -0.5f) {
    check([](float a) { return std::sqrt(a); });
  } else {
    const float p = -lr_power;
    check([p](float a) { return std::pow(a, p); });
  }
  return bad == 0;
}

}  // namespace ps::update
