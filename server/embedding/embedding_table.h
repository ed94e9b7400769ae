// One shard's part of an embedding table: the rows it holds, their optimizer
// slots and, for a dynamic table, the id -> row index.
//
// Fixed tables are one contiguous array per component (values, then each
// slot), indexed by the local row (common/embedding_placement.h). Dynamic
// tables map an id to a row slot with a RowIndex (server/embedding/row_index.h:
// open addressing, no node per row) and keep rows in slabs of kSlabRows, so
// memory stays near the raw bytes; an evicted row's slot is reused.
//
// Every request is checked whole (check()) before anything changes: an id
// outside a fixed table or owned by another shard, a dynamic table at its
// row limit with OnRowLimit::kRefuse, throws RequestError. Not thread-safe:
// psd calls it from its event loop. A large pull or push is cut into parts
// that no two write the same row of (a push's repeated ids are summed within
// one part first), which the table's RunParts may run on several threads at
// once; the call returns when all are done.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/embedding_placement.h"
#include "ps/embedding.h"
#include "common/first_positions.h"
#include "server/embedding/count_sketch.h"
#include "server/embedding/huge_pages.h"
#include "server/embedding/row_index.h"
#include "server/embedding/row_optimizers.h"
#include "server/embedding/run_parts.h"

namespace ps {

class EmbeddingTable {
 public:
  static constexpr uint32_t kSlabRows = 1024;
  static constexpr uint32_t kMaxDim = 1u << 16;

  // Throws RequestError for a spec psd cannot hold (dim 0 or over kMaxDim,
  // a fixed table of 0 rows or placed by hash, a dynamic one with a
  // placement other than hash, an initializer tables do not support, a bad optimizer).
  static void validate(const TableSpec& spec);
  // The bytes a new table takes on `shard` before any dynamic row exists.
  static uint64_t initial_bytes(const TableSpec& spec, uint32_t shard, uint32_t shards);
  // The memory `fresh` new rows would add here, as bytes() counts it: none
  // for those that fit in slots already allocated and free (rows evicted or
  // expired, or the rest of the last slab) or, at an LRU table's row limit,
  // that take the slot of a row they evict; for the others the slab chunks,
  // index and per-slot arrays that creating them would map.
  uint64_t bytes_for_new_rows(uint64_t fresh) const;

  // run_parts spreads a large request's parts over threads (run_parts.h);
  // by default the caller does all the work.
  EmbeddingTable(TableSpec spec, uint32_t shard, uint32_t shards, RunParts run_parts = {});
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const TableSpec& spec() const { return spec_; }
  uint32_t dim() const { return spec_.dim; }
  uint32_t shard() const { return shard_; }
  uint32_t shards() const { return placement_.shards(); }
  const RowOptimizer& optimizer() const { return *optimizer_; }
  uint64_t rows() const;   // rows held here now
  bool holds(uint64_t id) const { return !spec_.dynamic || find(id) != kEmpty; }  // a checked id
  uint64_t bytes() const;  // memory of values, slots and index
  uint64_t evictions() const { return evictions_; }
  // TableSpec::expire_after_steps: the job's global step is now `step`.
  // Rows touched from here on are stamped with it, and part of the index is
  // swept for rows untouched in the last expire_after_steps steps, which
  // are dropped (returned, and counted in rows_expired()). A row goes
  // within expire_after_steps * (1 + 1 / kSweepsPerExpiry) steps of its
  // last touch (one an LRU eviction moves in the index may wait one more
  // sweep); exactly at expire_after_steps where that is under
  // kSweepsPerExpiry steps (each step sweeps the whole index). psd calls it
  // as each step is reached, and once for a new or restored table.
  uint64_t advance_to_step(int64_t step);
  uint64_t rows_expired() const { return rows_expired_; }
  static constexpr uint64_t kSweepsPerExpiry = 4;
  // Ages are worked out from 32-bit stamps: a row is swept within a
  // quarter of this after it is due, so its age is then still under 2^31.
  static constexpr uint64_t kMaxExpireAfterSteps = uint64_t{1} << 30;
  // Admission by count (TableSpec::min_count > 1): pushed ids not yet
  // admitted, each counted once per push that dropped its gradients.
  bool admits_by_count() const { return sketch_ != nullptr; }
  const CountSketch* sketch() const { return sketch_.get(); }  // null unless admits_by_count()
  // A restarted psd's: the sketch saved with the table (its key, width and
  // counters), so that ids not yet admitted keep their counts. Throws
  // RequestError (the table unchanged) where it does not fit the spec.
  void restore_sketch(uint64_t key, uint32_t width, std::span<const uint8_t> counters);
  uint64_t ids_filtered() const { return ids_filtered_; }
  // Memory kept from one request to the next for their work (each
  // position's slot, repeats, parts); given back after a request of more
  // than kKeepScratchIds ids (the most a client's default 1 MiB request
  // carries) or that leaves more than kKeepScratchBytes, so that an
  // outsized request does not pin it; and whenever keeping it would take
  // what all tables of the process keep past kKeepScratchTotal, since it is
  // outside --max_memory_mb (a client could otherwise make thousands of
  // tables each keep megabytes).
  std::size_t scratch_bytes() const;
  static constexpr std::size_t kKeepScratchIds = std::size_t{1} << 17;
  static constexpr std::size_t kKeepScratchBytes = std::size_t{16} << 20;
  static constexpr std::size_t kKeepScratchTotal = std::size_t{64} << 20;
  // What every table of the process keeps now (for tests and the budget).
  static std::size_t kept_scratch_total();
  uint64_t version() const { return version_; }  // updates applied
  void set_version(uint64_t v) { version_ = v; }
  static constexpr uint64_t kMaxVersion = uint64_t{1} << 62;  // a restore's most

