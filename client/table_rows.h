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

// Ids per request: a request's ids and rows fit the request size.
inline uint32_t ids_per_request(uint64_t max_batch_bytes, uint32_t dim) {
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(max_batch_bytes / (uint64_t(dim) * sizeof(float) + 8), 1, 1u << 24));
}

}  // namespace ps
