// Float64 reference MLP in plain loops, for the engine tests: forward, mean
// softmax cross-entropy, #correct, and the analytic gradient; plus helpers to
// make random inputs and compare tensors. With GemmOperands::kTf32 every matrix
// product's operands are first rounded to TF32 (10 mantissa bits, to nearest,
// as cuBLAS's TF32 mode does) and accumulated in float64: the result a TF32
// engine should match, ReLU masks flipped by that rounding included.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ps/mlp.h"

namespace mlp_test {

struct RefResult {
  double loss = 0;  // mean over the batch
  int64_t correct = 0;
  std::vector<double> logits;  // (B, classes)
  std::vector<double> grads;   // (P), layout order; empty unless asked for
};

enum class GemmOperands { kFloat64, kTf32 };

// v as float rounded to 10 mantissa bits, ties away from zero (PTX cvt.rna.tf32.f32).
inline double round_to_tf32(double v) {
  const float f = static_cast<float>(v);
  if (!std::isfinite(f)) return f;
  const uint32_t bits = (std::bit_cast<uint32_t>(f) + 0x1000u) & 0xffffe000u;
  return std::bit_cast<float>(bits);
}

inline double ref_act(double v, ps::Activation a) {
  return a == ps::Activation::kRelu ? std::max(v, 0.0) : 1.0 / (1.0 + std::exp(-v));
}

// params: flat, ps::ParamLayout order. x (B, inputs), labels (B).
inline RefResult reference(const ps::MlpShape& shape, const std::vector<double>& params,
                           const float* x, const int32_t* labels, int B, bool want_grads,
                           GemmOperands gemm = GemmOperands::kFloat64) {
  const auto op = [gemm](double v) { return gemm == GemmOperands::kTf32 ? round_to_tf32(v) : v; };
  const ps::ParamLayout layout(shape);
  const int L = shape.num_layers();
  std::vector<std::vector<double>> acts(L + 1);  // acts[0] = x, acts[l+1] = output of layer l
  acts[0].assign(x, x + static_cast<size_t>(B) * shape.inputs);
  for (int l = 0; l < L; ++l) {
    const int in = shape.layer_in(l), out = shape.layer_out(l);
    const double* W = params.data() + layout.weights(l).offset;
    const double* b = params.data() + layout.biases(l).offset;
    acts[l + 1].assign(static_cast<size_t>(B) * out, 0.0);
    for (int i = 0; i < B; ++i)
      for (int o = 0; o < out; ++o) {
        double s = b[o];
        for (int k = 0; k < in; ++k)
          s += op(acts[l][static_cast<size_t>(i) * in + k]) *
               op(W[static_cast<size_t>(k) * out + o]);
        acts[l + 1][static_cast<size_t>(i) * out + o] =
            l + 1 < L ? ref_act(s, shape.activation) : s;
      }
  }
  RefResult r;
  r.logits = acts[L];
  const int C = shape.classes;
  std::vector<double> dz(static_cast<size_t>(B) * C);
  for (int i = 0; i < B; ++i) {
    const double* z = &r.logits[static_cast<size_t>(i) * C];
    int argmax = 0;
    for (int j = 1; j < C; ++j)
      if (z[j] > z[argmax]) argmax = j;
    double sum = 0;
    for (int j = 0; j < C; ++j) sum += std::exp(z[j] - z[argmax]);
    r.loss += z[argmax] + std::log(sum) - z[labels[i]];
    r.correct += argmax == labels[i];
    for (int j = 0; j < C; ++j)
      dz[static_cast<size_t>(i) * C + j] =
          (std::exp(z[j] - z[argmax]) / sum - (j == labels[i] ? 1.0 : 0.0)) / B;
  }
  r.loss /= B;
  if (!want_grads) return r;

  r.grads.assign(layout.total(), 0.0);
  for (int l = L - 1; l >= 0; --l) {
    const int in = shape.layer_in(l), out = shape.layer_out(l);
    const double* W = params.data() + layout.weights(l).offset;
    double* dW = r.grads.data() + layout.weights(l).offset;
    double* db = r.grads.data() + layout.biases(l).offset;
    for (int i = 0; i < B; ++i)
      for (int o = 0; o < out; ++o) {
        const double g = dz[static_cast<size_t>(i) * out + o];
        db[o] += g;
        for (int k = 0; k < in; ++k)
          dW[static_cast<size_t>(k) * out + o] +=
              op(acts[l][static_cast<size_t>(i) * in + k]) * op(g);
      }
    if (l == 0) break;
    std::vector<double> dx(static_cast<size_t>(B) * in, 0.0);
    for (int i = 0; i < B; ++i)
      for (int k = 0; k < in; ++k) {
        double s = 0;
        for (int o = 0; o < out; ++o)
          s += op(dz[static_cast<size_t>(i) * out + o]) * op(W[static_cast<size_t>(k) * out + o]);
        const double y = acts[l][static_cast<size_t>(i) * in + k];  // output of layer l-1
        const double d =
            shape.activation == ps::Activation::kRelu ? (y > 0 ? 1.0 : 0.0) : y * (1.0 - y);
        dx[static_cast<size_t>(i) * in + k] = s * d;
      }
    dz.swap(dx);
  }
  return r;
}

struct Batch {
  std::vector<float> x;         // (B, inputs) in [0, 1)
  std::vector<int32_t> labels;  // (B)
};

inline Batch random_batch(const ps::MlpShape& shape, int B, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> label(0, shape.classes - 1);
  Batch b;
  b.x.resize(static_cast<size_t>(B) * shape.inputs);
  for (float& v : b.x) v = pixel(rng);
  b.labels.resize(B);
  for (int32_t& v : b.labels) v = label(rng);
  return b;
}

// Random parameters with non-zero biases (so bias paths are exercised).
inline std::vector<float> random_params(const ps::MlpShape& shape, uint64_t seed) {
  std::vector<float> p(ps::ParamLayout(shape).total());
  ps::init_params(shape, p, seed);
  const ps::ParamLayout layout(shape);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
  for (int l = 0; l < shape.num_layers(); ++l)
    for (size_t i = 0; i < layout.biases(l).count; ++i) p[layout.biases(l).offset + i] = dist(rng);
  return p;
}

// max |a - ref| / max(max |ref|, floor): error relative to the tensor's scale.
template <typename A, typename R>
double rel_error(const A* a, const R* ref, size_t n, double floor = 1e-12) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(static_cast<double>(a[i]))) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(ref[i])));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return diff / std::max(scale, floor);
}

inline bool any_nan(const float* a, size_t n) {
  return std::any_of(a, a + n, [](float v) { return std::isnan(v); });
}

}  // namespace mlp_test