  // Which missing rows of a dynamic table a request creates: a pull or push
  // every one, except where the table admits ids by count: then a pull
  // none, and a push those whose count reaches min_count with it. A
  // lookup creates none; a restore every one.
  enum class Creating { kNone, kByPull, kByPush, kAll };
  // Whether a request `creating` rows would create one for `id`, not held
  // (a dynamic table; by count: whether this push admits it).
  bool would_create(uint64_t id, Creating creating) const { return creates(id, creating); }
  // Checks that every id may be read or written here; returns how many
  // distinct rows the request would create (dynamic tables), which the row
  // limit must allow. `what` starts the error message ("pullRows").
  uint64_t check(std::span<const uint64_t> ids, const char* what,
                 Creating creating = Creating::kAll) const;
  // The same checks of the ids alone, for a request that creates no rows
  // (the table's row limit does not apply).
  void check_ids(std::span<const uint64_t> ids, const char* what) const;

  // Writes row ids[i] to out[i*dim ..], creating missing dynamic rows
  // (unless the table admits ids by count: then as lookup()).
  // out holds ids.size() * dim floats. Call check() first.
  void pull(std::span<const uint64_t> ids, float* out);
  // As pull(), but creates no row and moves none in the LRU order: an id a
  // dynamic table does not hold reads as its initializer would make it.
  // Evaluation and serving read this way, so that held-out or unseen ids
  // neither grow the table nor evict trained rows. Call check() with
  // Creating::kNone (or check_ids()) first.
  void lookup(std::span<const uint64_t> ids, float* out);
  // Whether push(ids, grads, scale) would leave every value and optimizer
  // slot it touches finite (a large gradient, or a large learning rate, can
  // overflow them): worked out on copies, the table unchanged. Call check()
  // first.
  bool update_finite(std::span<const uint64_t> ids, std::span<const float> grads,
                     float scale) const;
  // What a push knows of its repeated ids. psd looks for them (a hash set
  // over the request) so that an id's gradients are summed before the
  // optimizer, as IndexedSlices are; a push that has none can skip that.
  enum class Repeats {
    kMaybe,  // looked for
    // The sender says there are none (pushRows' idsDistinct). Taken on
    // trust only where a lie cannot hurt the table: one part (no two
    // threads write one row) and gradients within the safe bound (each
    // position's own update stays finite). A repeat then gets each of its
    // gradients as its own update, in order, as from separate pushes.
    kSenderSaysNone,
    kNone,  // psd's own list of distinct ids (a sync step's union)
  };
  // Applies grads (ids.size() * dim floats, times `scale`) with the table's
  // optimizer; the gradients of an id named more than once are summed first
  // (as IndexedSlices are). Call check() first. `repeats`: kMaybe or kNone.
  // Where the table admits ids by count, the gradients of missing ids that
  // this push does not admit are dropped (both here and in push_if_finite),
  // and each such id counted once more.
  void push(std::span<const uint64_t> ids, std::span<const float> grads, float scale,
            Repeats repeats = Repeats::kMaybe);
  // push(), unless it would store a NaN or Inf in a value or optimizer slot:
  // then returns false and the table (rows, slots, version) is as before.
  // Each row's update is first worked out without being written
  // (RowOptimizer::stays_finite), then applied, unless every gradient is
  // within the optimizer's safe_gradient_bound.
  // `new_rows` is what check() returned for these ids: a push that creates
  // dynamic rows and must be checked goes through update_finite, which works
  // out the rows it would create without creating them.
  // `within_bound`, where given, says whether every gradient is within
  // safe_gradient_bound(scale, ids.size()): a caller that checks the
  // gradients anyway works both out in one pass.
  bool push_if_finite(std::span<const uint64_t> ids, std::span<const float> grads, float scale,
                      uint64_t new_rows, std::optional<bool> within_bound = std::nullopt,
                      Repeats repeats = Repeats::kMaybe);
  // The optimizer's safe_gradient_bound for a push of `ids` ids (0: none).
  float safe_gradient_bound(float scale, std::size_t ids) const {
    return optimizer_->safe_gradient_bound(scale, ids);
  }

