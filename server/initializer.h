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
void initialize(std::span<float> out, const InitConfig& init,
                const std::vector<uint64_t>& full_shape, uint32_t part_index);

// Throws RequestError (naming tensor `name`) for parameters that would fill
// the tensor with NaN or Inf, or break a distribution's preconditions
// (uniform low > high, a normal's stddev <= 0, a Glorot scale that is not
// a finite float > 0 for `full_shape`).
void validate_initializer(const InitConfig& init, const std::string& name,
                          const std::vector<uint64_t>& full_shape);

// fan_in + fan_out of Glorot initialisation (ps::glorot_fans), counted in
// double: their sum in 64-bit integers wraps for the largest shapes (to 0
// for [2^64 - 1, 1], which made the scale Inf and the values NaN).
double glorot_fan_sum(const std::vector<uint64_t>& full_shape);

}  // namespace ps
