// Ids chosen to collide in a hash table that places them by
// mix_id(id ^ key) with a known key: what a hostile client could send if
// psd's tables used a fixed key (common/hash_key.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/embedding_placement.h"

namespace ps::test {

// The inverse of mix_id (each xor-shift and multiply undone), to choose ids
// that collide under a fixed key.
inline uint64_t inverse_of_odd(uint64_t a) {
  uint64_t x = a;  // Newton's iteration: correct to 3, 6, 12, 24, 48, 96 bits
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}
inline uint64_t unmix_id(uint64_t h) {
  h ^= (h >> 31) ^ (h >> 62);
  h *= inverse_of_odd(0x94d049bb133111ebull);
  h ^= (h >> 27) ^ (h >> 54);
  h *= inverse_of_odd(0xbf58476d1ce4e5b9ull);
  h ^= (h >> 30) ^ (h >> 60);
  return h;
}

// n ids whose mix_id(id ^ key) agree in their low 32 bits: one home in any
// table under 2^32 entries that hashes them with `key`.
inline std::vector<uint64_t> colliding_ids(std::size_t n, uint64_t key) {
  std::vector<uint64_t> ids(n);
  for (std::size_t k = 0; k < n; ++k) ids[k] = unmix_id(uint64_t(k + 1) << 32) ^ key;
  return ids;
}

}  // namespace ps::test
