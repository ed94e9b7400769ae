// The first position of each key in a request (ids or slots): an
// open-addressing set sized by the request (at most half full), whose arrays
// are kept from one request to the next, so that finding repeated keys
// allocates nothing and stays in cache however large the table. Positions
// are keyed per set (common/hash_key.h): keys a client picks to
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
#include <span>
#include <vector>

#include "common/embedding_placement.h"
#include "common/hash_key.h"

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
    size_ = 0;
  }
  // Forgets every key, keeping the arrays (a set refilled to about the same
  // size again and again, as a sync step's ids).
  void clear() {
    std::fill(first_.begin(), first_.end(), kNone);
    size_ = 0;
  }
  // Room for `more` keys beyond those held: the arrays grow (the keys held
  // placed anew) to keep the set at most half full.
  void reserve(std::size_t more) {
    const std::size_t capacity = capacity_for(more);
    if (capacity == first_.size()) return;
    std::vector<uint64_t> keys(capacity);
    std::vector<uint32_t> first(capacity, kNone);
    const uint64_t mask = capacity - 1;
    for (std::size_t i = 0; i < first_.size(); ++i) {
      if (first_[i] == kNone) continue;
      uint64_t h = mix_id(keys_[i] ^ hash_key_) & mask;
      while (first[h] != kNone) h = (h + 1) & mask;
      keys[h] = keys_[i];
      first[h] = first_[i];
    }
    keys_.swap(keys);
    first_.swap(first);
    mask_ = mask;
  }
  std::size_t size() const { return size_; }
  // What bytes() would be after reserve(more).
  std::size_t bytes_after_reserve(std::size_t more) const {
    const std::size_t capacity = capacity_for(more);
    return capacity == first_.size() ? bytes() : capacity * (sizeof(uint64_t) + sizeof(uint32_t));
  }
  std::size_t bytes() const {  // memory held
    return keys_.capacity() * sizeof(uint64_t) + first_.capacity() * sizeof(uint32_t);
  }
  bool contains(uint64_t key) const {
    if (first_.empty()) return false;
    uint64_t h = mix_id(key ^ hash_key_) & mask_;
    while (first_[h] != kNone && keys_[h] != key) h = (h + 1) & mask_;
    return first_[h] != kNone;
  }
  // The position `key` was first added at since reset() or clear(); `pos`
  // (and the key is added) if it is new. Call within the room reset() or
  // reserve() made.
  uint32_t first(uint64_t key, uint32_t pos) {
    uint64_t h = mix_id(key ^ hash_key_) & mask_;
    while (first_[h] != kNone && keys_[h] != key) h = (h + 1) & mask_;
    if (first_[h] == kNone) {
      keys_[h] = key;
      first_[h] = pos;
      ++size_;
    }
    return first_[h];
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  // The arrays' size that holds `more` keys beyond those held at most half full.
  std::size_t capacity_for(std::size_t more) const {
    if (2 * (size_ + more) <= first_.size()) return first_.size();
    std::size_t capacity = std::max<std::size_t>(16, first_.size());
    while (capacity < 2 * (size_ + more)) capacity *= 2;
    return capacity;
  }
  static constexpr std::size_t kKeepEntries = std::size_t{1} << 20;  // 12 MiB
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> first_;
  uint64_t mask_ = 0;
  std::size_t size_ = 0;  // keys held
  uint64_t hash_key_ = random_hash_key();
};

// The distinct keys of `keys` in order of first appearance, into `unique`
// (cleared first), and for each position j the index of keys[j] among them,
// into index[j] (keys.size() entries; fewer than 2^32 keys): a batch's ids
// deduplicated, as a table pulls them once. `seen` is the caller's, kept
// between calls so that a batch like the one before allocates nothing.
template <class Index>
void distinct_keys(std::span<const uint64_t> keys, FirstPositions& seen,
                   std::vector<uint64_t>& unique, Index* index) {
  unique.clear();
  seen.reset(keys.size());
  for (std::size_t j = 0; j < keys.size(); ++j) {
    const auto next = static_cast<uint32_t>(unique.size());
    const uint32_t at = seen.first(keys[j], next);
    if (at == next) unique.push_back(keys[j]);
    index[j] = static_cast<Index>(at);
  }
}

}  // namespace ps
