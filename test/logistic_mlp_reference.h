// The float64 reference of the logistic head (LogisticMlp, CudaLogisticMlp)
// in plain loops: loss, parameter gradients, input and logit gradients and
// probabilities; and random cases to compare an implementation against it.
// With mlp_test::GemmOperands::kTf32 every matrix product's operands are first
// rounded to TF32, as cuBLAS's TF32 mode does (test/mlp_reference.h): the
// result a TF32 head should match, ReLU masks flipped by that rounding included.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ps/mlp.h"
#include "test/mlp_reference.h"

namespace logistic_test {

struct Ref {
  double loss = 0;
  std::vector<double> grads;   // (P)
  std::vector<double> dx;      // (B, inputs)
  std::vector<double> dlogit;  // (B)
  std::vector<double> probs;   // (B)
};

inline double act(double v, ps::Activation a) {
  return a == ps::Activation::kRelu ? std::max(v, 0.0) : 1 / (1 + std::exp(-v));
}
inline double act_grad(double y, ps::Activation a) {
  return a == ps::Activation::kRelu ? (y > 0 ? 1.0 : 0.0) : y * (1 - y);
}

// Plain loops in float64. x (B, in), labels (B), extra (B or empty).
inline Ref reference(const ps::MlpShape& s, const std::vector<double>& p,
                     const std::vector<double>& x, const std::vector<double>& labels,
                     const std::vector<double>& extra,
                     mlp_test::GemmOperands gemm = mlp_test::GemmOperands::kFloat64) {
  const auto op = [gemm](double v) {
    return gemm == mlp_test::GemmOperands::kTf32 ? mlp_test::round_to_tf32(v) : v;
  };
  const ps::ParamLayout layout(s);
  const int B = static_cast<int>(labels.size()), L = s.num_layers();
  std::vector<std::vector<double>> a(L + 1);  // a[0] = x, a[l+1] = output of layer l
  a[0] = x;
  for (int l = 0; l < L; ++l) {
    const int in = s.layer_in(l), out = s.layer_out(l);
    a[l + 1].assign(static_cast<size_t>(B) * out, 0);
    for (int i = 0; i < B; ++i)
      for (int o = 0; o < out; ++o) {
        double z = p[layout.biases(l).offset + o];
        for (int k = 0; k < in; ++k)
          z += op(a[l][i * in + k]) * op(p[layout.weights(l).offset + k * out + o]);
        a[l + 1][i * out + o] =
            l + 1 < L ? act(z, s.activation) : z + (extra.empty() ? 0.0 : extra[i]);
      }
  }
  Ref r;
  r.grads.assign(layout.total(), 0);
  std::vector<double> dz(B);
  for (int i = 0; i < B; ++i) {
    const double z = a[L][i], q = 1 / (1 + std::exp(-z));
    r.loss += -(labels[i] * std::log(q) + (1 - labels[i]) * std::log(1 - q));
    dz[i] = (q - labels[i]) / B;
    r.probs.push_back(q);
  }
  r.loss /= B;
  r.dlogit = dz;
  for (int l = L - 1; l >= 0; --l) {
    const int in = s.layer_in(l), out = s.layer_out(l);
    std::vector<double> da(static_cast<size_t>(B) * in, 0);
    for (int i = 0; i < B; ++i)
      for (int o = 0; o < out; ++o) {
        const double g = dz[i * out + o];
        r.grads[layout.biases(l).offset + o] += g;
        for (int k = 0; k < in; ++k) {
          r.grads[layout.weights(l).offset + k * out + o] += op(a[l][i * in + k]) * op(g);
          da[i * in + k] += op(g) * op(p[layout.weights(l).offset + k * out + o]);
        }
      }
    if (l == 0) {
      r.dx = da;
      break;
    }
    for (size_t j = 0; j < da.size(); ++j) da[j] *= act_grad(a[l][j], s.activation);
    dz = da;
  }
  return r;
}

struct Case {
  ps::MlpShape shape;
  std::vector<float> params, x, labels, extra;
};

inline Case make_case(const ps::MlpShape& shape, int B, bool with_extra, uint64_t seed) {
  Case c{shape, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0, 1);
  std::uniform_real_distribution<float> u01(0, 1);
  c.params.resize(ps::ParamLayout(shape).total());
  ps::init_params(shape, c.params, seed);
  for (float& v : c.params) v += 0.05f * n01(rng);  // nonzero biases too
  for (int i = 0; i < B * shape.inputs; ++i) c.x.push_back(n01(rng));
  for (int i = 0; i < B; ++i) c.labels.push_back(u01(rng) < 0.3f ? 1.0f : 0.0f);
  if (with_extra)
    for (int i = 0; i < B; ++i) c.extra.push_back(2 * n01(rng));
  return c;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace logistic_test
