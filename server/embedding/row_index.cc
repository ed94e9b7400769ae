#include "server/embedding/row_index.h"

#include <algorithm>

#include "common/hash_key.h"

namespace ps {

RowIndex::RowIndex()
    : entries_(map_array_of<Entry>(1024)), capacity_(1024), key_(random_hash_key()) {}

uint64_t RowIndex::longest_probe() const {
  uint64_t longest = 0;
  for (uint64_t i = 0; i < capacity_; ++i) {
    if (entries_[i].slot_plus_one != 0)
      longest = std::max(longest, (i - home(entries_[i].id)) & (capacity_ - 1));
  }
  return longest;
}

void RowIndex::place(Entry e) {
  const uint64_t mask = capacity_ - 1;
  uint64_t i = home(e.id);
  while (entries_[i].slot_plus_one != 0) i = (i + 1) & mask;
  entries_[i] = e;
}

void RowIndex::insert(uint64_t id, uint32_t slot) {
  if ((used_ + 1) * 2 > capacity_) grow();
  place(Entry{id, slot + 1});
  ++used_;
  ++changes_;
}

void RowIndex::grow() {
  auto old = std::move(entries_);
  const uint64_t old_capacity = capacity_;
  entries_ = map_array_of<Entry>(capacity_ * 2);
  capacity_ *= 2;
  for (uint64_t k = 0; k < old_capacity; ++k) {
    if (old[k].slot_plus_one != 0) place(old[k]);
  }
}

void RowIndex::erase(uint64_t id) {
  const uint64_t mask = capacity_ - 1;
  uint64_t i = home(id);
  for (;; i = (i + 1) & mask) {
    if (entries_[i].slot_plus_one == 0) return;
    if (entries_[i].id == id) break;
  }
  erase_at(i);
}

void RowIndex::erase_at(uint64_t i) {
  const uint64_t mask = capacity_ - 1;
  entries_[i].slot_plus_one = 0;
  --used_;
  ++changes_;
  for (uint64_t j = (i + 1) & mask; entries_[j].slot_plus_one != 0; j = (j + 1) & mask) {
    const uint64_t h = home(entries_[j].id);
    // Entry j may move to the hole at i if its home is not in (i, j].
    const bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
    if (stays) continue;
    entries_[i] = entries_[j];
    entries_[j].slot_plus_one = 0;
    i = j;
  }
}

}  // namespace ps
