// Internal: LogisticMlp's arithmetic (kernels/logistic_mlp_math.cc), built
// once for each CPU ISA as cpu_engine.cc is; LogisticMlp picks one when it
// is made (kernels/cpu_isa.h). The caller has checked the sizes: every
// buffer is as LogisticMlp allocates it.
#pragma once

#include <vector>

#include "ps/mlp.h"

namespace ps::detail {

// LogisticMlp's buffers, as the math sees them.
struct LogisticMlpState {
  const MlpShape& shape;
  const ParamLayout& layout;
  const float* params;                    // (P)
  float* grads;                           // (P)
  std::vector<std::vector<float>>& acts;  // per layer (max_batch, out_l)
  std::vector<float>* dbuf;               // [2] (max_batch, widest hidden)
};

struct LogisticMlpMath {
  // acts[l] (batch, out_l) for x (batch, inputs); the last holds the head's
  // logit plus extra_logit (when not null).
  void (*forward)(const LogisticMlpState& s, const float* x, const float* extra_logit, int batch);
  // After forward: the mean log-loss against labels; grads, and dx and dlogit
  // when not null, become its gradients.
  double (*gradients)(const LogisticMlpState& s, const float* x, const float* labels, int batch,
                      float* dx, float* dlogit);
  // sigmoid(z), as gradients() computes it.
  float (*sigmoid)(float z);
};

LogisticMlpMath logistic_mlp_math_baseline();
LogisticMlpMath logistic_mlp_math_avx2();
LogisticMlpMath logistic_mlp_math_avx512();

}  // namespace ps::detail
