// How often a dynamic table's ids not yet given a row were pushed, for
// admission by count (TableSpec::min_count): a count-min sketch of kRows
// rows of saturating 8-bit counters. An id's count is the least of its
// counters, never below its true count; conservative update raises only the
// counters at that least, which keeps collisions' overcounts small. A sketch
// too small for the ids it sees admits ids early, never late, and its memory
// is fixed whatever ids a client sends.
//
//   CountSketch s(0, random_hash_key());  // kDefaultWidth
//   if (s.count(id) + 1 >= min_count) { /* this push admits id */ }
//   s.add(id);
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace ps {

class CountSketch {
 public:
  static constexpr uint32_t kRows = 4;
  static constexpr uint32_t kMaxCount = 255;
  static constexpr uint32_t kMinWidth = 1u << 6;
  static constexpr uint32_t kDefaultWidth = 1u << 22;  // 16 MiB
  static constexpr uint32_t kMaxWidth = 1u << 28;

  // width: counters per row, rounded up to a power of two (at least
  // kMinWidth; 0: kDefaultWidth). key: the table's hash key
  // (common/hash_key.h), so that ids chosen to collide in one table do not
  // in another.
  CountSketch(uint32_t width, uint64_t key);
  // The width a sketch made with `width` has.
  static uint32_t width_for(uint32_t width);

  uint32_t count(uint64_t id) const;
  void add(uint64_t id);  // one more push of id; saturates at kMaxCount
  uint64_t bytes() const { return counters_.size(); }
  uint32_t width() const { return uint32_t{1} << log2_width_; }
  // For checkpoints: the key and the counters (kRows * width() bytes); a
  // sketch made with the same width and key, given them, counts on.
  uint64_t key() const { return key_; }
  const std::vector<uint8_t>& counters() const { return counters_; }
  void set_counters(std::span<const uint8_t> counters);  // kRows * width() bytes

 private:
  std::array<uint32_t, kRows> cells(uint64_t id) const;  // one counter's index per row
  uint32_t log2_width_;
  uint64_t key_;
  std::vector<uint8_t> counters_;  // row r at [r * width, (r + 1) * width)
};

}  // namespace ps