  // For checkpoints: every row held (id, the values then each slot's `dim`
  // floats, and its age: the steps since it was last touched where rows
  // expire, else 0); with kEvictLru the least recently used first, so that
  // put_rows() of the rows in this order restores the LRU order.
  void for_each_row(
      const std::function<void(uint64_t id, const float* values,
                               std::span<const float* const> slots, uint32_t age)>& fn) const;
  // For restores: sets row ids[i] to values[i*dim ..] and each slot k to
  // slots[k][i*dim ..], creating missing dynamic rows; with kEvictLru the
  // rows held are touched first, so a new row evicts none of them. Where
  // rows expire, row ids[i] counts as last touched ages[i] steps ago (ages
  // empty: now), so that it expires when it would have without the
  // restore. Call check() first.
  void put_rows(std::span<const uint64_t> ids, const float* values,
                std::span<const float* const> slots, std::span<const uint32_t> ages = {});

 private:
  static constexpr uint32_t kEmpty = RowIndex::kMissing;
  uint32_t components() const { return 1 + optimizer_->num_slots(); }
  float* row(uint32_t component, uint64_t slot) const;
  void init_row(uint64_t slot, uint64_t id);
  void initial_values(uint64_t id, float* w) const;  // row id's values from the initializer
  // Dynamic: the slot of `id`, or kEmpty.
  uint32_t find(uint64_t id) const { return index_.find(id); }
  // Dynamic lookups ask for the index entries of the ids this many positions
  // ahead, so that their cache misses overlap.
  static constexpr std::size_t kIndexAhead = 16;
  // Dynamic: the slot of `id`, created (and initialised) when missing.
  uint32_t find_or_insert(uint64_t id);
  uint64_t local_slot(uint64_t id);  // fixed: local row; dynamic: find_or_insert
  void read_rows(std::span<const uint64_t> ids, float* out, bool pull);  // pull or lookup
  // Dynamic: slots[i] = the slot of ids[i], or kEmpty where not held.
  void find_slots(std::span<const uint64_t> ids, std::vector<uint64_t>& slots);
  // The rows held (slots not kEmpty) are stamped with the step (expiry) and,
  // with kEvictLru, go to the LRU front, in order.
  void touch_slots(const std::vector<uint64_t>& slots);
  // find_slots(), then touch_slots().
  void find_and_touch(std::span<const uint64_t> ids, std::vector<uint64_t>& slots);
  uint32_t take_free_slot();
  bool expires() const { return spec_.expire_after_steps != 0; }
  uint32_t stamp() const { return static_cast<uint32_t>(step_); }  // a touch's, in touched_at_
  void evict_one();
  void touch(uint32_t slot);  // LRU: to the front
  void lru_unlink(uint32_t slot);
  void lru_push_front(uint32_t slot);

  // Admission by count: the ids and gradients a push applies (rows held,
  // ids admitted by it), in admitted_ids_ / admitted_grads_ where any are
  // dropped; the dropped ids wait in dropped_ids_ for count_dropped(),
  // called once the push is applied.
  struct Admitted {
    std::span<const uint64_t> ids;
    std::span<const float> grads;
  };
  Admitted admit(std::span<const uint64_t> ids, std::span<const float> grads);
  void count_dropped();
  void forget_dropped();  // the dropped ids of a push that was refused, or counted
  // Records `slots` (taken) as the slots of `ids`, as check() does.
  void keep_slots(std::span<const uint64_t> ids, std::vector<uint64_t>& slots);
  bool creates(uint64_t id, Creating creating) const;

  TableSpec spec_;
  uint32_t shard_;
  RowPlacement placement_;
  std::unique_ptr<RowOptimizer> optimizer_;
  uint64_t version_ = 0;
  uint64_t evictions_ = 0;
  // Expiry: the step now (advance_to_step's), whose low 32 bits stamp each
  // touched slot in touched_at_; the next index position to sweep.
  uint64_t rows_expired_ = 0;
  int64_t step_ = 0;
  std::vector<uint32_t> touched_at_;
  uint64_t sweep_at_ = 0;
  std::unique_ptr<CountSketch> sketch_;  // min_count > 1 only
  uint64_t ids_filtered_ = 0;
  std::vector<uint64_t> admitted_ids_, dropped_ids_, admit_slots_;
  std::vector<float> admitted_grads_;
  std::vector<char> admitted_at_;

