// Sigmoid + logistic loss + its gradient for the logistic head's one logit per
// example, and the sigmoid alone for prediction. One block sums the loss of
// the whole batch: batches are small.
#include "kernels/cuda_check.h"
#include "kernels/logistic_loss_kernels.h"

namespace ps::kernels {
namespace {

constexpr int kThreads = 512;

// log(1 + e^z) without overflow.
__device__ double softplus(double z) { return z > 0 ? z + log1p(exp(-z)) : log1p(exp(z)); }

__device__ float sigmoid(float z) {
  return z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
}

__global__ void logistic_loss_kernel(float* logit, const float* __restrict__ extra_logit,
                                     const float* __restrict__ labels, int B, float inv_batch,
                                     double* loss_sum) {
  __shared__ double sums[kThreads];
  double sum = 0.0;
  for (int i = threadIdx.x; i < B; i += blockDim.x) {
    const float z = logit[i] + (extra_logit ? extra_logit[i] : 0.0f);
    const float y = labels[i];
    sum += softplus(z) - static_cast<double>(y) * z;
    logit[i] = (sigmoid(z) - y) * inv_batch;
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum = sums[0];
}

__global__ void logistic_predict_kernel(const float* __restrict__ logit,
                                        const float* __restrict__ extra_logit,
                                        float* __restrict__ probs, int B) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < B) probs[i] = sigmoid(logit[i] + (extra_logit ? extra_logit[i] : 0.0f));
}

}  // namespace

void logistic_loss(float* logit, const float* extra_logit, const float* labels, int B,
                   float inv_batch, double* loss_sum, cudaStream_t stream) {
  logistic_loss_kernel<<<1, kThreads, 0, stream>>>(logit, extra_logit, labels, B, inv_batch,
                                                   loss_sum);
  cudaCheck(cudaGetLastError());
}

void logistic_predict(const float* logit, const float* extra_logit, float* probs, int B,
                      cudaStream_t stream) {
  if (B == 0) return;
  const int block = 256;
  logistic_predict_kernel<<<(B + block - 1) / block, block, 0, stream>>>(logit, extra_logit, probs,
                                                                         B);
  cudaCheck(cudaGetLastError());
}

}  // namespace ps::kernels
