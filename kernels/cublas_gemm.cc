// CublasGemm: row-major products through cuBLAS's column-major API. A
// row-major (r, c) matrix is its column-major transpose (c, r), so every
// product is computed transposed: Y^T = W^T · X^T and so on, W first.
#include "kernels/cublas_gemm.h"

#include "kernels/cuda_check.h"

namespace ps::detail {
namespace {
constexpr size_t kWorkspaceBytes = 32u << 20;
}

CublasGemm::CublasGemm(cudaStream_t stream, bool tf32) {
  try {
    cublasCheck(cublasCreate(&handle_));
    cublasCheck(cublasSetStream(handle_, stream));  // resets the workspace: set it after
    cudaCheck(cudaMalloc(&workspace_, kWorkspaceBytes));
    cublasCheck(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
    cublasCheck(
        cublasSetMathMode(handle_, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  } catch (...) {
    if (handle_) cublasDestroy(handle_);
    cudaFree(workspace_);
    throw;
  }
}

CublasGemm::~CublasGemm() {
  cublasDestroy(handle_);
  cudaFree(workspace_);
}

// Y^T (out, B) = W^T (out, in) · X^T (in, B): no transposes.
void CublasGemm::forward(const float* X, const float* W, float* Y, int B, int in, int out) {
  const float one = 1.0f, zero = 0.0f;
  cublasCheck(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, out, B, in, &one, W, out, X, in, &zero,
                          Y, out));
}

// dW^T (out, in) = dZ^T (out, B) · X (B, in).
void CublasGemm::weight_grad(const float* X, const float* dZ, float* dW, int B, int in, int out) {
  const float one = 1.0f, zero = 0.0f;
  cublasCheck(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, B, &one, dZ, out, X, in,
                          &zero, dW, out));
}

// dX^T (in, B) = W (in, out) · dZ^T (out, B).
void CublasGemm::input_grad(const float* dZ, const float* W, float* dX, int B, int in, int out) {
  const float one = 1.0f, zero = 0.0f;
  cublasCheck(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, in, B, out, &one, W, out, dZ, out,
                          &zero, dX, in));
}

}  // namespace ps::detail
