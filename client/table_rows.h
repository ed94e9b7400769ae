// What libpsclient's table calls share before they send: a table's
// placement over the shards, the ids a fixed table can have (refused before
// anything goes), and how many ids fit one request.
//
//   check_ids(spec, ids, "push_rows");   // throws RequestError naming the id
//   RowPlan plan = plan_rows(as_unsigned(ids), placement_of(spec, shards),
//                            ids_per_request(max_bytes, spec.dim), sync);
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/embedding_placement.h"
#include "ps/embedding.h"
#include "ps/errors.h"

namespace ps {

inline std::span<const uint64_t> as_unsigned(std::span<const int64_t> ids) {
  return {reinterpret_cast<const uint64_t*>(ids.data()), ids.size()};
}

inline RowPlacement placement_of(const TableSpec& spec, uint32_t shards) {
  return RowPlacement(spec.dynamic ? TablePlacement::kHash : spec.placement, spec.rows, shards);
}

// Ids a fixed table cannot have are refused before anything is sent.
inline void check_ids(const TableSpec& spec, std::span<const int64_t> ids, const char* what) {
  if (spec.dynamic) return;
  for (int64_t id : ids) {
    if (id < 0 || static_cast<uint64_t>(id) >= spec.rows) {
      throw RequestError(std::string(what) + ": id " + std::to_string(id) + " is outside table '" +
                         spec.name + "' of " + std::to_string(spec.rows) +
                         " rows (nothing was sent)");
    }
  }
}

// A restore of `ids` into a dynamic table with a row limit: the limit is
// per shard, and rows restored past it would be lost (evicted by the
// restore's own later rows, or refused after earlier ones were set). Refused
// whole before anything is sent when a shard of `shards` would get more of
// them than the limit (ConfigError naming the table, shard and counts).
inline void check_restore_fits(const TableSpec& spec, std::span<const int64_t> ids, uint32_t shards,
                               const char* what) {
  if (!spec.dynamic || spec.row_limit == 0 || ids.size() <= spec.row_limit) return;
  const RowPlacement place = placement_of(spec, shards);
  std::vector<uint64_t> per_shard(shards == 0 ? 1 : shards);
  for (int64_t id : ids) ++per_shard[place.shard_of(static_cast<uint64_t>(id))];
  for (uint32_t s = 0; s < per_shard.size(); ++s) {
    if (per_shard[s] <= spec.row_limit) continue;
    throw ConfigError(std::string(what) + ": table '" + spec.name + "' would hold " +
                      std::to_string(per_shard[s]) + " rows on shard " + std::to_string(s) +
                      " of " + std::to_string(per_shard.size()) + ", over its row limit of " +
                      std::to_string(spec.row_limit) +
                      " (the limit is per shard: restore into more shards or raise row_limit); "
                      "nothing was restored");
  }
}

// Ids per request: a request's ids and rows fit the request size.
inline uint32_t ids_per_request(uint64_t max_batch_bytes, uint32_t dim) {
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(max_batch_bytes / (uint64_t(dim) * sizeof(float) + 8), 1, 1u << 24));
}

}  // namespace ps
