// Keys for psd's own hash tables of ids a client chooses (a dynamic table's
// index, a request's repeated ids, a sync step's sums per id). Their positions come from mix_id, which
// is public and invertible: with a fixed key a client could pick ids that
// all land on one entry, and every insert and lookup of them would walk the
// whole cluster (quadratic work from one request, a slow table for good).
// Each table draws its own key, so ids chosen against one layout land apart
// in any other. A defence against chosen collisions, not a cryptographic
// hash; fuzzing builds use a fixed key, so that a run can be replayed.
//
//   const uint64_t key = random_hash_key();
//   const uint64_t home = mix_id(id ^ key) & (capacity - 1);
#pragma once

#include <cstdint>
#include <random>

namespace ps {

inline uint64_t random_hash_key() {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  return 0x5bd1e995u;
#else
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
#endif
}

}  // namespace ps
