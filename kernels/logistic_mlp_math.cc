// LogisticMlp's arithmetic on Eigen row-major maps of its buffers (sized for
// max_batch: a step allocates nothing). Built twice: see logistic_mlp_math.h.
#include "kernels/logistic_mlp_math.h"

#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#ifndef PS_LOGISTIC_MLP_MATH
#define PS_LOGISTIC_MLP_MATH logistic_mlp_math_baseline
#endif

namespace ps::detail {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
using ConstRowMap = Eigen::Map<const Eigen::RowVectorXf>;
using RowMap = Eigen::Map<Eigen::RowVectorXf>;

// log(1 + e^z) without overflow.
double softplus(double z) { return z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z)); }
float sigmoid(float z) {
  return z >= 0 ? 1.0f / (1.0f + std::exp(-z)) : std::exp(z) / (1.0f + std::exp(z));
}

void forward(const LogisticMlpState& s, const float* x, const float* extra_logit, int batch) {
  const int num_layers = s.shape.num_layers();
  const float* in = x;
  for (int l = 0; l < num_layers; ++l) {
    const int n_in = s.shape.layer_in(l), n_out = s.shape.layer_out(l);
    ConstMatMap X(in, batch, n_in);                                     // (B, in)
    ConstMatMap W(s.params + s.layout.weights(l).offset, n_in, n_out);  // (in, out)
    ConstRowMap b(s.params + s.layout.biases(l).offset, n_out);         // (out)
    MatMap Y(s.acts[l].data(), batch, n_out);                           // (B, out)
    Y.noalias() = X * W;
    Y.rowwise() += b;
    if (l + 1 < num_layers) {
      if (s.shape.activation == Activation::kRelu)
        Y = Y.cwiseMax(0.0f);
      else
        Y = (1.0f + (-Y.array()).exp()).inverse().matrix();
    }
    in = s.acts[l].data();
  }
  if (extra_logit)
    for (int i = 0; i < batch; ++i) s.acts.back()[i] += extra_logit[i];
}

double gradients(const LogisticMlpState& s, const float* x, const float* labels, int batch,
                 float* dx, float* dlogit) {
  // Loss, and dL/dz of the logit (B, 1) in place: (sigmoid(z) - y) / B.
  float* z = s.acts.back().data();
  double loss = 0;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  for (int i = 0; i < batch; ++i) {
    loss += softplus(z[i]) - static_cast<double>(labels[i]) * z[i];
    z[i] = (sigmoid(z[i]) - labels[i]) * inv_batch;
  }
  if (dlogit) std::copy_n(z, batch, dlogit);

  const int num_layers = s.shape.num_layers();
  const float* dz = z;  // (B, out_l): dL/d(pre-activation) of layer l
  int next = 0;
  for (int l = num_layers - 1; l >= 0; --l) {
    const int n_in = s.shape.layer_in(l), n_out = s.shape.layer_out(l);
    ConstMatMap X(l == 0 ? x : s.acts[l - 1].data(), batch, n_in);  // (B, in)
    ConstMatMap dZ(dz, batch, n_out);                               // (B, out)
    MatMap dW(s.grads + s.layout.weights(l).offset, n_in, n_out);   // (in, out)
    RowMap db(s.grads + s.layout.biases(l).offset, n_out);          // (out)
    dW.noalias() = X.transpose() * dZ;
    db = dZ.colwise().sum();
    if (l == 0 && !dx) break;
    ConstMatMap W(s.params + s.layout.weights(l).offset, n_in, n_out);
    MatMap dX(l == 0 ? dx : s.dbuf[next].data(), batch, n_in);  // (B, in)
    dX.noalias() = dZ * W.transpose();
    if (l == 0) break;
    auto Y = ConstMatMap(s.acts[l - 1].data(), batch, n_in).array();  // output of layer l-1
    if (s.shape.activation == Activation::kRelu)
      dX = (Y > 0.0f).select(dX.array(), 0.0f).matrix();
    else
      dX.array() *= Y * (1.0f - Y);
    dz = s.dbuf[next].data();
    next ^= 1;
  }
  return loss / batch;
}

}  // namespace

LogisticMlpMath PS_LOGISTIC_MLP_MATH() { return {&forward, &gradients, &sigmoid}; }

}  // namespace ps::detail
