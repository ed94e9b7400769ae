// Bias + activation, forward (fused) and backward (activation derivative fused
// with the bias-gradient reduction).
#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/mlp_kernels.h"

namespace ps::kernels {
namespace {

__device__ __forceinline__ float activate(float v, int act) {
  if (act == kActRelu) return v > 0.0f ? v : 0.0f;
  if (act == kActSigmoid) return 1.0f / (1.0f + expf(-v));
  return v;
}

// y (B, OC) = act(y + bias); one thread per element, grid-stride. Index is
// 32-bit whenever B * OC allows: the column (i % OC) costs far less then.
template <typename Index>
__global__ void bias_act_forward_kernel(float* y, const float* __restrict__ bias, Index n, Index OC,
                                        int act) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    y[i] = activate(y[i] + bias[i % OC], act);
  }
}

constexpr int kTileCols = 32;  // threadIdx.x: one column each, a warp reads 128 contiguous bytes
constexpr int kTileRows = 8;   // threadIdx.y: rows strided by 8

// Block (x, y) handles columns [32x, 32x+32) of rows [y*rows_per_block, ...):
// applies act' to dz in place and writes the column sums of its rows to
// partial[blockIdx.y * OC + col].
__global__ void act_backward_partial_kernel(float* dz, const float* __restrict__ y, float* partial,
                                            int B, int OC, int act, int rows_per_block) {
  __shared__ float sums[kTileRows][kTileCols + 1];
  const int col = blockIdx.x * kTileCols + threadIdx.x;
  const int row_begin = blockIdx.y * rows_per_block;
  const int row_end = min(B, row_begin + rows_per_block);
  float sum = 0.0f;
  if (col < OC) {
#pragma unroll 4
    for (int r = row_begin + threadIdx.y; r < row_end; r += kTileRows) {
      const size_t i = static_cast<size_t>(r) * OC + col;
      float g = dz[i];
      if (act == kActRelu) {
        g = y[i] > 0.0f ? g : 0.0f;
        dz[i] = g;
      } else if (act == kActSigmoid) {
        const float s = y[i];
        g *= s * (1.0f - s);
        dz[i] = g;
      }
      sum += g;
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float total = 0.0f;
    for (int k = 0; k < kTileRows; ++k) total += sums[k][threadIdx.x];
    partial[static_cast<size_t>(blockIdx.y) * OC + col] = total;
  }
}

// dbias (OC) = sum over rows of partial (rows, OC).
__global__ void sum_partials_kernel(const float* __restrict__ partial, float* dbias, int rows,
                                    int OC) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float total = 0.0f;
  for (int r = 0; r < rows; ++r) total += partial[static_cast<size_t>(r) * OC + col];
  dbias[col] = total;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace

void bias_act_forward(float* y, const float* bias, int B, int OC, Act act, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * OC;
  if (n == 0) return;
  const int block = 256;
  const int grid = static_cast<int>(std::min<size_t>((n + block - 1) / block, 65536));
  if (n < (1u << 31)) {
    bias_act_forward_kernel<unsigned>
        <<<grid, block, 0, stream>>>(y, bias, static_cast<unsigned>(n), OC, act);
  } else {
    bias_act_forward_kernel<size_t>
        <<<grid, block, 0, stream>>>(y, bias, n, static_cast<size_t>(OC), act);
  }
  cudaCheck(cudaGetLastError());
}

int bias_grad_partial_rows(int B, int OC, int sm_count) {
  // Enough blocks to fill the GPU several times over, at least 32 rows each.
  const int col_tiles = ceil_div(OC, kTileCols);
  int rows = std::min(ceil_div(B, 32), std::max(1, 8 * sm_count / col_tiles));
  rows = std::clamp(rows, 1, kMaxBiasGradPartialRows);
  const int rows_per_block = ceil_div(B, rows);
  return ceil_div(B, rows_per_block);
}

void act_backward_bias_grad(float* dz, const float* y, float* dbias, float* partial, int B, int OC,
                            Act act, int sm_count, cudaStream_t stream) {
  const int rows = bias_grad_partial_rows(B, OC, sm_count);
  const int rows_per_block = ceil_div(B, rows);
  const dim3 grid(ceil_div(OC, kTileCols), rows);
  const dim3 block(kTileCols, kTileRows);
  // One row of blocks writes the bias gradient directly.
  act_backward_partial_kernel<<<grid, block, 0, stream>>>(dz, y, rows == 1 ? dbias : partial, B, OC,
                                                          act, rows_per_block);
  cudaCheck(cudaGetLastError());
  if (rows > 1) {
    sum_partials_kernel<<<ceil_div(OC, 256), 256, 0, stream>>>(partial, dbias, rows, OC);
    cudaCheck(cudaGetLastError());
  }
}

}  // namespace ps::kernels
