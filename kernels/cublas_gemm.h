// Internal: the matrix products of a row-major MLP layer on cuBLAS, for the
// CUDA engine and the CUDA logistic head. One handle bound to one stream, with
// a workspace of its own (so products captured into a CUDA graph allocate
// nothing) and FP32 or TF32 tensor-core math. Throws ps::Error on a failure.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace ps::detail {

class CublasGemm {
 public:
  CublasGemm(cudaStream_t stream, bool tf32);
  ~CublasGemm();  // errors ignored
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // Y (B, out) = X (B, in) · W (in, out).
  void forward(const float* X, const float* W, float* Y, int B, int in, int out);
  // dW (in, out) = X^T (in, B) · dZ (B, out).
  void weight_grad(const float* X, const float* dZ, float* dW, int B, int in, int out);
  // dX (B, in) = dZ (B, out) · W^T (out, in).
  void input_grad(const float* dZ, const float* W, float* dX, int B, int in, int out);

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace ps::detail
