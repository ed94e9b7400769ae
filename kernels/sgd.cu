// Plain SGD on the flat parameter vector.
#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/mlp_kernels.h"

namespace ps::kernels {
namespace {

// params (n) -= *lr * grads (n), grid-stride.
__global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                           const float* __restrict__ lr, size_t n) {
  const float rate = *lr;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    params[i] -= rate * grads[i];
  }
}

}  // namespace

void sgd_update(float* params, const float* grads, const float* lr, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int block = 256;
  const int grid = static_cast<int>(std::min<size_t>((n + block - 1) / block, 4096));
  sgd_kernel<<<grid, block, 0, stream>>>(params, grads, lr, n);
  cudaCheck(cudaGetLastError());
}

}  // namespace ps::kernels
