// Embedding-bag gather (forward) and scatter-add (backward): one thread per
// (bag, column), so a warp reads consecutive floats of a row.
#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/embedding_bag_kernels.h"

namespace ps::kernels {
namespace {

constexpr int kBlock = 256;

int grid_for(int64_t threads) {
  return static_cast<int>(std::min<int64_t>((threads + kBlock - 1) / kBlock, 65535));
}

// out (N, D); rows (U, D); offsets (N + 1); index (nnz).
__global__ void gather_kernel(const float* __restrict__ rows, const int64_t* __restrict__ offsets,
                              const int32_t* __restrict__ index, float* __restrict__ out,
                              int64_t bags, int dim, bool mean) {
  const int64_t total = bags * dim;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = t / dim;
    const int d = static_cast<int>(t - n * dim);
    const int64_t begin = offsets[n], end = offsets[n + 1];
    float sum = 0.0f;
    for (int64_t j = begin; j < end; ++j) sum += rows[static_cast<int64_t>(index[j]) * dim + d];
    if (mean && end > begin) sum /= static_cast<float>(end - begin);
    out[t] = sum;
  }
}

// grad_rows (U, D) += scaled grad_out (N, D) rows, at each occurrence's row.
__global__ void scatter_add_kernel(const float* __restrict__ grad_out,
                                   const int64_t* __restrict__ offsets,
                                   const int32_t* __restrict__ index, float* __restrict__ grad_rows,
                                   int64_t bags, int dim, bool mean) {
  const int64_t total = bags * dim;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = t / dim;
    const int d = static_cast<int>(t - n * dim);
    const int64_t begin = offsets[n], end = offsets[n + 1];
    if (end == begin) continue;
    const float g = mean ? grad_out[t] / static_cast<float>(end - begin) : grad_out[t];
    for (int64_t j = begin; j < end; ++j)
      atomicAdd(&grad_rows[static_cast<int64_t>(index[j]) * dim + d], g);
  }
}

}  // namespace

void embedding_bag_gather(const float* rows, const int64_t* offsets, const int32_t* index,
                          float* out, int64_t bags, int dim, bool mean, cudaStream_t stream) {
  if (bags == 0) return;
  gather_kernel<<<grid_for(bags * dim), kBlock, 0, stream>>>(rows, offsets, index, out, bags, dim,
                                                             mean);
  cudaCheck(cudaGetLastError());
}

void embedding_bag_scatter_add(const float* grad_out, const int64_t* offsets, const int32_t* index,
                               float* grad_rows, int64_t bags, int dim, bool mean,
                               cudaStream_t stream) {
  if (bags == 0) return;
  scatter_add_kernel<<<grid_for(bags * dim), kBlock, 0, stream>>>(grad_out, offsets, index,
                                                                  grad_rows, bags, dim, mean);
  cudaCheck(cudaGetLastError());
}

}  // namespace ps::kernels
