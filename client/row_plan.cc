#include "client/row_plan.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "common/finite.h"
#include "common/row_bytes.h"

namespace ps {
namespace {

// An id's slot in the hash set is fetched this many ids ahead, so that the
// slots' cache misses overlap.
constexpr std::size_t kAhead = 16;
// Up to this many shards, each shard's distinct ids are written to a region
// of their own as they are found, and the regions are then copied together;
// with more, the distinct ids are grouped by a counting sort afterwards.
constexpr uint32_t kMaxRegions = 16;

// Per thread (a plan is made on the caller's thread), kept between batches up
// to a size, so that a batch like the one before it allocates nothing:
//  - the open-addressing set of the batch's distinct ids (load <= 1/4: a
//    collision costs a mispredicted branch and a read elsewhere), whose slots
//    hold only a place; the id at a place is read from `ids`;
//  - the regions (several shards): per shard, its distinct ids and their
//    first positions, at place shard * stride + k.
struct PlanScratch {
  static constexpr uint32_t kEmpty = UINT32_MAX;
  PlanVector<uint32_t> slots;
  PlanVector<uint64_t> ids;
  PlanVector<uint32_t> first;
  PlanVector<uint32_t> placed;  // counting sort: place -> plan index
  std::vector<uint32_t> count;  // per region: its distinct ids
  std::vector<uint32_t> start;  // per shard: its first plan index, then the end
  std::vector<uint32_t> cursor;

  void trim() {
    if (slots.capacity() > (4u << 20) || ids.capacity() > (2u << 20)) *this = PlanScratch{};
  }
};

// Copies one row (dst and src do not overlap). A row whose size is a
// multiple of 32 bytes (dim % 8 == 0, the usual case) is copied inline in
// 32-byte steps rather than through a library call per row.
inline void copy_row(float* __restrict dst, const float* __restrict src, uint32_t dim) {
  if (dim % 8 == 0) {
    for (uint32_t j = 0; j < dim; j += 8) __builtin_memcpy(dst + j, src + j, 32);
  } else {
    std::memcpy(dst, src, std::size_t(dim) * sizeof(float));
  }
}

// Objects kept for reuse, so that a batch like the one before it allocates
// nothing and touches no fresh page: plans (shared_row_plan) and plan-order
// gradient buffers (PushGradients). take() hands out a kept one or a
// new one; the shared_ptr's deleter gives it back, keeping at most kKeep and
// none that `too_big` says grew too large. Never destroyed, so that an
// object released during static destruction still finds its pool.
template <typename T>
class ReusePool {
 public:
  static constexpr std::size_t kKeep = 8;
  explicit ReusePool(bool (*too_big)(const T&)) : too_big_(too_big) {}

  std::shared_ptr<T> take() {
    std::unique_ptr<T> object;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        object = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!object) object = std::make_unique<T>();
    return std::shared_ptr<T>(object.release(), [this](T* p) { give(p); });
  }

 private:
  void give(T* p) {
    std::unique_ptr<T> owned(p);
    if (too_big_(*p)) return;
    std::lock_guard lock(mutex_);
    if (free_.size() < kKeep) free_.push_back(std::move(owned));
  }
  bool (*too_big_)(const T&);
  std::mutex mutex_;
  std::vector<std::unique_ptr<T>> free_;
};

ReusePool<RowPlan>& plan_pool() {
  static auto* pool = new ReusePool<RowPlan>([](const RowPlan& p) {
    return std::max(p.first.capacity(), p.repeats.capacity()) > (1u << 20);  // a very large batch's
  });
  return *pool;
}

ReusePool<PlanVector<float>>& gradient_pool() {
  static auto* pool = new ReusePool<PlanVector<float>>(
      [](const PlanVector<float>& v) { return v.capacity() > (std::size_t(16) << 20); });
  return *pool;
}

}  // namespace

