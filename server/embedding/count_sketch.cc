#include "server/embedding/count_sketch.h"

#include <algorithm>
#include <bit>

#include "common/embedding_placement.h"
#include "ps/errors.h"

namespace ps {

uint32_t CountSketch::width_for(uint32_t width) {
  if (width == 0) return kDefaultWidth;
  return std::bit_ceil(std::clamp(width, kMinWidth, kMaxWidth));
}

CountSketch::CountSketch(uint32_t width, uint64_t key)
    : log2_width_(static_cast<uint32_t>(std::countr_zero(width_for(width)))),
      key_(key),
      counters_(std::size_t(kRows) << log2_width_, 0) {}

std::array<uint32_t, CountSketch::kRows> CountSketch::cells(uint64_t id) const {
  // Two independent 64-bit hashes, combined per row (Kirsch-Mitzenmacher);
  // a row's counter is the top log2(width) bits.
  const uint64_t h1 = mix_id(id ^ key_), h2 = mix_id(h1 ^ 0x9e3779b97f4a7c15ull) | 1;
  std::array<uint32_t, kRows> at{};
  for (uint32_t r = 0; r < kRows; ++r) {
    const uint64_t h = h1 + r * h2;
    at[r] = (r << log2_width_) + static_cast<uint32_t>(h >> (64 - log2_width_));
  }
  return at;
}

void CountSketch::set_counters(std::span<const uint8_t> counters) {
  if (counters.size() != counters_.size()) {
    throw RequestError("count sketch: " + std::to_string(counters.size()) +
                       " counters for a sketch of " + std::to_string(counters_.size()));
  }
  std::copy(counters.begin(), counters.end(), counters_.begin());
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
