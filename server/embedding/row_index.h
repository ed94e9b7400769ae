// A dynamic table's id -> row slot map: open addressing with linear probing
// in one array of 12-byte entries (id, slot + 1; 0 marks a free entry), at
// most half full, in huge pages (server/embedding/huge_pages.h). A lookup
// touches one cache line, rarely two, and no node per row; the pages of a
// new array come zeroed, so growing needs no fill pass. Positions are keyed
// per index (common/hash_key.h): ids a client picks to collide
// do not. Not thread-safe.
//
//   RowIndex index;
//   index.insert(id, slot);
//   for (i ...) { index.prefetch(ids[i + 16]); uint32_t s = index.find(ids[i]); ... }
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/embedding_placement.h"
#include "server/embedding/huge_pages.h"

namespace ps {

class RowIndex {
 public:
  static constexpr uint32_t kMissing = UINT32_MAX;
  static constexpr std::size_t kEntryBytes = 12;

  RowIndex();
  // The slot of `id`, or kMissing. Inline, with prefetch() and home(): a
  // table request makes one of each per id.
  uint32_t find(uint64_t id) const {
    const uint64_t mask = capacity_ - 1;
    for (uint64_t i = home(id);; i = (i + 1) & mask) {
      const Entry e = entries_[i];
      if (e.slot_plus_one == 0) return kMissing;
      if (e.id == id) return e.slot_plus_one - 1;
    }
  }
  // Asks for the cache line where find(id) starts, so that lookups of ids a
  // few positions on overlap their misses.
  void prefetch(uint64_t id) const { __builtin_prefetch(entries_.get() + home(id)); }
  // Adds `id` (absent) at `slot` (< kMissing - 1); doubles the array at half full.
  void insert(uint64_t id, uint32_t slot);
  // Removes `id` if present (backward-shift deletion: no tombstones).
  void erase(uint64_t id);
  uint64_t size() const { return used_; }
  // Counts inserts and erases (growing moves entries, not slots): a slot
  // found while it is unchanged is still the id's slot.
  uint64_t changes() const { return changes_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t bytes() const { return capacity_ * sizeof(Entry); }
  // How far from its home the farthest entry lies: the longest walk a
  // lookup makes (a scan of the whole array; for tests and diagnostics).
  uint64_t longest_probe() const;
  // Visits the entries at positions [first, first + count) of the array
  // (count <= capacity(), wrapping at its end) and erases each that
  // erase_it(id, slot) returns true for: a sweep over a few positions at a
  // time. An entry an erase moves into a visited position is visited
  // there, so every entry in the range is seen once. Returns the erased count.
  template <typename Fn>
  uint64_t erase_in(uint64_t first, uint64_t count, Fn&& erase_it) {
    uint64_t erased = 0;
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t i = (first + k) & (capacity_ - 1);
      while (entries_[i].slot_plus_one != 0 &&
             erase_it(entries_[i].id, entries_[i].slot_plus_one - 1)) {
        erase_at(i);
        ++erased;
      }
    }
    return erased;
  }
  // fn(id, slot) for every entry, in array order.
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (uint64_t i = 0; i < capacity_; ++i) {
      const Entry e = entries_[i];
      if (e.slot_plus_one != 0) fn(e.id, e.slot_plus_one - 1);
    }
  }

 private:
  struct __attribute__((packed)) Entry {
    uint64_t id;
    uint32_t slot_plus_one;
  };
  static_assert(sizeof(Entry) == kEntryBytes);
  uint64_t home(uint64_t id) const { return mix_id(id ^ key_) & (capacity_ - 1); }
  // Writes e at the first free entry from its id's home (there is one).
  void place(Entry e);
  // Empties position i, moving later entries of its run back (no tombstones).
  void erase_at(uint64_t i);
  void grow();

  std::unique_ptr<Entry[], Unmap> entries_;
  uint64_t capacity_ = 0;  // a power of two
  uint64_t key_;           // this index's hash key (common/hash_key.h)
  uint64_t used_ = 0;
  uint64_t changes_ = 0;
};

}  // namespace ps
