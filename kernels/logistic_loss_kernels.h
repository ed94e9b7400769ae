// Launchers of the logistic head's output kernels (kernels/logistic_loss.cu):
// plain C++ on raw device pointers and a stream, callable from .cc files; each
// checks its launch. Arguments are assumed valid (labels in [0, 1]).
#pragma once

#include <cuda_runtime.h>

namespace ps::kernels {

// For each of the B examples, z = logit + extra_logit (extra_logit may be
// null): *loss_sum (one double) = sum of log(1 + e^z) - label * z, computed
// in double without overflow; logit becomes dL/dz = (sigmoid(z) - label) *
// inv_batch, in place. The formulas are LogisticMlp's on the CPU.
void logistic_loss(float* logit, const float* extra_logit, const float* labels, int B,
                   float inv_batch, double* loss_sum, cudaStream_t stream);

// probs (B) = sigmoid(logit + extra_logit) (extra_logit may be null).
void logistic_predict(const float* logit, const float* extra_logit, float* probs, int B,
                      cudaStream_t stream);

}  // namespace ps::kernels
