// The first position of each key in a request (ids or slots): an
// open-addressing set sized by the request (at most half full), whose arrays
// are kept from one request to the next, so that finding repeated keys
// allocates nothing and stays in cache however large the table. Positions
// are keyed per set (server/embedding/hash_key.h): keys a client picks to
// collide do not.
//
//   FirstPositions seen;
//   seen.reset(ids.size());
//   for (uint32_t i = 0; i < ids.size(); ++i)
//     if (seen.first(ids[i], i) != i) { /* ids[i] repeats an earlier id */ }
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/embedding_placement.h"
#include "server/embedding/hash_key.h"

namespace ps {

class FirstPositions {
 public:
  // Forgets every key; the next calls may add up to `n` keys. Arrays much
  // larger than `n` needs (one outsized request) are given back.
  void reset(std::size_t n) {
    std::size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    if (keys_.size() > std::max<std::size_t>(4 * capacity, kKeepEntries)) {
      keys_ = {};
      first_ = {};
    }
    keys_.resize(capacity);
    first_.assign(capacity, kNone);
    mask_ = capacity - 1;
  }
  // The position `key` was first added at since reset(); `pos` (and the key
  // is added) if it is new.
  uint32_t first(uint64_t key, uint32_t pos) {
    uint64_t h = mix_id(key ^ hash_key_) & mask_;
    while (first_[h] != kNone && keys_[h] != key) h = (h + 1) & mask_;
    if (first_[h] == kNone) {
      keys_[h] = key;
      first_[h] = pos;
    }
    return first_[h];
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr std::size_t kKeepEntries = std::size_t{1} << 20;  // 12 MiB
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> first_;
  uint64_t mask_ = 0;
  uint64_t hash_key_ = random_hash_key();
};

}  // namespace ps
