// Which shard holds an embedding table's id, and at which local row: the one
// function every worker and psd use, so that all agree without talking.
#pragma once

#include <cstdint>

#include "common/fast_divide.h"
#include "ps/embedding.h"

namespace ps {

// A 64-bit finaliser (splitmix64's): neighbouring ids land on unrelated shards.
inline uint64_t mix_id(uint64_t id) {
  id ^= id >> 30;
  id *= 0xbf58476d1ce4e5b9ull;
  id ^= id >> 27;
  id *= 0x94d049bb133111ebull;
  id ^= id >> 31;
  return id;
}

class RowPlacement {
 public:
  // rows: a fixed table's row count (ignored for kHash).
  RowPlacement(TablePlacement kind, uint64_t rows, uint32_t shards)
      : kind_(kind),
        rows_(rows),
        shards_(shards == 0 ? 1 : shards),
        per_(rows / shards_),
        extra_(rows % shards_),
        head_(extra_ * (per_ + 1)),
        by_shards_(shards_),
        by_per_(per_ == 0 ? 1 : per_),
        by_per1_(per_ + 1) {}

  uint32_t shard_of(uint64_t id) const {
    switch (kind_) {
      case TablePlacement::kMod:
        return static_cast<uint32_t>(by_shards_.remainder(id));
      case TablePlacement::kDiv:
        // The first `extra` shards hold one row more: ids below head_ are theirs.
        if (id < head_) return static_cast<uint32_t>(by_per1_.quotient(id));
        return static_cast<uint32_t>(extra_ + (per_ == 0 ? 0 : by_per_.quotient(id - head_)));
      case TablePlacement::kHash:
        return static_cast<uint32_t>(by_shards_.remainder(mix_id(id)));
    }
    return 0;
  }
  // A fixed table's local row of `id` on shard_of(id).
  uint64_t local_row(uint64_t id) const {
    switch (kind_) {
      case TablePlacement::kMod:
        return by_shards_.quotient(id);
      case TablePlacement::kDiv:
        return id - first_id(shard_of(id));
      case TablePlacement::kHash:
        return id;
    }
    return 0;
  }
  // A fixed table's global id of local row `row` on `shard` (the inverse).
  uint64_t global_id(uint32_t shard, uint64_t row) const {
    if (kind_ == TablePlacement::kMod) return row * shards_ + shard;
    if (kind_ == TablePlacement::kDiv) return first_id(shard) + row;
    return row;
  }
  // Rows a fixed table has on `shard`.
  uint64_t rows_on(uint32_t shard) const {
    if (kind_ == TablePlacement::kMod) return rows_ / shards_ + (shard < rows_ % shards_ ? 1 : 0);
    if (kind_ == TablePlacement::kDiv) return per_ + (shard < extra_ ? 1 : 0);
    return 0;
  }
  uint32_t shards() const { return shards_; }

 private:
  uint64_t first_id(uint32_t shard) const {
    return shard < extra_ ? shard * (per_ + 1) : head_ + (shard - extra_) * per_;
  }
  TablePlacement kind_;
  uint64_t rows_;
  uint32_t shards_;
  uint64_t per_, extra_, head_;  // kDiv: rows per shard, shards with one more, their ids
  // Division by shards_, per_ and per_ + 1 without a `div` per id (common/fast_divide.h).
  FastDivider by_shards_, by_per_, by_per1_;
};

}  // namespace ps
