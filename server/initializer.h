// Fills a new tensor (or one part of a split tensor) with its initial values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ps/tensor_spec.h"

namespace ps {

// `full_shape` is the shape of the whole logical tensor (Glorot's fans come
// from it); `part_index` decorrelates the random streams of different parts.
// Throws RequestError for a `values` initializer of the wrong length.
void initialize(std::span<float> out, const InitConfig& init, const std::vector<uint64_t>& full_shape,
                uint32_t part_index);

// Throws RequestError (naming tensor `name`) for parameters that would fill
// the tensor with NaN or Inf, or break a distribution's preconditions
// (uniform low > high, a normal's stddev <= 0).
void validate_initializer(const InitConfig& init, const std::string& name);

}  // namespace ps
