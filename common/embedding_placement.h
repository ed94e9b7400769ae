// Which shard holds an embedding table's id, and at which local row: the one
// function every worker and psd use, so that all agree without talking.
#pragma once

#include <cstdint>

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
      : kind_(kind), rows_(rows), shards_(shards == 0 ? 1 : shards) {}

  uint32_t shard_of(uint64_t id) const {
    switch (kind_) {
      case TablePlacement::kMod:
        return static_cast<uint32_t>(id % shards_);
      case TablePlacement::kDiv: {
        const uint64_t per = rows_ / shards_, extra = rows_ % shards_;
        const uint64_t head = extra * (per + 1);  // ids in the longer first `extra` shards
        if (id < head) return static_cast<uint32_t>(id / (per + 1));
        return static_cast<uint32_t>(extra + (per == 0 ? 0 : (id - head) / per));
      }
      case TablePlacement::kHash:
        return static_cast<uint32_t>(mix_id(id) % shards_);
    }
    return 0;
  }
  // A fixed table's local row of `id` on shard_of(id).
  uint64_t local_row(uint64_t id) const {
    switch (kind_) {
      case TablePlacement::kMod:
        return id / shards_;
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
    if (kind_ == TablePlacement::kMod)
      return shard < rows_ ? (rows_ - shard + shards_ - 1) / shards_ : 0;
    if (kind_ == TablePlacement::kDiv) return rows_ / shards_ + (shard < rows_ % shards_ ? 1 : 0);
    return 0;
  }
  uint32_t shards() const { return shards_; }

 private:
  uint64_t first_id(uint32_t shard) const {
    const uint64_t per = rows_ / shards_, extra = rows_ % shards_;
    return shard < extra ? shard * (per + 1) : extra * (per + 1) + (shard - extra) * per;
  }
  TablePlacement kind_;
  uint64_t rows_;
  uint32_t shards_;
};

}  // namespace ps
