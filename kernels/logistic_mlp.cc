// LogisticMlp: Eigen on row-major maps of buffers sized for max_batch, so a
// step allocates nothing.
#include "ps/logistic_mlp.h"

#include <algorithm>
#include <cmath>

#include <Eigen/Core>
#include <fmt/format.h>

#include "ps/errors.h"

namespace ps {
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

}  // namespace

LogisticMlp::LogisticMlp(const MlpShape& shape, int max_batch)
    : shape_(shape), layout_((shape.validate(), shape)), max_batch_(max_batch) {
  if (shape.classes != 1)
    throw ConfigError(fmt::format("LogisticMlp: the output must be one logit (classes = 1), got {}",
                                  shape.classes));
  if (max_batch < 1)
    throw ConfigError(fmt::format("LogisticMlp: max_batch must be >= 1, got {}", max_batch));
  params_.assign(layout_.total(), 0.0f);
  grads_.assign(layout_.total(), 0.0f);
  for (int l = 0; l < shape.num_layers(); ++l)
    acts_.emplace_back(static_cast<size_t>(max_batch) * shape.layer_out(l), 0.0f);
  if (!shape.hidden.empty()) {
    const int widest_hidden = *std::max_element(shape.hidden.begin(), shape.hidden.end());
    for (auto& d : dbuf_) d.assign(static_cast<size_t>(max_batch) * widest_hidden, 0.0f);
  }
}

void LogisticMlp::check(std::span<const float> x, int64_t n, std::span<const float> extra_logit,
                        const char* what) const {
  if (x.size() != static_cast<size_t>(n) * shape_.inputs)
    throw Error(fmt::format("LogisticMlp::{}: x holds {} floats, {} examples x {} inputs need {}",
                            what, x.size(), n, shape_.inputs, n * shape_.inputs));
  if (!extra_logit.empty() && extra_logit.size() != static_cast<size_t>(n))
    throw Error(fmt::format("LogisticMlp::{}: extra_logit holds {} floats for {} examples", what,
                            extra_logit.size(), n));
}

void LogisticMlp::forward(const float* x, const float* extra_logit, int batch) {
  const int num_layers = shape_.num_layers();
  const float* in = x;
  for (int l = 0; l < num_layers; ++l) {
    const int n_in = shape_.layer_in(l), n_out = shape_.layer_out(l);
    ConstMatMap X(in, batch, n_in);                                          // (B, in)
    ConstMatMap W(params_.data() + layout_.weights(l).offset, n_in, n_out);  // (in, out)
    ConstRowMap b(params_.data() + layout_.biases(l).offset, n_out);         // (out)
    MatMap Y(acts_[l].data(), batch, n_out);                                 // (B, out)
    Y.noalias() = X * W;
    Y.rowwise() += b;
    if (l + 1 < num_layers) {
      if (shape_.activation == Activation::kRelu)
        Y = Y.cwiseMax(0.0f);
      else
        Y = (1.0f + (-Y.array()).exp()).inverse().matrix();
    }
    in = acts_[l].data();
  }
  if (extra_logit)
    for (int i = 0; i < batch; ++i) acts_.back()[i] += extra_logit[i];
}

double LogisticMlp::compute_gradients(std::span<const float> x, std::span<const float> labels,
                                      std::span<const float> extra_logit, std::span<float> dx,
                                      std::span<float> dlogit) {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n < 1 || n > max_batch_)
    throw Error(fmt::format("LogisticMlp::compute_gradients: batch of {} outside [1, max_batch {}]",
                            n, max_batch_));
  check(x, n, extra_logit, "compute_gradients");
  if (!dx.empty() && dx.size() != x.size())
    throw Error(fmt::format("LogisticMlp::compute_gradients: dx holds {} floats, x {}", dx.size(),
                            x.size()));
  if (!dlogit.empty() && dlogit.size() != static_cast<size_t>(n))
    throw Error(
        fmt::format("LogisticMlp::compute_gradients: dlogit holds {} floats for {} examples",
                    dlogit.size(), n));
  for (int64_t i = 0; i < n; ++i)
    if (!(labels[i] >= 0.0f && labels[i] <= 1.0f))
      throw Error(
          fmt::format("LogisticMlp::compute_gradients: label {} of example {} is outside [0, 1]",
                      labels[i], i));

  const int batch = static_cast<int>(n);
  forward(x.data(), extra_logit.empty() ? nullptr : extra_logit.data(), batch);
  // Loss, and dL/dz of the logit (B, 1) in place: (sigmoid(z) - y) / B.
  float* z = acts_.back().data();
  double loss = 0;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  for (int i = 0; i < batch; ++i) {
    loss += softplus(z[i]) - static_cast<double>(labels[i]) * z[i];
    z[i] = (sigmoid(z[i]) - labels[i]) * inv_batch;
  }
  if (!dlogit.empty()) std::copy_n(z, batch, dlogit.begin());

  const int num_layers = shape_.num_layers();
  const float* dz = z;  // (B, out_l): dL/d(pre-activation) of layer l
  int next = 0;
  for (int l = num_layers - 1; l >= 0; --l) {
    const int n_in = shape_.layer_in(l), n_out = shape_.layer_out(l);
    ConstMatMap X(l == 0 ? x.data() : acts_[l - 1].data(), batch, n_in);  // (B, in)
    ConstMatMap dZ(dz, batch, n_out);                                     // (B, out)
    MatMap dW(grads_.data() + layout_.weights(l).offset, n_in, n_out);    // (in, out)
    RowMap db(grads_.data() + layout_.biases(l).offset, n_out);           // (out)
    dW.noalias() = X.transpose() * dZ;
    db = dZ.colwise().sum();
    if (l == 0 && dx.empty()) break;
    ConstMatMap W(params_.data() + layout_.weights(l).offset, n_in, n_out);
    MatMap dX(l == 0 ? dx.data() : dbuf_[next].data(), batch, n_in);  // (B, in)
    dX.noalias() = dZ * W.transpose();
    if (l == 0) break;
    auto Y = ConstMatMap(acts_[l - 1].data(), batch, n_in).array();  // output of layer l-1
    if (shape_.activation == Activation::kRelu)
      dX = (Y > 0.0f).select(dX.array(), 0.0f).matrix();
    else
      dX.array() *= Y * (1.0f - Y);
    dz = dbuf_[next].data();
    next ^= 1;
  }
  return loss / batch;
}

void LogisticMlp::predict(std::span<const float> x, std::span<const float> extra_logit,
                          std::span<float> probs) {
  const int64_t n = static_cast<int64_t>(probs.size());
  check(x, n, extra_logit, "predict");
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    forward(x.data() + start * shape_.inputs,
            extra_logit.empty() ? nullptr : extra_logit.data() + start, batch);
    for (int i = 0; i < batch; ++i) probs[start + i] = sigmoid(acts_.back()[i]);
  }
}

}  // namespace ps
