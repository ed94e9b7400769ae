#include "common/net/shared_arena.h"

namespace ps {

SharedArena::SharedArena(std::shared_ptr<SharedRegion> region, uint32_t id)
    : region_(std::move(region)), id_(id) {
  const uint64_t usable = region_->size() / kAlign * kAlign;
  if (usable > 0) free_.emplace(0, usable);
}

std::optional<uint64_t> SharedArena::allocate(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  const uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + need, rest);
    used_.emplace(offset, need);
    in_use_ += need;
    return offset;
  }
  return std::nullopt;
}

void SharedArena::release(uint64_t offset) {
  auto it = used_.find(offset);
  if (it == used_.end()) return;
  uint64_t start = offset;
  uint64_t bytes = it->second;
  in_use_ -= bytes;
  used_.erase(it);
  // Merge with the free neighbours on both sides.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, bytes);
}

std::optional<uint64_t> SharedBlocks::take(uint64_t bytes) {
  auto offset = arena_->allocate(bytes);
  if (offset) taken_.emplace_back(*offset, bytes);
  return offset;
}

SharedBlocks::~SharedBlocks() {
  for (auto [offset, bytes] : taken_) {
    if (answered_) {
      arena_->release(offset);
    } else {
      arena_->note_lost(bytes);
    }
  }
}

}  // namespace ps
