// 64 bits from the kernel's entropy (std::random_device), for ids that must
// differ between processes and runs: request ids, reply tags, psd's instance.
#pragma once

#include <cstdint>
#include <random>

namespace ps {

inline uint64_t random_u64() {
  std::random_device rd;
  return uint64_t{rd()} << 32 | rd();
}

}  // namespace ps
