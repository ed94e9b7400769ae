// The deep part of wide & deep: a dense MLP (ReLU or sigmoid hidden layers)
// ending in ONE logit, with a logistic (binary cross-entropy) loss, on the
// CPU. Unlike MlpEngine it also returns the gradient with respect to its
// input, which the embedding bags below it need, and takes an extra logit
// per example (the wide part's) that is added before the sigmoid.
//
// Parameters use the MlpShape / ParamLayout of ps/mlp.h with classes == 1
// ("layer<l>/weights" (in, out), "layer<l>/biases" (out)), so a trainer pulls
// and pushes them by name as for the MNIST MLP; init_params() initializes them.
//
// Example (13 dense + 26 fields x dim 16 -> 256 -> 128 -> 1):
//
//   ps::MlpShape shape{.inputs = 13 + 26 * 16, .hidden = {256, 128}, .classes = 1};
//   ps::LogisticMlp head(shape, /*max_batch=*/512);
//   ps::init_params(shape, head.params(), /*seed=*/1);   // or pull into head.params()
//   std::vector<float> dx(B * shape.inputs), dlogit(B);
//   double loss = head.compute_gradients(x, labels, wide_logit, dx, dlogit);
//   push head.grads() by layout(); dx goes to embedding_bag_backward; dlogit is
//   the gradient of the wide part's logit for each example.
//
// Bad input (a batch over max_batch, sizes that do not match, labels outside
// [0, 1]) throws ps::Error and changes nothing.
//
// CudaLogisticMlp is the same head on one GPU (cuBLAS), with the same API:
// host spans in and out, params() and grads() on the host (params() is
// uploaded at every call, so a trainer pulls into it as for LogisticMlp),
// device buffers allocated once for max_batch.
//
//   ps::CudaLogisticMlp head(shape, /*max_batch=*/512, /*device=*/0, /*tf32=*/false);
//   client.pull(..., head.params());
//   double loss = head.compute_gradients(x, labels, wide_logit, dx, dlogit);
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ps/mlp.h"

namespace ps {
namespace detail {
struct LogisticMlpState;
}

class LogisticMlp {
 public:
  // shape.classes must be 1 (throws ConfigError otherwise).
  LogisticMlp(const MlpShape& shape, int max_batch);

  const MlpShape& shape() const { return shape_; }
  const ParamLayout& layout() const { return layout_; }
  int max_batch() const { return max_batch_; }

  std::span<float> params() { return params_; }  // (P) layout()
  std::span<float> grads() { return grads_; }    // (P) layout(), after compute_gradients

  // x (B, inputs) row-major; labels (B) in [0, 1]; extra_logit (B) or empty.
  // Returns the mean log-loss of sigmoid(head logit + extra_logit); grads()
  // becomes its gradient; dx (B, inputs) and dlogit (B), when not empty, its
  // gradient with respect to x and to the logit of each example.
  double compute_gradients(std::span<const float> x, std::span<const float> labels,
                           std::span<const float> extra_logit = {}, std::span<float> dx = {},
                           std::span<float> dlogit = {});

  // probs (n) = sigmoid(head logit + extra_logit) for x (n, inputs), any n.
  void predict(std::span<const float> x, std::span<const float> extra_logit,
               std::span<float> probs);

 private:
  // acts_[l] (B, out_l); the last (B, 1) holds head logit + extra_logit.
  void forward(const float* x, const float* extra_logit, int batch);
  detail::LogisticMlpState state();  // the buffers, for the arithmetic

  MlpShape shape_;
  ParamLayout layout_;
  int max_batch_;
  std::vector<float> params_;             // (P)
  std::vector<float> grads_;              // (P)
  std::vector<std::vector<float>> acts_;  // per layer (max_batch, out_l)
  std::vector<float> dbuf_[2];            // (max_batch, widest hidden) ping-pong
};

// LogisticMlp's contract on a CUDA device. Not thread-safe: one per thread.
// Results match LogisticMlp's to float rounding (the products are cuBLAS's,
// with TF32's coarser rounding when tf32 is asked for).
class CudaLogisticMlp {
 public:
  // shape.classes must be 1 (throws ConfigError otherwise); throws ps::Error
  // when this build has no CUDA or there is no such device.
  CudaLogisticMlp(const MlpShape& shape, int max_batch, int device = 0, bool tf32 = false);
  ~CudaLogisticMlp();
  CudaLogisticMlp(const CudaLogisticMlp&) = delete;
  CudaLogisticMlp& operator=(const CudaLogisticMlp&) = delete;

  const MlpShape& shape() const { return shape_; }
  const ParamLayout& layout() const { return layout_; }
  int max_batch() const { return max_batch_; }
  std::string device_description() const;  // device, name, FP32 or TF32

  std::span<float> params() { return params_; }  // (P) layout(), host memory
  std::span<float> grads() { return grads_; }    // (P) layout(), after compute_gradients

  // As LogisticMlp::compute_gradients.
  double compute_gradients(std::span<const float> x, std::span<const float> labels,
                           std::span<const float> extra_logit = {}, std::span<float> dx = {},
                           std::span<float> dlogit = {});

  // As LogisticMlp::predict.
  void predict(std::span<const float> x, std::span<const float> extra_logit,
               std::span<float> probs);

 private:
  struct Impl;
  MlpShape shape_;
  ParamLayout layout_;
  int max_batch_;
  std::unique_ptr<Impl> impl_;
  std::span<float> params_, grads_;  // pinned host memory of impl_
};

}  // namespace ps
