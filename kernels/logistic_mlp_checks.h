// Internal: the argument checks LogisticMlp and CudaLogisticMlp share
// (kernels/logistic_mlp.cc), so both refuse the same input with the same
// message. `who` names the class, `what` the class and method, for the message.
#pragma once

#include <cstdint>
#include <span>

#include "ps/mlp.h"

namespace ps::detail {

// Throws ConfigError unless the shape is valid, ends in one logit and max_batch >= 1.
void check_logistic_mlp_config(const MlpShape& shape, int max_batch, const char* who);

// Throws ps::Error unless x holds n examples of shape.inputs and extra_logit
// is empty or holds n.
void check_logistic_mlp_input(const MlpShape& shape, std::span<const float> x, int64_t n,
                              std::span<const float> extra_logit, const char* what);

// Throws ps::Error unless compute_gradients' arguments are good: a batch in
// [1, max_batch], sizes that match, labels in [0, 1].
void check_logistic_mlp_gradients_args(const MlpShape& shape, int max_batch,
                                       std::span<const float> x, std::span<const float> labels,
                                       std::span<const float> extra_logit,
                                       std::span<const float> dx, std::span<const float> dlogit,
                                       const char* what);

}  // namespace ps::detail