void plan_rows_into(RowPlan& plan, std::span<const uint64_t> ids, const RowPlacement& placement,
                    uint32_t max_ids, bool every_shard) {
  constexpr uint32_t kEmpty = PlanScratch::kEmpty;
  const std::size_t n = ids.size();
  const uint32_t shards = placement.shards();
  thread_local PlanScratch sc;
  int bits = 0;  // a region's stride: 2^bits >= n
  while ((std::size_t(1) << bits) < n) ++bits;
  uint32_t regions = shards <= kMaxRegions ? shards : 1;
  if ((uint64_t(regions) << bits) > uint64_t(kEmpty)) regions = 1;
  const uint64_t stride_mask = (uint64_t(1) << bits) - 1;
  // One shard: the distinct ids go straight into the plan, in first-seen order.
  const bool direct = shards == 1;
  const std::size_t places = regions == 1 ? n : std::size_t(regions) << bits;
  PlanVector<uint64_t>& place_ids = direct ? plan.ids : sc.ids;
  PlanVector<uint32_t>& place_first = direct ? plan.first : sc.first;
  place_ids.resize(places);
  place_first.resize(places);
  std::size_t capacity = 16;
  while (capacity < 4 * n) capacity *= 2;
  sc.slots.resize(std::max(sc.slots.size(), capacity));
  uint32_t* slots = sc.slots.data();
  std::fill_n(slots, capacity, kEmpty);
  const uint64_t mask = capacity - 1;
  sc.count.assign(regions, 0);
  uint32_t* count = sc.count.data();
  plan.repeats.clear();
  plan.requests.clear();
  uint64_t* pid = place_ids.data();
  uint32_t* pfirst = place_first.data();
  const uint64_t* in = ids.data();
  // One pass in caller order: each distinct id at the next place of its
  // region (so a shard's ids keep first-seen order); a repeat keeps its id's
  // place, made an index below. The loop is made once per way of finding a
  // region, with the placement and the regions' next places in locals that
  // the stores cannot alias (else they are read from memory for every id).
  auto one_pass = [&](auto region_of) {
    uint32_t next[kMaxRegions];
    for (uint32_t r = 0; r < regions; ++r) next[r] = r << bits;
    for (std::size_t i = 0; i < std::min(n, kAhead); ++i)
      __builtin_prefetch(&slots[mix_id(in[i]) & mask], 1);
    for (std::size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&slots[mix_id(in[i + kAhead]) & mask], 1);
      const uint64_t id = in[i];
      for (uint64_t h = mix_id(id) & mask;; h = (h + 1) & mask) {
        const uint32_t at = slots[h];
        if (at == kEmpty) {
          const uint32_t place = next[region_of(id)]++;
          slots[h] = place;
          pid[place] = id;
          pfirst[place] = static_cast<uint32_t>(i);
          break;
        }
        if (pid[at] == id) {
          plan.repeats.push_back({static_cast<uint32_t>(i), pfirst[at], at});
          break;
        }
      }
    }
    for (uint32_t r = 0; r < regions; ++r) count[r] = next[r] - (r << bits);
  };
  if (regions == 1) {
    one_pass([](uint64_t) { return 0u; });
  } else {
    const RowPlacement place_of = placement;
    one_pass([&place_of](uint64_t id) { return place_of.shard_of(id); });
  }
  uint32_t distinct = 0;
  for (uint32_t r = 0; r < regions; ++r) distinct += count[r];
  plan.has_duplicates = distinct != n;
  plan.in_caller_order = direct && !plan.has_duplicates;
  std::vector<uint32_t>& start = sc.start;
  start.assign(shards + 1, 0);
  if (direct) {
    plan.ids.resize(distinct);
    plan.first.resize(distinct);
    start[1] = distinct;
  } else if (regions == shards) {
    // The regions copied together, and each repeat's place made its index.
    plan.ids.resize(distinct);
    plan.first.resize(distinct);
    for (uint32_t s = 0; s < shards; ++s) {
      start[s + 1] = start[s] + count[s];
      std::copy_n(pid + (std::size_t(s) << bits), count[s], plan.ids.data() + start[s]);
      std::copy_n(pfirst + (std::size_t(s) << bits), count[s], plan.first.data() + start[s]);
    }
    for (RowRepeat& r : plan.repeats)
      r.index = start[r.index >> bits] + uint32_t(r.index & stride_mask);
  } else {
    // Many shards: a counting sort of the distinct ids (first-seen order) by shard.
    sc.cursor.resize(distinct);  // the shard of each place
    for (uint32_t u = 0; u < distinct; ++u) {
      sc.cursor[u] = placement.shard_of(pid[u]);
      ++start[sc.cursor[u] + 1];
    }
    for (uint32_t s = 0; s < shards; ++s) start[s + 1] += start[s];
    std::vector<uint32_t> next(start.begin(), start.end() - 1);
    plan.ids.resize(distinct);
    plan.first.resize(distinct);
    sc.placed.resize(distinct);
    for (uint32_t u = 0; u < distinct; ++u) {
      const uint32_t at = next[sc.cursor[u]]++;
      sc.placed[u] = at;
      plan.ids[at] = pid[u];
      plan.first[at] = pfirst[u];
    }
    for (RowRepeat& r : plan.repeats) r.index = sc.placed[r.index];
  }
  const uint32_t per = std::max<uint32_t>(1, max_ids);
  for (uint32_t s = 0; s < shards; ++s) {
    if (start[s] == start[s + 1] && every_shard) plan.requests.push_back({s, start[s], 0});
    for (uint32_t f = start[s]; f < start[s + 1]; f += per) {
      plan.requests.push_back({s, f, std::min(per, start[s + 1] - f)});
    }
  }
  sc.trim();
}

RowPlan plan_rows(std::span<const uint64_t> ids, const RowPlacement& placement, uint32_t max_ids,
                  bool every_shard) {
  RowPlan plan;
  plan_rows_into(plan, ids, placement, max_ids, every_shard);
  return plan;
}

std::shared_ptr<const RowPlan> shared_row_plan(std::span<const uint64_t> ids,
                                               const RowPlacement& placement, uint32_t max_ids,
                                               bool every_shard) {
  std::shared_ptr<RowPlan> plan = plan_pool().take();
  plan_rows_into(*plan, ids, placement, max_ids, every_shard);
  return plan;
}