  // Fixed: one array per component, in 2 MiB pages where the kernel has
  // them (server/embedding/huge_pages.h).
  using Array = std::unique_ptr<float[], Unmap>;
  uint64_t fixed_rows_ = 0;
  std::vector<Array> arrays_;

  // Dynamic.
  // [component][slab]: slabs cut from chunks that grow to 2 MiB (huge pages, as fixed tables').
  std::vector<std::vector<float*>> slabs_;
  std::vector<Array> chunks_;
  void add_slabs();
  uint64_t slabs_per_chunk(uint64_t slabs) const;  // the next add_slabs()'s, with `slabs` mapped
  uint64_t slots_used_ = 0;  // slots ever taken (free ones included)
  std::vector<uint32_t> free_slots_;
  uint64_t live_rows_ = 0;
  RowIndex index_;
  // kEvictLru only: each slot's id (to find an evicted row in the index), the
  // LRU list (a slot's two links side by side: one cache miss per node).
  std::vector<uint64_t> slot_ids_;
  struct LruLink {
    uint32_t prev = kEmpty, next = kEmpty;
  };
  std::vector<LruLink> lru_;
  uint32_t lru_head_ = kEmpty, lru_tail_ = kEmpty;

  // Request scratch, reused between requests: each position's slot, and
  // the repeated ids in check() and update_finite() (which run one after
  // another, never nested).
  std::vector<uint64_t> push_slots_;
  mutable FirstPositions seen_;
  // A dynamic table's check() keeps the slots it found, and the ids it was
  // given; find_and_touch() on the same ids, with the index unchanged since,
  // takes them instead of looking every id up again (a request checks, then
  // reads or writes, one after the other).
  struct Checked {
    std::vector<uint64_t> ids, slots;
    uint64_t index_changes = 0;
    bool valid = false;
  };
  mutable Checked checked_;

  // A request of n ids is cut into parts_for(n) parts, each worked on by one
  // thread: at least kPartRows ids a part, so that handing one to another
  // thread costs little beside its work; one part where run_parts_ has one thread.
  static constexpr std::size_t kPartRows = 1024, kMaxParts = 16;
  std::size_t parts_for(std::size_t n) const;
  // Part p of `parts` equal ranges of positions [0, n): [first, end).
  static std::pair<std::size_t, std::size_t> part_range(std::size_t n, std::size_t parts,
                                                        std::size_t p) {
    return {n * p / parts, n * (p + 1) / parts};
  }
  RunParts run_parts_;
  void for_parts(std::size_t parts, const PartFn& fn);
  // A push's repeated rows are found in parts by row: the positions of each
  // part (part_order_ from part_begin_[p]: a slot's positions all in one
  // part, in request order), and per part the repeated slots' gradients
  // summed. summed_at_[i]: kOwnGradient
  // (the row's only position), kRepeat (a later position of a row, applied
  // at its first), or where the row's summed gradient is (its index in its
  // part's sums, then kPartBits bits of the part).
  static constexpr uint64_t kOwnGradient = UINT64_MAX, kRepeat = UINT64_MAX - 1;
  static constexpr uint32_t kPartBits = 5;
  static_assert(kMaxParts <= (1u << kPartBits));
  struct PartSums {
    FirstPositions seen;
    std::vector<float> sums;
  };
  std::vector<uint32_t> part_order_, part_begin_;
  std::vector<uint64_t> summed_at_;
  std::vector<PartSums> part_sums_;
  // Gives the scratch back (scratch_bytes) after a request of more than
  // kKeepScratchIds ids or when it holds more than kKeepScratchBytes: the
  // destructor of one made at a call's start.
  struct ReleaseScratchAfter {
    EmbeddingTable& table;
    std::size_t ids;
    ~ReleaseScratchAfter();
  };
  void release_scratch();
  std::size_t kept_scratch_ = 0;  // this table's part of the process's total
  // From push_slots_; with one part, part_order_ stays empty (every position).
  void group_slots_by_part(std::size_t parts);
  void sum_repeats(std::size_t part, const float* grads);
  // The summed gradient that summed_at_ value `at` (not kOwnGradient or kRepeat) names.
  const float* summed_gradient(uint64_t at) const;
  // push(), first (with `check_first`) working out every row's update
  // without writing it: false, and nothing changed, when one would not be
  // finite. kSenderSaysNone only where check_first or the gradients are
  // within the safe bound.
  bool apply_push(std::span<const uint64_t> ids, std::span<const float> grads, float scale,
                  bool check_first, Repeats repeats);
};

}  // namespace ps
