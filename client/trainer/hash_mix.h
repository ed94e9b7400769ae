// 64-bit mixing (splitmix64's finalizer): a bijection of uint64 whose output
// bits each depend on every input bit. The CTR feature hashes and the
// synthetic generator are built on it, so it must never change.
#pragma once

#include <cstdint>

namespace ps::detail {

constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from 53 bits of h.
inline double unit_double(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace ps::detail
