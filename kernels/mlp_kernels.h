// Launchers of the MLP's own CUDA kernels (everything but the matrix
// products, which are cuBLAS). Plain C++ with raw device pointers and a
// stream, callable from .cc files; each launcher checks the launch.
// Shapes: B = rows (samples), OC = columns (units), all row-major.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ps::kernels {

enum Act : int { kActNone = 0, kActRelu = 1, kActSigmoid = 2 };

// y (B, OC), in place: y = act(y + bias); bias (OC).
void bias_act_forward(float* y, const float* bias, int B, int OC, Act act, cudaStream_t stream);

// Rows of partial sums act_backward_bias_grad needs for this shape; the
// scratch it takes must hold bias_grad_partial_rows(..) * OC floats.
int bias_grad_partial_rows(int B, int OC, int sm_count);
constexpr int kMaxBiasGradPartialRows = 512;

// dz (B, OC), in place: dL/dy -> dL/dz = dL/dy * act'(z), with act' computed
// from the activation output y (B, OC) (y unused for kActNone);
// dbias (OC) = sum over rows of dz. Deterministic (no atomics).
void act_backward_bias_grad(float* dz, const float* y, float* dbias, float* partial, int B, int OC,
                            Act act, int sm_count, cudaStream_t stream);

// Softmax + cross-entropy + its gradient, one warp per row.
// logits (B, C); labels (B); row_loss (B) = logsumexp(z) - z[label];
// row_correct (B) = (first arg-max == label). dlogits (B, C) = (softmax(z) -
// onehot) * inv_batch, may alias logits, or be null (no gradient).
void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, float* row_loss,
                  int32_t* row_correct, int B, int C, float inv_batch, cudaStream_t stream);

// Sum of row_loss (in double) and of row_correct over B rows, one block.
struct BatchStats {
  double loss_sum;
  long long correct;
};
void batch_stats(const float* row_loss, const int32_t* row_correct, int B, BatchStats* out,
                 cudaStream_t stream);

// params (n) -= *lr * grads (n); lr is a device pointer so a captured graph
// takes a new learning rate without re-capture.
void sgd_update(float* params, const float* grads, const float* lr, size_t n, cudaStream_t stream);

}  // namespace ps::kernels
