// Copying one embedding row of `dim` floats. Gathers and scatters copy tens
// of thousands of short rows per batch; a row whose size is a multiple of 32
// bytes (dim % 8 == 0, the usual case) is copied inline in 32-byte steps
// rather than through a library call per row.
//
//   for (std::size_t i = 0; i < n; ++i) copy_row(out + i * dim, table + rows[i] * dim, dim);
#pragma once

#include <cstdint>
#include <cstring>

namespace ps {

// dst and src must not overlap.
inline void copy_row(float* __restrict dst, const float* __restrict src, uint32_t dim) {
  if (dim % 8 == 0) {
    for (uint32_t j = 0; j < dim; j += 8) __builtin_memcpy(dst + j, src + j, 32);
  } else {
    std::memcpy(dst, src, std::size_t(dim) * sizeof(float));
  }
}

}  // namespace ps
