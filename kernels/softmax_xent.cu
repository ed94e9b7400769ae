// Softmax + cross-entropy + its gradient (fused), and the batch reduction of
// loss and accuracy.
#include <cfloat>
#include <climits>

#include "kernels/cuda_check.h"
#include "kernels/mlp_kernels.h"

namespace ps::kernels {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// One warp per row. logits (B, C), labels (B) -> row_loss (B), row_correct (B),
// dlogits (B, C) (may alias logits, or be null).
__global__ void softmax_xent_kernel(const float* logits, const int32_t* __restrict__ labels,
                                    float* dlogits, float* __restrict__ row_loss,
                                    int32_t* __restrict__ row_correct, int B, int C,
                                    float inv_batch) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= B) return;  // the whole warp leaves together
  const float* z = logits + static_cast<size_t>(row) * C;

  // Max and first arg-max (ties: the smallest index, as the CPU engine).
  float zmax = -FLT_MAX;
  int argmax = INT_MAX;
  for (int j = lane; j < C; j += 32) {
    const float v = z[j];
    if (v > zmax || argmax == INT_MAX) {
      zmax = v;
      argmax = j;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(kFullMask, zmax, offset);
    const int other_i = __shfl_xor_sync(kFullMask, argmax, offset);
    if (other > zmax || (other == zmax && other_i < argmax)) {
      zmax = other;
      argmax = other_i;
    }
  }
  float sum = 0.0f;
  for (int j = lane; j < C; j += 32) sum += expf(z[j] - zmax);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullMask, sum, offset);

  const int label = labels[row];
  const bool valid = label >= 0 && label < C;
  const float z_label = valid ? z[label] : 0.0f;
  __syncwarp();  // every lane has read z before any lane overwrites it (dlogits == logits)
  if (lane == 0) {
    row_loss[row] = valid ? zmax + logf(sum) - z_label : __int_as_float(0x7fc00000);  // NaN
    row_correct[row] = argmax == label ? 1 : 0;
  }
  if (dlogits) {
    const float scale = inv_batch / sum;
    float* dz = dlogits + static_cast<size_t>(row) * C;
    for (int j = lane; j < C; j += 32) {
      float p = expf(z[j] - zmax) * scale;
      if (j == label) p -= inv_batch;
      dz[j] = p;
    }
  }
}

constexpr int kStatsThreads = 512;

__global__ void batch_stats_kernel(const float* __restrict__ row_loss,
                                   const int32_t* __restrict__ row_correct, int B,
                                   BatchStats* out) {
  __shared__ double loss_s[kStatsThreads];
  __shared__ long long correct_s[kStatsThreads];
  double loss = 0.0;
  long long correct = 0;
  for (int i = threadIdx.x; i < B; i += blockDim.x) {
    loss += row_loss[i];
    correct += row_correct[i];
  }
  loss_s[threadIdx.x] = loss;
  correct_s[threadIdx.x] = correct;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      loss_s[threadIdx.x] += loss_s[threadIdx.x + stride];
      correct_s[threadIdx.x] += correct_s[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out->loss_sum = loss_s[0];
    out->correct = correct_s[0];
  }
}

}  // namespace

void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, float* row_loss,
                  int32_t* row_correct, int B, int C, float inv_batch, cudaStream_t stream) {
  if (B == 0) return;
  const int warps_per_block = 8;
  const int grid = (B + warps_per_block - 1) / warps_per_block;
  softmax_xent_kernel<<<grid, warps_per_block * 32, 0, stream>>>(logits, labels, dlogits, row_loss,
                                                                 row_correct, B, C, inv_batch);
  cudaCheck(cudaGetLastError());
}

void batch_stats(const float* row_loss, const int32_t* row_correct, int B, BatchStats* out,
                 cudaStream_t stream) {
  batch_stats_kernel<<<1, kStatsThreads, 0, stream>>>(row_loss, row_correct, B, out);
  cudaCheck(cudaGetLastError());
}

}  // namespace ps::kernels
