// Fills a new tensor (or one part of a split tensor) with its initial values.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ps/tensor_spec.h"

namespace ps {

// `full_shape` is the shape of the whole logical tensor (Glorot's fans come
// from it); `part_index` decorrelates the random streams of different parts.
// Throws RequestError for a `values` initializer of the wrong length.
void initialize(std::span<float> out, const InitConfig& init, const std::vector<uint64_t>& full_shape,
                uint32_t part_index);

}  // namespace ps