void scatter_request(const RowPlan& plan, const RowRequest& r, const float* rows, uint32_t dim,
                     float* out) {
  // The rows go to scattered places of the caller's buffer: each place is
  // asked for (for writing) a few rows ahead, so the writes' misses overlap.
  constexpr uint32_t kAheadRows = 8;
  const uint32_t* first = plan.first.data() + r.first;
  with_row_bytes(std::size_t(dim) * sizeof(float), [&](auto bytes) {
    for (uint32_t k = 0; k < r.count; ++k) {
      if (k + kAheadRows < r.count)
        prefetch_row<RowAccess::kWrite>(out + std::size_t(first[k + kAheadRows]) * dim, bytes);
      std::memcpy(out + std::size_t(first[k]) * dim, rows + std::size_t(k) * dim, bytes);
    }
  });
}

void fill_repeats(const RowPlan& plan, uint32_t dim, float* out) {
  for (const RowRepeat& r : plan.repeats) {
    copy_row(out + std::size_t(r.position) * dim, out + std::size_t(r.first) * dim, dim);
  }
}

void scatter_rows(const RowPlan& plan, const float* rows, uint32_t dim, float* out) {
  for (const RowRequest& r : plan.requests) {
    scatter_request(plan, r, rows + std::size_t(r.first) * dim, dim, out);
  }
  fill_repeats(plan, dim, out);
}

std::vector<uint32_t> requests_per_shard(const RowPlan& plan, std::size_t shards) {
  std::vector<uint32_t> n(shards);
  for (const RowRequest& r : plan.requests) ++n.at(r.shard);
  return n;
}

void gather_gradients(const RowPlan& plan, const float* grads, uint32_t dim, float* summed) {
  // Each id's row starts as the gradient at its first position; the
  // positions that repeat it are added after, in order (the same sums, bit
  // for bit, as adding every position to zeros in position order).
  for (std::size_t p = 0; p < plan.first.size(); ++p) {
    copy_row(summed + p * dim, grads + std::size_t(plan.first[p]) * dim, dim);
  }
  for (const RowRepeat& r : plan.repeats) {
    float* __restrict dst = summed + std::size_t(r.index) * dim;
    const float* __restrict src = grads + std::size_t(r.position) * dim;
    for (uint32_t j = 0; j < dim; ++j) dst[j] += src[j];
  }
}

PushGradients::PushGradients(std::shared_ptr<const RowPlan> plan, std::span<const float> grads,
                             uint32_t dim)
    : plan_(std::move(plan)), grads_(grads), dim_(dim) {
  if (plan_->repeats.empty()) return;
  // Each repeated id's sum starts as its first position's gradient and adds
  // the later ones in caller order: the bits gather_gradients gives.
  sum_of_.resize(plan_->ids.size());
  std::fill(sum_of_.begin(), sum_of_.end(), kOwn);
  for (const RowRepeat& r : plan_->repeats) {
    uint32_t& at = sum_of_[r.index];
    if (at == kOwn) {
      at = static_cast<uint32_t>(sums_.size() / dim);
      sums_.resize(sums_.size() + dim);
      copy_row(sums_.data() + std::size_t(at) * dim, grads.data() + std::size_t(r.first) * dim,
               dim);
    }
    float* __restrict dst = sums_.data() + std::size_t(at) * dim;
    const float* __restrict src = grads.data() + std::size_t(r.position) * dim;
    for (uint32_t j = 0; j < dim; ++j) dst[j] += src[j];
  }
}

const float* PushGradients::row_of(uint32_t index) const {
  if (!sum_of_.empty() && sum_of_[index] != kOwn)
    return sums_.data() + std::size_t(sum_of_[index]) * dim_;
  return grads_.data() + std::size_t(plan_->first[index]) * dim_;
}

bool PushGradients::all_within(float limit) const {
  return all_finite(grads_, limit) && all_finite(sums_, limit);
}

bool PushGradients::within(const RowRequest& r, float limit) const {
  for (uint32_t k = r.first; k < r.first + r.count; ++k) {
    if (!all_finite(std::span<const float>(row_of(k), dim_), limit)) return false;
  }
  return true;
}

void PushGradients::write(const RowRequest& r, float* dst) const {
  with_row_bytes(std::size_t(dim_) * sizeof(float), [&](auto bytes) {
    for (uint32_t k = 0; k < r.count; ++k)
      std::memcpy(dst + std::size_t(k) * dim_, row_of(r.first + k), bytes);
  });
}

std::span<const float> PushGradients::rows(const RowRequest& r) {
  const std::size_t n = std::size_t(r.count) * dim_;
  if (plan_->in_caller_order) return grads_.subspan(std::size_t(r.first) * dim_, n);
  if (!buffer_) {  // taken only where a request does not go through shared memory
    buffer_ = gradient_pool().take();
    buffer_->resize(plan_->ids.size() * std::size_t(dim_));
  }
  float* dst = buffer_->data() + std::size_t(r.first) * dim_;
  write(r, dst);
  return {dst, n};
}

}  // namespace ps
