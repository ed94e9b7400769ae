#include "client/row_plan.h"

#include <algorithm>
#include <cstring>

namespace ps {

RowPlan plan_rows(std::span<const uint64_t> ids, const RowPlacement& placement, uint32_t max_ids,
                  bool every_shard) {
  RowPlan plan;
  const std::size_t n = ids.size();
  // Distinct ids by an open-addressing table of indices (load <= 1/2).
  std::size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  const uint64_t mask = capacity - 1;
  constexpr uint32_t kEmpty = UINT32_MAX;
  std::vector<uint32_t> table(capacity, kEmpty);
  std::vector<uint64_t> distinct;
  distinct.reserve(n);
  std::vector<uint32_t> first_index(n);  // per position: index in `distinct`
  for (std::size_t i = 0; i < n; ++i) {
    uint64_t h = mix_id(ids[i]) & mask;
    while (table[h] != kEmpty && distinct[table[h]] != ids[i]) h = (h + 1) & mask;
    if (table[h] == kEmpty) {
      table[h] = static_cast<uint32_t>(distinct.size());
      distinct.push_back(ids[i]);
    }
    first_index[i] = table[h];
  }
  plan.has_duplicates = distinct.size() != n;
  // Group by shard (a counting sort keeps each shard's ids in first-seen order).
  const uint32_t shards = placement.shards();
  std::vector<uint32_t> shard_of(distinct.size());
  std::vector<uint32_t> start(shards + 1, 0);
  for (std::size_t u = 0; u < distinct.size(); ++u) {
    shard_of[u] = placement.shard_of(distinct[u]);
    ++start[shard_of[u] + 1];
  }
  for (uint32_t s = 0; s < shards; ++s) start[s + 1] += start[s];
  std::vector<uint32_t> cursor(start.begin(), start.end() - 1);
  std::vector<uint32_t> grouped(distinct.size());  // distinct index -> plan index
  plan.ids.resize(distinct.size());
  for (std::size_t u = 0; u < distinct.size(); ++u) {
    const uint32_t at = cursor[shard_of[u]]++;
    grouped[u] = at;
    plan.ids[at] = distinct[u];
  }
  plan.position.resize(n);
  for (std::size_t i = 0; i < n; ++i) plan.position[i] = grouped[first_index[i]];
  const uint32_t per = std::max<uint32_t>(1, max_ids);
  for (uint32_t s = 0; s < shards; ++s) {
    if (start[s] == start[s + 1] && every_shard) plan.requests.push_back({s, start[s], 0});
    for (uint32_t f = start[s]; f < start[s + 1]; f += per) {
      plan.requests.push_back({s, f, std::min(per, start[s + 1] - f)});
    }
  }
  return plan;
}

void scatter_rows(const RowPlan& plan, const float* rows, uint32_t dim, float* out) {
  const std::size_t row_bytes = std::size_t(dim) * sizeof(float);
  for (std::size_t i = 0; i < plan.position.size(); ++i) {
    std::memcpy(out + i * dim, rows + std::size_t(plan.position[i]) * dim, row_bytes);
  }
}

void gather_gradients(const RowPlan& plan, const float* grads, uint32_t dim, float* summed) {
  if (!plan.has_duplicates) {
    const std::size_t row_bytes = std::size_t(dim) * sizeof(float);
    for (std::size_t i = 0; i < plan.position.size(); ++i) {
      std::memcpy(summed + std::size_t(plan.position[i]) * dim, grads + i * dim, row_bytes);
    }
    return;
  }
  std::fill_n(summed, plan.ids.size() * dim, 0.0f);
  for (std::size_t i = 0; i < plan.position.size(); ++i) {
    float* __restrict dst = summed + std::size_t(plan.position[i]) * dim;
    const float* __restrict src = grads + i * dim;
    for (uint32_t j = 0; j < dim; ++j) dst[j] += src[j];
  }
}

}  // namespace ps
