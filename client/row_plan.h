// How libpsclient sends one batch of embedding-table ids: deduplicated
// (each distinct id pulled once; the gradients of repeated ids summed, as
// IndexedSlices are), grouped by shard (common/embedding_placement.h) and
// cut into requests of at most `max_ids` ids, so that a large batch goes to
// all shards at once in several messages each.
//
//   auto plan = shared_row_plan(ids, placement, max_ids, false);  // buffers reused
//   for (const RowRequest& r : plan->requests) send(r.shard, &plan->ids[r.first], r.count);
//   // as each request's rows arrive:
//   scatter_request(*plan, r, rows, dim, out);
//   fill_repeats(*plan, dim, out);  // once all are in
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/embedding_placement.h"

namespace ps {

struct RowRequest {
  uint32_t shard = 0;
  uint32_t first = 0;  // into RowPlan::ids (and its rows): this request's ids
  uint32_t count = 0;
};

// An allocator whose resize() leaves new elements uninitialised: a plan's
// arrays are written in full before they are read, and zero-filling them
// would cost a pass over memory per batch.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(p)) U;
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
};
template <class T>
using PlanVector = std::vector<T, UninitAllocator<T>>;

// A caller position that repeats an earlier id.
struct RowRepeat {
  uint32_t position = 0;
  uint32_t first = 0;  // the first caller position of its id
  uint32_t index = 0;  // its id's index in RowPlan::ids
  bool operator==(const RowRepeat&) const = default;
};

struct RowPlan {
  PlanVector<uint64_t> ids;        // the distinct ids, grouped by shard
  PlanVector<uint32_t> first;      // per index in `ids`: the first caller position of that id
  std::vector<RowRepeat> repeats;  // in caller order
  std::vector<RowRequest> requests;
  bool has_duplicates = false;
  // ids[p] is the caller's position p (one shard, no repeats): rows and
  // gradients in plan order are the caller's own buffers.
  bool in_caller_order = false;
};

// every_shard: a request (maybe empty) to each shard, as a sync step needs.
RowPlan plan_rows(std::span<const uint64_t> ids, const RowPlacement& placement, uint32_t max_ids,
                  bool every_shard);
// The same into `plan`, reusing its buffers (what it held before is replaced).
void plan_rows_into(RowPlan& plan, std::span<const uint64_t> ids, const RowPlacement& placement,
                    uint32_t max_ids, bool every_shard);
// The same in a plan taken from a process-wide pool, to which it goes back
// when the last reference is dropped: a batch like the one before it then
// allocates nothing and touches no fresh page.
std::shared_ptr<const RowPlan> shared_row_plan(std::span<const uint64_t> ids,
                                               const RowPlacement& placement, uint32_t max_ids,
                                               bool every_shard);

// How many of the plan's requests go to each of `shards` shards.
std::vector<uint32_t> requests_per_shard(const RowPlan& plan, std::size_t shards);
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
// A push's gradients in plan order, written request by request as each
// request is built: the sums of repeated ids (a few rows) are made at once,
// every other row is read from the caller's gradients where it lies, and on
// the same host written straight into shared memory (no buffer between).
// The caller keeps `grads` until the last request is answered.
//
//   auto g = std::make_shared<PushGradients>(plan, grads, dim);
//   if (!g->all_within(limit))                  // before any request goes
//     for (r : plan->requests) if (!g->within(r, limit)) refuse();
//   send(r, g->rows(r));                        // or g->write(r, shared_block)
class PushGradients {
 public:
  PushGradients(std::shared_ptr<const RowPlan> plan, std::span<const float> grads, uint32_t dim);
  // Whether every caller gradient and every repeated id's sum is finite and
  // within `limit`: then so is every row sent (one pass over the caller's
  // gradients, not one over the plan-order rows).
  bool all_within(float limit) const;
  // Whether request r's rows are (as all_finite() of them).
  bool within(const RowRequest& r, float limit) const;
  // Request r's rows in plan order: the caller's own where the plan is in
  // its order, else written to a buffer this holds. Requests may be asked
  // for on another thread than the one that made this, one at a time.
  std::span<const float> rows(const RowRequest& r);
  // Request r's rows in plan order, written to dst (r.count * dim floats).
  void write(const RowRequest& r, float* dst) const;
  // Whether rows() gives spans of the caller's own gradients.
  bool in_callers_buffer() const { return plan_->in_caller_order; }
  uint32_t dim() const { return dim_; }

 private:
  const float* row_of(uint32_t index) const;  // plan index -> its (summed) gradient
  static constexpr uint32_t kOwn = UINT32_MAX;
  std::shared_ptr<const RowPlan> plan_;
  std::span<const float> grads_;
  uint32_t dim_;
  PlanVector<float> sums_;       // one row per repeated id
  PlanVector<uint32_t> sum_of_;  // per plan index: its row in sums_, or kOwn (none if no repeats)
  std::shared_ptr<PlanVector<float>>
      buffer_;  // rows()' plan-order rows (from a pool, at its first call)
};

}  // namespace ps
