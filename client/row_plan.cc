#include "client/row_plan.h"

#include <algorithm>
#include <cstring>

namespace ps {
namespace {

// An open-addressing set of a batch's distinct ids (load <= 1/2), each with
// its index among them. Per thread (a plan is made on the caller's thread)
// and reused, up to a size: the set of a batch like the one before it
// allocates nothing and touches no fresh page.
struct DistinctIds {
  static constexpr uint32_t kEmpty = UINT32_MAX;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> index;
  uint64_t mask = 0;

  void reset(std::size_t n) {
    std::size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    if (keys.size() < capacity) keys.resize(capacity);
    index.assign(capacity, kEmpty);
    mask = capacity - 1;
  }
  // The id's index, or `next` after adding it with that index.
  uint32_t find_or_add(uint64_t id, uint32_t next) {
    for (uint64_t h = mix_id(id) & mask;; h = (h + 1) & mask) {
      if (index[h] == kEmpty) {
        keys[h] = id;
        index[h] = next;
        return next;
      }
      if (keys[h] == id) return index[h];
    }
  }
  // The set of a very large batch (over a million ids) is not kept.
  void trim() {
    if (keys.size() > (2u << 20)) {
      keys = {};
      index = {};
    }
  }
};

}  // namespace

RowPlan plan_rows(std::span<const uint64_t> ids, const RowPlacement& placement, uint32_t max_ids,
                  bool every_shard) {
  RowPlan plan;
  const std::size_t n = ids.size();
  thread_local DistinctIds seen;
  seen.reset(n);
  // First pass: each position's distinct index; the distinct ids in first-seen order.
  plan.position.resize(n);
  plan.ids.resize(n);
  plan.first.resize(n);
  uint32_t distinct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t u = seen.find_or_add(ids[i], distinct);
    plan.position[i] = u;
    if (u == distinct) {
      plan.ids[distinct] = ids[i];
      plan.first[distinct] = static_cast<uint32_t>(i);
      ++distinct;
    } else {
      plan.repeats.emplace_back(static_cast<uint32_t>(i), plan.first[u]);
    }
  }
  seen.trim();
  plan.ids.resize(distinct);
  plan.first.resize(distinct);
  plan.has_duplicates = distinct != n;
  const uint32_t shards = placement.shards();
  std::vector<uint32_t> start(shards + 1, 0);
  if (shards == 1) {
    start[1] = distinct;  // one shard: first-seen order is already grouped
  } else {
    // Group by shard (a counting sort keeps each shard's ids in first-seen order).
    std::vector<uint32_t> shard_of(distinct);
    for (uint32_t u = 0; u < distinct; ++u) {
      shard_of[u] = placement.shard_of(plan.ids[u]);
      ++start[shard_of[u] + 1];
    }
    for (uint32_t s = 0; s < shards; ++s) start[s + 1] += start[s];
    std::vector<uint32_t> cursor(start.begin(), start.end() - 1);
    std::vector<uint32_t> grouped(distinct);  // distinct index -> plan index
    std::vector<uint64_t> by_shard(distinct);
    std::vector<uint32_t> first(distinct);
    for (uint32_t u = 0; u < distinct; ++u) {
      const uint32_t at = cursor[shard_of[u]]++;
      grouped[u] = at;
      by_shard[at] = plan.ids[u];
      first[at] = plan.first[u];
    }
    plan.ids.swap(by_shard);
    plan.first.swap(first);
    for (std::size_t i = 0; i < n; ++i) plan.position[i] = grouped[plan.position[i]];
  }
  const uint32_t per = std::max<uint32_t>(1, max_ids);
  for (uint32_t s = 0; s < shards; ++s) {
    if (start[s] == start[s + 1] && every_shard) plan.requests.push_back({s, start[s], 0});
    for (uint32_t f = start[s]; f < start[s + 1]; f += per) {
      plan.requests.push_back({s, f, std::min(per, start[s + 1] - f)});
    }
  }
  return plan;
}

void scatter_request(const RowPlan& plan, const RowRequest& r, const float* rows, uint32_t dim,
                     float* out) {
  const std::size_t row_bytes = std::size_t(dim) * sizeof(float);
  const uint32_t* first = plan.first.data() + r.first;
  for (uint32_t k = 0; k < r.count; ++k) {
    std::memcpy(out + std::size_t(first[k]) * dim, rows + std::size_t(k) * dim, row_bytes);
  }
}

void fill_repeats(const RowPlan& plan, uint32_t dim, float* out) {
  const std::size_t row_bytes = std::size_t(dim) * sizeof(float);
  for (const auto& [position, first] : plan.repeats) {
    std::memcpy(out + std::size_t(position) * dim, out + std::size_t(first) * dim, row_bytes);
  }
}

void scatter_rows(const RowPlan& plan, const float* rows, uint32_t dim, float* out) {
  for (const RowRequest& r : plan.requests) {
    scatter_request(plan, r, rows + std::size_t(r.first) * dim, dim, out);
  }
  fill_repeats(plan, dim, out);
}

void gather_gradients(const RowPlan& plan, const float* grads, uint32_t dim, float* summed) {
  if (!plan.has_duplicates) {
    // Each id once: its row is the gradient at its (only) position.
    const std::size_t row_bytes = std::size_t(dim) * sizeof(float);
    for (std::size_t p = 0; p < plan.first.size(); ++p) {
      std::memcpy(summed + p * dim, grads + std::size_t(plan.first[p]) * dim, row_bytes);
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
