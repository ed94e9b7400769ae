// Rows of an embedding table copied with their size known to the compiler.
//
//   with_row_bytes(dim * sizeof(float), [&](auto bytes) {
//     for (i ...) std::memcpy(dst + i * dim, src_of(i), bytes);  // inline moves
//   });
//
// A memcpy of a constant size is a few vector moves in place; of a runtime
// size it is a library call, which psd's gather and the client's scatter
// would pay for every row (docs/embedding.md, "What makes it fast").
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace ps {

// Calls fn(bytes) with bytes as a std::integral_constant for the usual row
// sizes (8, 16, 32 or 64 floats), else as the std::size_t itself.
template <class Fn>
inline void with_row_bytes(std::size_t bytes, Fn&& fn) {
  const bool usual = [&]<std::size_t... kBytes>(std::index_sequence<kBytes...>) {
    return ((bytes == kBytes && (fn(std::integral_constant<std::size_t, kBytes>{}), true)) || ...);
  }
  (std::index_sequence<32, 64, 128, 256>{});
  if (!usual) fn(bytes);
}

// Asks for the `bytes` of a row at p a cache line at a time (kWrite: with
// the intent to write it), so that its misses overlap work on other rows.
enum class RowAccess { kRead, kWrite };
template <RowAccess kAccess = RowAccess::kRead>
inline void prefetch_row(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (std::size_t b = 0; b < bytes; b += 64)
    __builtin_prefetch(c + b, kAccess == RowAccess::kWrite);
}

}  // namespace ps
