// Launchers of the embedding-bag CUDA kernels: plain C++ on raw device
// pointers and a stream, callable from .cc files; each checks its launch.
// Arguments are assumed valid (ps::detail::check_embedding_bag_args).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ps::kernels {

// out (N, D) = sum (mean when `mean`) over j in [offsets[n], offsets[n+1]) of
// rows (U, D)[index[j]]; offsets (N + 1).
void embedding_bag_gather(const float* rows, const int64_t* offsets, const int32_t* index,
                          float* out, int64_t bags, int dim, bool mean, cudaStream_t stream);

// grad_rows (U, D) += grad_out (N, D)[n] (scaled by 1/size when `mean`) for
// every j of bag n, at row index[j]; atomics, so zero grad_rows first.
void embedding_bag_scatter_add(const float* grad_out, const int64_t* offsets, const int32_t* index,
                               float* grad_rows, int64_t bags, int dim, bool mean,
                               cudaStream_t stream);

}  // namespace ps::kernels
