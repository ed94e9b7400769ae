// How libpsclient sends one batch of embedding-table ids: deduplicated
// (each distinct id pulled once; the gradients of repeated ids summed, as
// IndexedSlices are), grouped by shard (common/embedding_placement.h) and
// cut into requests of at most `max_ids` ids, so that a large batch goes to
// all shards at once in several messages each.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/embedding_placement.h"

namespace ps {

struct RowRequest {
  uint32_t shard = 0;
  uint32_t first = 0;  // into RowPlan::ids (and its rows): this request's ids
  uint32_t count = 0;
};

struct RowPlan {
  std::vector<uint64_t> ids;       // the distinct ids, grouped by shard
  std::vector<uint32_t> position;  // per caller position: its id's index in `ids`
  std::vector<uint32_t> first;     // per index in `ids`: the first caller position of that id
  // Caller positions that repeat an earlier id: (position, first position of its id).
  std::vector<std::pair<uint32_t, uint32_t>> repeats;
  std::vector<RowRequest> requests;
  bool has_duplicates = false;
};

// every_shard: a request (maybe empty) to each shard, as a sync step needs.
RowPlan plan_rows(std::span<const uint64_t> ids, const RowPlacement& placement, uint32_t max_ids,
                  bool every_shard);

// rows (ids.size() * dim floats, in plan order) to out (position order).
void scatter_rows(const RowPlan& plan, const float* rows, uint32_t dim, float* out);
// The same in pieces, as replies arrive: one request's rows (r.count * dim
// floats) to the first position of each of its ids; once every request's
// rows are in, fill_repeats copies them to the positions that repeat an id.
void scatter_request(const RowPlan& plan, const RowRequest& r, const float* rows, uint32_t dim,
                     float* out);
void fill_repeats(const RowPlan& plan, uint32_t dim, float* out);
// grads (position order) to summed (plan order): duplicates added up.
void gather_gradients(const RowPlan& plan, const float* grads, uint32_t dim, float* summed);

}  // namespace ps
