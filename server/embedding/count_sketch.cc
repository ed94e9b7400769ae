#include "server/embedding/count_sketch.h"

#include <algorithm>

#include "common/embedding_placement.h"

namespace ps {

CountSketch::CountSketch(uint32_t width, uint64_t key)
    : width_(width == 0 ? kDefaultWidth : width),
      key_(key),
      counters_(std::size_t(kRows) * width_, 0) {}

std::array<uint32_t, CountSketch::kRows> CountSketch::cells(uint64_t id) const {
  // Two independent 64-bit hashes, combined per row (Kirsch-Mitzenmacher),
  // each mapped onto [0, width) by a multiply rather than a division.
  const uint64_t h1 = mix_id(id ^ key_), h2 = mix_id(h1 ^ 0x9e3779b97f4a7c15ull) | 1;
  std::array<uint32_t, kRows> at{};
  for (uint32_t r = 0; r < kRows; ++r) {
    const uint64_t h = h1 + r * h2;
    at[r] = r * width_ + static_cast<uint32_t>(((h >> 32) * width_) >> 32);
  }
  return at;
}

uint32_t CountSketch::count(uint64_t id) const {
  uint32_t least = kMaxCount;
  for (uint32_t c : cells(id)) least = std::min<uint32_t>(least, counters_[c]);
  return least;
}

void CountSketch::add(uint64_t id) {
  const auto at = cells(id);
  uint32_t least = kMaxCount;
  for (uint32_t c : at) least = std::min<uint32_t>(least, counters_[c]);
  if (least == kMaxCount) return;
  for (uint32_t c : at) {
    if (counters_[c] == least) counters_[c] = static_cast<uint8_t>(least + 1);
  }
}

}  // namespace ps
