// One file for the one table type: fixed and dynamic storage share the row
// optimizers' apply, the gather and the checkpoint walk.
#include "server/embedding/embedding_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "common/finite.h"
#include "common/hash_key.h"
#include "common/row_bytes.h"
#include "common/tensor_name.h"
#include "ps/errors.h"

namespace ps {
namespace {

// A uniform float in [0, 1) from (seed, id, j): a row's random start does not
// depend on the shard or on the order rows are created in.
float unit_uniform(uint64_t seed, uint64_t id, uint64_t j) {
  const uint64_t h =
      mix_id(mix_id(seed ^ 0x9e3779b97f4a7c15ull) ^ (mix_id(id) + j * 0xd1b54a32d192ed03ull));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

float unit_normal(uint64_t seed, uint64_t id, uint64_t j) {
  const double u1 =
      (static_cast<double>(unit_uniform(seed, id, 2 * j)) * 16777216.0 + 1.0) / 16777217.0;
  const double u2 = unit_uniform(seed, id, 2 * j + 1);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

std::string quoted(const TableSpec& s) { return "table '" + s.name + "'"; }

}  // namespace

void EmbeddingTable::validate(const TableSpec& s) {
  check_name(s.name, "createTables: table");
  if (s.dim == 0 || s.dim > kMaxDim) {
    throw RequestError("createTables: " + quoted(s) + " has dim " + std::to_string(s.dim) +
                       "; it must be in [1, " + std::to_string(kMaxDim) + "]");
  }
  if (!s.dynamic && s.rows == 0)
    throw RequestError("createTables: " + quoted(s) + " is fixed but has 0 rows");
  if (s.dynamic && s.rows != 0)
    throw RequestError("createTables: " + quoted(s) + " is dynamic: give no row count");
  if (s.dynamic && s.placement != TablePlacement::kHash) {
    throw RequestError("createTables: " + quoted(s) +
                       " is dynamic: its ids are placed by hash, not 'mod' or 'div'");
  }
  if (!s.dynamic && s.placement != TablePlacement::kMod && s.placement != TablePlacement::kDiv) {
    throw RequestError("createTables: " + quoted(s) +
                       " is fixed: its rows are placed by 'mod' or 'div', not 'hash'");
  }
  if (!s.dynamic && (s.row_limit != 0 || s.on_limit != OnRowLimit::kRefuse)) {
    throw RequestError("createTables: " + quoted(s) +
                       " is fixed: a row limit is for dynamic tables");
  }
  if (!s.dynamic && s.min_count > 1) {
    throw RequestError("createTables: " + quoted(s) +
                       " is fixed: admission by count (min_count) is for dynamic tables");
  }
  if (s.min_count > CountSketch::kMaxCount) {
    throw RequestError("createTables: " + quoted(s) + " has min_count " +
                       std::to_string(s.min_count) + "; it must be at most " +
                       std::to_string(CountSketch::kMaxCount));
  }
  if (s.count_sketch_width != 0 && s.min_count <= 1) {
    throw RequestError("createTables: " + quoted(s) +
                       ": count_sketch_width sizes min_count's counts; give min_count > 1 too");
  }
  if (!s.dynamic && s.expire_after_steps != 0) {
    throw RequestError("createTables: " + quoted(s) +
                       " is fixed: rows expire (expire_after_steps) in dynamic tables only");
  }
  if (s.expire_after_steps > kMaxExpireAfterSteps) {
    throw RequestError("createTables: " + quoted(s) + " has expire_after_steps " +
                       std::to_string(s.expire_after_steps) + "; it must be at most " +
                       std::to_string(kMaxExpireAfterSteps));
  }
  if (s.count_sketch_width > CountSketch::kMaxWidth) {
    throw RequestError("createTables: " + quoted(s) + " has count_sketch_width " +
                       std::to_string(s.count_sketch_width) + "; it must be at most " +
                       std::to_string(CountSketch::kMaxWidth));
  }
  // No draw may overflow to Inf, which psd would then hold, and its
  // checkpoints could not be restored.
  const double a = s.init.a, b = s.init.b;
  switch (s.init.kind) {
    case InitKind::kZeros:
    case InitKind::kConstant:
      break;
    case InitKind::kUniform:
      if (!(s.init.a <= s.init.b))
        throw RequestError("createTables: " + quoted(s) + ": uniform low is above high");
      if (!draws_stay_finite(s.init)) {
        throw RequestError("createTables: " + quoted(s) + ": uniform [" + std::to_string(a) + ", " +
                           std::to_string(b) +
                           "] is wider than a float holds (draws would be Inf)");
      }
      break;
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal:
      if (!(s.init.b > 0))
        throw RequestError("createTables: " + quoted(s) + ": a normal's stddev must be > 0");
      if (!draws_stay_finite(s.init)) {
        throw RequestError("createTables: " + quoted(s) + ": a normal of mean " +
                           std::to_string(a) + " and stddev " + std::to_string(b) +
                           " would draw values past what a float holds");
      }
      break;
    default:
      throw RequestError("createTables: " + quoted(s) +
                         ": rows start as zeros, constant, uniform, normal or "
                         "truncated normal");
  }
  if (!std::isfinite(s.init.a) || !std::isfinite(s.init.b)) {
    throw RequestError("createTables: " + quoted(s) + ": initializer parameters must be finite");
  }
  RowOptimizer::make(s.optimizer, s.name);
}

uint64_t EmbeddingTable::initial_bytes(const TableSpec& s, uint32_t shard, uint32_t shards) {
  if (s.dynamic) {
    if (s.min_count <= 1) return 0;
    return uint64_t{CountSketch::kRows} * CountSketch::width_for(s.count_sketch_width);
  }
  const uint64_t rows = RowPlacement(s.placement, s.rows, shards).rows_on(shard);
  const uint64_t comps = 1 + RowOptimizer::make(s.optimizer, s.name)->num_slots();
  const uint64_t per_row = comps * s.dim * sizeof(float);
  return rows > UINT64_MAX / per_row ? UINT64_MAX : rows * per_row;
}

uint64_t EmbeddingTable::bytes_for_new_rows(uint64_t fresh) const {
  if (!spec_.dynamic) return 0;
  // At an LRU table's row limit each new row first evicts one and takes its slot.
  if (spec_.on_limit == OnRowLimit::kEvictLru && spec_.row_limit != 0)
    fresh = std::min(fresh, spec_.row_limit > live_rows_ ? spec_.row_limit - live_rows_ : 0);
  if (fresh == 0) return 0;
  // What bytes() grows by once they exist: the slab chunks add_slabs() maps
  // for the slots past those ever taken, the index doubled at half full,
  // and the per-slot arrays as push_back grows them.
  const uint64_t new_slots = fresh - std::min<uint64_t>(fresh, free_slots_.size());
  uint64_t bytes = 0;
  const uint64_t chunk_slab_bytes = uint64_t(kSlabRows) * spec_.dim * sizeof(float) * components();
  for (uint64_t slabs = slabs_[0].size(); slabs * kSlabRows < slots_used_ + new_slots;) {
    const uint64_t count = slabs_per_chunk(slabs);
    slabs += count;
    bytes += count * chunk_slab_bytes;
  }
  uint64_t capacity = index_.capacity();
  while ((index_.size() + fresh) * 2 > capacity) capacity *= 2;
  bytes += (capacity - index_.capacity()) * RowIndex::kEntryBytes;
  auto grown = [new_slots](const auto& v) -> uint64_t {  // push_back doubles a full vector
    uint64_t capacity = v.capacity();
    while (capacity < v.size() + new_slots) capacity = capacity == 0 ? 1 : 2 * capacity;
    return (capacity - v.capacity()) * sizeof(v[0]);
  };
  if (spec_.on_limit == OnRowLimit::kEvictLru) bytes += grown(slot_ids_) + grown(lru_);
  if (expires()) bytes += grown(touched_at_);
  return bytes;
}

EmbeddingTable::EmbeddingTable(TableSpec spec, uint32_t shard, uint32_t shards, RunParts run_parts)
    : spec_(std::move(spec)),
      shard_(shard),
      placement_(spec_.dynamic ? TablePlacement::kHash : spec_.placement, spec_.rows, shards),
      optimizer_(RowOptimizer::make(spec_.optimizer, spec_.name)),
      run_parts_(std::move(run_parts)) {
  spec_.init.values.clear();
  if (spec_.dynamic) {
    slabs_.resize(components());
    if (spec_.min_count > 1)
      sketch_ = std::make_unique<CountSketch>(spec_.count_sketch_width, random_hash_key());
    return;
  }
  fixed_rows_ = placement_.rows_on(shard_);
  const std::size_t n = fixed_rows_ * spec_.dim;
  for (uint32_t c = 0; c < components(); ++c) {
    // Written in full below (no value-initialisation pass).
    arrays_.push_back(map_array_of<float>(n));
    if (c > 0) std::fill_n(arrays_.back().get(), n, optimizer_->slot_init(c - 1));
  }
  if (spec_.init.kind == InitKind::kZeros || spec_.init.kind == InitKind::kConstant) {
    std::fill_n(arrays_[0].get(), n, spec_.init.kind == InitKind::kZeros ? 0.0f : spec_.init.a);
  } else {
    for (uint64_t r = 0; r < fixed_rows_; ++r) init_row(r, placement_.global_id(shard_, r));
  }
}

namespace {
// What all tables keep between requests (ReleaseScratchAfter): tables run
// on the event loop and on the compute pool's threads.
std::atomic<std::size_t> kept_scratch{0};
}  // namespace

std::size_t EmbeddingTable::kept_scratch_total() { return kept_scratch.load(); }

EmbeddingTable::~EmbeddingTable() { kept_scratch.fetch_sub(kept_scratch_); }

uint64_t EmbeddingTable::slabs_per_chunk(uint64_t slabs) const {
  constexpr uint64_t kHugePage = 2u << 20;
  // Chunks of 1, 1, 2, 4 ... slabs, up to 2 MiB: a small table stays small,
  // a large one is in huge pages.
  const uint64_t slab_bytes = uint64_t(kSlabRows) * spec_.dim * sizeof(float);
  return std::clamp<uint64_t>(slabs, 1, std::max<uint64_t>(1, kHugePage / slab_bytes));
}

void EmbeddingTable::add_slabs() {
  const std::size_t slab_floats = std::size_t(kSlabRows) * spec_.dim;
  const std::size_t count = slabs_per_chunk(slabs_[0].size());
  for (auto& c : slabs_) {
    chunks_.push_back(map_array_of<float>(count * slab_floats));
    for (std::size_t k = 0; k < count; ++k) c.push_back(chunks_.back().get() + k * slab_floats);
  }
}

void EmbeddingTable::restore_sketch(uint64_t key, uint32_t width,
                                    std::span<const uint8_t> counters) {
  if (!sketch_ || width != sketch_->width()) {
    throw RequestError(quoted(spec_) + ": a saved count sketch of width " + std::to_string(width) +
                       (sketch_ ? " for one of " + std::to_string(sketch_->width())
                                : " for a table that does not admit ids by count"));
  }
  if (counters.size() != sketch_->counters().size()) {
    throw RequestError(quoted(spec_) + ": " + std::to_string(counters.size()) +
                       " counters for a sketch of " + std::to_string(sketch_->counters().size()));
  }
  sketch_.reset();  // first: the largest sketches are 1 GiB
  sketch_ = std::make_unique<CountSketch>(width, key);
  sketch_->set_counters(counters);
}

uint64_t EmbeddingTable::rows() const { return spec_.dynamic ? live_rows_ : fixed_rows_; }

uint64_t EmbeddingTable::bytes() const {
  const uint64_t row_bytes = uint64_t(components()) * spec_.dim * sizeof(float);
  if (!spec_.dynamic) return fixed_rows_ * row_bytes;
  // Each component has the same slabs, of kSlabRows rows.
  return uint64_t(slabs_[0].size()) * kSlabRows * row_bytes + index_.bytes() +
         slot_ids_.capacity() * sizeof(uint64_t) + lru_.capacity() * sizeof(LruLink) +
         touched_at_.capacity() * sizeof(uint32_t) + (sketch_ ? sketch_->bytes() : 0);
}

float* EmbeddingTable::row(uint32_t component, uint64_t slot) const {
  if (!spec_.dynamic) return arrays_[component].get() + slot * spec_.dim;
  return slabs_[component][slot / kSlabRows] + (slot % kSlabRows) * spec_.dim;
}

void EmbeddingTable::init_row(uint64_t slot, uint64_t id) {
  initial_values(id, row(0, slot));
  for (uint32_t c = 1; c < components(); ++c)
    std::fill_n(row(c, slot), spec_.dim, optimizer_->slot_init(c - 1));
}

void EmbeddingTable::initial_values(uint64_t id, float* w) const {
  const InitConfig& in = spec_.init;
  for (uint32_t j = 0; j < spec_.dim; ++j) {
    switch (in.kind) {
      case InitKind::kConstant:
        w[j] = in.a;
        break;
      case InitKind::kUniform:
        w[j] = in.a + (in.b - in.a) * unit_uniform(in.seed, id, j);
        break;
      case InitKind::kNormal:
        w[j] = in.a + in.b * unit_normal(in.seed, id, j);
        break;
      case InitKind::kTruncatedNormal: {
        // Redrawn beyond two standard deviations, as TF's truncated_normal.
        float z = unit_normal(in.seed, id, j);
        for (uint64_t k = 1; std::fabs(z) > 2.0f; ++k)
          z = unit_normal(in.seed, id, j + k * spec_.dim);
        w[j] = in.a + in.b * z;
        break;
      }
      default:
        w[j] = 0.0f;
    }
  }
}

uint32_t EmbeddingTable::take_free_slot() {
  if (!free_slots_.empty()) {
    const uint32_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  const uint64_t s = slots_used_;
  if (s >= kEmpty - 1)
    throw RequestError(quoted(spec_) + " holds the most rows one shard can (2^32 - 2)");
  if (s / kSlabRows >= slabs_[0].size()) add_slabs();
  ++slots_used_;
  if (spec_.on_limit == OnRowLimit::kEvictLru) {
    slot_ids_.push_back(0);
    lru_.push_back(LruLink{});
  }
  if (expires()) touched_at_.push_back(0);  // stamped by find_or_insert
  return static_cast<uint32_t>(s);
}

void EmbeddingTable::lru_unlink(uint32_t s) {
  const LruLink link = lru_[s];
  (link.prev == kEmpty ? lru_head_ : lru_[link.prev].next) = link.next;
  (link.next == kEmpty ? lru_tail_ : lru_[link.next].prev) = link.prev;
  lru_[s] = LruLink{};
}

void EmbeddingTable::lru_push_front(uint32_t s) {
  lru_[s] = LruLink{kEmpty, lru_head_};
  if (lru_head_ != kEmpty) lru_[lru_head_].prev = s;
  lru_head_ = s;
  if (lru_tail_ == kEmpty) lru_tail_ = s;
}

void EmbeddingTable::touch(uint32_t s) {
  if (spec_.on_limit != OnRowLimit::kEvictLru || lru_head_ == s) return;
  lru_unlink(s);
  lru_push_front(s);
}

uint64_t EmbeddingTable::advance_to_step(int64_t step) {
  const int64_t since = step - step_;
  step_ = step;
  if (!expires() || since <= 0 || index_.size() == 0) return 0;
  // Each advance sweeps the part of the index that visits every entry
  // kSweepsPerExpiry times in expire_after_steps steps (all of it when
  // steps come faster): a row goes within expire_after_steps * (1 + 1 /
  // kSweepsPerExpiry) steps of its last touch, and no step does much work.
  const uint64_t capacity = index_.capacity();
  // A jump of expire_after_steps or more (a job started or restored at a
  // later step) leaves every row due, whatever its 32-bit stamp reads.
  const bool all_due = static_cast<uint64_t>(since) >= spec_.expire_after_steps;
  const long double share = static_cast<long double>(since) * kSweepsPerExpiry /
                            static_cast<long double>(spec_.expire_after_steps);
  const uint64_t count =
      share >= 1 ? capacity
                 : std::min<uint64_t>(capacity, static_cast<uint64_t>(share * capacity) + 1);
  const auto after = static_cast<int32_t>(spec_.expire_after_steps);
  const uint32_t now = stamp();
  const uint64_t dropped = index_.erase_in(sweep_at_, count, [&](uint64_t, uint32_t slot) {
    // Steps since the touch, modulo 2^32: exact while a row is swept at least every 2^31 steps.
    if (!all_due && static_cast<int32_t>(now - touched_at_[slot]) < after) return false;
    if (spec_.on_limit == OnRowLimit::kEvictLru) lru_unlink(slot);
    free_slots_.push_back(slot);
    --live_rows_;
    return true;
  });
  sweep_at_ = (sweep_at_ + count) & (capacity - 1);
  rows_expired_ += dropped;
  return dropped;
}

void EmbeddingTable::evict_one() {
  const uint32_t victim = lru_tail_;
  lru_unlink(victim);
  index_.erase(slot_ids_[victim]);
  free_slots_.push_back(victim);
  --live_rows_;
  ++evictions_;
}

void EmbeddingTable::find_slots(std::span<const uint64_t> ids, std::vector<uint64_t>& slots) {
  const std::size_t n = ids.size(), parts = parts_for(n);
  const bool checked = checked_.valid && checked_.index_changes == index_.changes() &&
                       std::equal(ids.begin(), ids.end(), checked_.ids.begin(), checked_.ids.end());
  checked_.valid = false;
  if (checked) {
    slots.swap(checked_.slots);
    return;
  }
  slots.resize(n);
  // Lookups only read the index: in parts by position range.
  for_parts(parts, [&](std::size_t p) {
    const auto [lo, hi] = part_range(n, parts, p);
    for (std::size_t i = lo; i < hi; ++i) {
      if (i + kIndexAhead < hi) index_.prefetch(ids[i + kIndexAhead]);
      slots[i] = find(ids[i]);
    }
  });
}

void EmbeddingTable::find_and_touch(std::span<const uint64_t> ids, std::vector<uint64_t>& slots) {
  find_slots(ids, slots);
  touch_slots(slots);
}

void EmbeddingTable::touch_slots(const std::vector<uint64_t>& slots) {
  if (expires()) {
    constexpr std::size_t kAhead = 16;
    const std::size_t n = slots.size();
    const uint32_t now = stamp();
    for (std::size_t i = 0; i < n; ++i) {
      if (i + kAhead < n && slots[i + kAhead] != kEmpty)
        __builtin_prefetch(&touched_at_[slots[i + kAhead]], 1);
      if (slots[i] != kEmpty) touched_at_[slots[i]] = now;
    }
  }
  if (spec_.on_limit != OnRowLimit::kEvictLru) return;
  const std::size_t n = slots.size();
  // Each touch unlinks a node whose neighbours are anywhere in the list: a
  // slot's node is asked for kNodeAhead positions ahead, and once it is in,
  // kNeighbourAhead positions ahead, its neighbours (if they move before
  // then, the fetch was only wasted).
  constexpr std::size_t kNodeAhead = 16, kNeighbourAhead = 8;
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kNodeAhead < n && slots[i + kNodeAhead] != kEmpty)
      __builtin_prefetch(&lru_[slots[i + kNodeAhead]], 1);
    if (i + kNeighbourAhead < n && slots[i + kNeighbourAhead] != kEmpty) {
      const LruLink link = lru_[slots[i + kNeighbourAhead]];
      if (link.prev != kEmpty) __builtin_prefetch(&lru_[link.prev], 1);
      if (link.next != kEmpty) __builtin_prefetch(&lru_[link.next], 1);
    }
    if (slots[i] != kEmpty) touch(static_cast<uint32_t>(slots[i]));
  }
}

uint32_t EmbeddingTable::find_or_insert(uint64_t id) {
  uint32_t s = find(id);
  if (s != kEmpty) {
    touch(s);
    return s;
  }
  if (spec_.row_limit != 0 && live_rows_ >= spec_.row_limit) {
    if (spec_.on_limit != OnRowLimit::kEvictLru) {
      throw RequestError(quoted(spec_) + " is at its limit of " + std::to_string(spec_.row_limit) +
                         " rows");
    }
    evict_one();
  }
  s = take_free_slot();
  if (expires()) touched_at_[s] = stamp();
  if (spec_.on_limit == OnRowLimit::kEvictLru) slot_ids_[s] = id;
  init_row(s, id);
  index_.insert(id, s);
  ++live_rows_;
  if (spec_.on_limit == OnRowLimit::kEvictLru) lru_push_front(s);
  return s;
}

uint64_t EmbeddingTable::local_slot(uint64_t id) {
  return spec_.dynamic ? find_or_insert(id) : placement_.local_row(id);
}

void EmbeddingTable::check_ids(std::span<const uint64_t> ids, const char* what) const {
  for (uint64_t id : ids) {
    if (!spec_.dynamic && id >= spec_.rows) {
      throw RequestError(std::string(what) + ": id " + std::to_string(id) + " is outside " +
                         quoted(spec_) + " of " + std::to_string(spec_.rows) + " rows");
    }
    if (placement_.shard_of(id) != shard_) {
      throw RequestError(std::string(what) + ": id " + std::to_string(id) + " of " + quoted(spec_) +
                         " belongs on shard " + std::to_string(placement_.shard_of(id)) + ", not " +
                         std::to_string(shard_) + " (clients disagree on the number of shards?)");
    }
  }
}

bool EmbeddingTable::creates(uint64_t id, Creating creating) const {
  if (creating == Creating::kNone) return false;
  if (!sketch_ || creating == Creating::kAll) return true;
  return creating == Creating::kByPush && sketch_->count(id) + 1 >= spec_.min_count;
}

uint64_t EmbeddingTable::check(std::span<const uint64_t> ids, const char* what,
                               Creating creating) const {
  if (!spec_.dynamic) {
    check_ids(ids, what);
    return 0;
  }
  // A refused check keeps none of its scratch: no request follows it that
  // would give it back.
  const auto forget = [this] {
    checked_ = Checked{};
    seen_ = FirstPositions{};
  };
  uint64_t missing = 0;  // distinct ids not held
  seen_.reset(ids.size());
  checked_.valid = false;
  checked_.slots.resize(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const uint64_t id = ids[k];
    if (k + kIndexAhead < ids.size()) index_.prefetch(ids[k + kIndexAhead]);
    if (placement_.shard_of(id) != shard_) {
      forget();
      check_ids(ids.subspan(k, 1), what);
    }
    const uint32_t slot = find(id);
    checked_.slots[k] = slot;
    if (slot == kEmpty && seen_.first(id, uint32_t(k)) == k && creates(id, creating)) ++missing;
  }
  checked_.ids.assign(ids.begin(), ids.end());
  checked_.index_changes = index_.changes();
  checked_.valid = true;
  if (spec_.row_limit == 0 || missing == 0) return missing;
  if (spec_.on_limit == OnRowLimit::kRefuse && live_rows_ + missing > spec_.row_limit) {
    forget();
    throw RequestError(std::string(what) + ": " + quoted(spec_) + " is at its limit of " +
                       std::to_string(spec_.row_limit) + " rows on shard " +
                       std::to_string(shard_) + " (it holds " + std::to_string(live_rows_) +
                       "; this request adds " + std::to_string(missing) + " new ids)");
  }
  if (spec_.on_limit == OnRowLimit::kEvictLru && ids.size() > spec_.row_limit) {
    // Rows of this request must not evict each other.
    uint64_t distinct = 0;
    seen_.reset(ids.size());
    for (std::size_t k = 0; k < ids.size(); ++k) {
      distinct += seen_.first(ids[k], uint32_t(k)) == k &&
                  (checked_.slots[k] != kEmpty || creates(ids[k], creating));
    }
    if (distinct > spec_.row_limit) {
      forget();
      throw RequestError(std::string(what) + ": " + std::to_string(distinct) + " distinct ids of " +
                         quoted(spec_) + " in one request, over its limit of " +
                         std::to_string(spec_.row_limit) + " rows on shard " +
                         std::to_string(shard_));
    }
  }
  return missing;
}

std::size_t EmbeddingTable::parts_for(std::size_t n) const {
  if (run_parts_.threads <= 1 || !run_parts_.run) return 1;
  // A few parts a thread, so that one thread late to start (the pool busy
  // elsewhere) leaves little for the others to wait on.
  const std::size_t most = std::min<std::size_t>(kMaxParts, 4 * run_parts_.threads);
  return std::clamp<std::size_t>(n / kPartRows, 1, most);
}

void EmbeddingTable::for_parts(std::size_t parts, const PartFn& fn) {
  if (parts > 1) return run_parts_.run(parts, fn);
  fn(0);
}

std::size_t EmbeddingTable::scratch_bytes() const {
  std::size_t b = push_slots_.capacity() * sizeof(uint64_t) +
                  (checked_.ids.capacity() + checked_.slots.capacity()) * sizeof(uint64_t) +
                  summed_at_.capacity() * sizeof(uint64_t) +
                  part_order_.capacity() * sizeof(uint32_t) + seen_.bytes() +
                  (admitted_ids_.capacity() + dropped_ids_.capacity() + admit_slots_.capacity()) *
                      sizeof(uint64_t) +
                  admitted_grads_.capacity() * sizeof(float) + admitted_at_.capacity();
  for (const PartSums& p : part_sums_) b += p.seen.bytes() + p.sums.capacity() * sizeof(float);
  return b;
}

EmbeddingTable::ReleaseScratchAfter::~ReleaseScratchAfter() {
  const std::size_t bytes = table.scratch_bytes();
  if (ids <= kKeepScratchIds && bytes <= kKeepScratchBytes) {
    // Kept if the process's total stays within kKeepScratchTotal with it.
    std::size_t total = kept_scratch.load();
    for (;;) {
      const std::size_t others = total - table.kept_scratch_;
      if (others + bytes > kKeepScratchTotal) break;
      if (kept_scratch.compare_exchange_weak(total, others + bytes)) {
        table.kept_scratch_ = bytes;
        return;
      }
    }
  }
  table.release_scratch();
}

void EmbeddingTable::release_scratch() {
  // Swapped with empty ones: assigning {} would keep the capacity.
  std::vector<uint64_t>().swap(push_slots_);
  checked_ = Checked{};
  std::vector<uint64_t>().swap(summed_at_);
  std::vector<uint32_t>().swap(part_order_);
  std::vector<PartSums>().swap(part_sums_);
  seen_ = FirstPositions{};
  // Admission's, but the dropped ids, which count_dropped() reads after the
  // update (and gives back itself).
  std::vector<uint64_t>().swap(admitted_ids_);
  std::vector<uint64_t>().swap(admit_slots_);
  std::vector<float>().swap(admitted_grads_);
  std::vector<char>().swap(admitted_at_);
  // The dropped ids too once counted (an inner release, apply_push's, comes
  // before count_dropped() reads them): what is left stays in the total.
  if (dropped_ids_.empty()) std::vector<uint64_t>().swap(dropped_ids_);
  const std::size_t left = scratch_bytes();
  kept_scratch.fetch_add(left);
  kept_scratch.fetch_sub(kept_scratch_);
  kept_scratch_ = left;
}

void EmbeddingTable::pull(std::span<const uint64_t> ids, float* out) { read_rows(ids, out, true); }

void EmbeddingTable::lookup(std::span<const uint64_t> ids, float* out) {
  read_rows(ids, out, false);
}

void EmbeddingTable::read_rows(std::span<const uint64_t> ids, float* out, bool pull) {
  const bool create = pull && !sketch_;  // admission by count: rows come by pushes only
  const ReleaseScratchAfter release{*this, ids.size()};
  const std::size_t row_bytes = spec_.dim * sizeof(float);
  const std::size_t n = ids.size(), parts = parts_for(n);
  // Rows are random reads from a large array: the rows a few positions
  // ahead are asked for while this one is copied, so their cache misses
  // overlap. Each part copies a range of positions.
  constexpr std::size_t kAhead = 8;
  if (!spec_.dynamic) {
    with_row_bytes(row_bytes, [&](auto bytes) {
      for_parts(parts, [&](std::size_t p) {
        const auto [lo, hi] = part_range(n, parts, p);
        // Locals, not members or captures, which a row's copy might alias:
        // the compiler would load them again for every row.
        const RowPlacement place = placement_;
        const std::size_t dim = spec_.dim;
        const float* const values = arrays_[0].get();
        const uint64_t* const id = ids.data();
        float* const dst = out;
        for (std::size_t i = lo; i < hi; ++i) {
          if (i + kAhead < hi) prefetch_row(values + place.local_row(id[i + kAhead]) * dim, bytes);
          std::memcpy(dst + i * dim, values + place.local_row(id[i]) * dim, bytes);
        }
      });
    });
    return;
  }
  // Rows are found through the index (the entries of the ids kIndexAhead
  // positions ahead asked for early). Existing rows go to the LRU front
  // first and are copied, then missing ones are created (evicting others:
  // check() allowed no more distinct ids than the limit), one after another.
  // A lookup moves nothing and writes a missing row's initial values only
  // into `out`; so does a pull of an id not yet admitted by count (a pull
  // of a held row still moves it to the LRU front).
  std::vector<uint64_t>& slots = push_slots_;
  if (pull) {
    find_and_touch(ids, slots);
  } else {
    find_slots(ids, slots);
  }
  with_row_bytes(row_bytes, [&](auto bytes) {
    for_parts(parts, [&](std::size_t p) {
      const auto [lo, hi] = part_range(n, parts, p);
      const uint64_t* const slot = slots.data();  // locals, as above
      const std::size_t dim = spec_.dim;
      float* const dst = out;
      for (std::size_t i = lo; i < hi; ++i) {
        if (i + kAhead < hi && slot[i + kAhead] != kEmpty)
          prefetch_row(row(0, slot[i + kAhead]), bytes);
        if (slot[i] != kEmpty) std::memcpy(dst + i * dim, row(0, slot[i]), bytes);
      }
    });
  });
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] != kEmpty) continue;
    if (create) {
      std::memcpy(out + i * spec_.dim, row(0, find_or_insert(ids[i])), row_bytes);
    } else {
      initial_values(ids[i], out + i * spec_.dim);
    }
  }
}

void EmbeddingTable::push(std::span<const uint64_t> ids, std::span<const float> grads, float scale,
                          Repeats repeats) {
  // Unchecked: a sender's word is not enough here (its gradients may be
  // outside the safe bound).
  if (repeats == Repeats::kSenderSaysNone) repeats = Repeats::kMaybe;
  // Judged by the request as sent: admission may pass apply_push far fewer ids.
  const ReleaseScratchAfter release{*this, ids.size()};
  const Admitted a = admit(ids, grads);
  apply_push(a.ids, a.grads, scale, /*check_first=*/false, repeats);
  count_dropped();
}

EmbeddingTable::Admitted EmbeddingTable::admit(std::span<const uint64_t> ids,
                                               std::span<const float> grads) {
  dropped_ids_.clear();
  if (!sketch_) return {ids, grads};
  // The slots check() found for these ids (or found again); each missing id
  // decided once, at its first position, its repeats following it.
  const std::size_t n = ids.size();
  std::vector<uint64_t>& slots = admit_slots_;
  find_slots(ids, slots);
  admitted_at_.assign(n, 1);
  seen_.reset(n);
  for (std::size_t k = 0; k < n; ++k) {
    if (slots[k] != kEmpty) continue;
    const uint32_t first = seen_.first(ids[k], uint32_t(k));
    if (first != k) {
      admitted_at_[k] = admitted_at_[first];
    } else if (sketch_->count(ids[k]) + 1 < spec_.min_count) {
      admitted_at_[k] = 0;
      dropped_ids_.push_back(ids[k]);
    }
  }
  // What the push applies, with its slots kept for apply_push (as check()
  // keeps them), so that it does not look them up again.
  if (dropped_ids_.empty()) {
    keep_slots(ids, slots);
    return {ids, grads};
  }
  const uint32_t dim = spec_.dim;
  admitted_ids_.clear();
  admitted_grads_.clear();
  std::size_t kept = 0;
  for (std::size_t k = 0; k < n; ++k) {
    if (!admitted_at_[k]) continue;
    admitted_ids_.push_back(ids[k]);
    slots[kept++] = slots[k];
    admitted_grads_.insert(admitted_grads_.end(), grads.begin() + k * dim,
                           grads.begin() + (k + 1) * dim);
  }
  slots.resize(kept);
  keep_slots(admitted_ids_, slots);
  return {admitted_ids_, admitted_grads_};
}

void EmbeddingTable::keep_slots(std::span<const uint64_t> ids, std::vector<uint64_t>& slots) {
  checked_.ids.assign(ids.begin(), ids.end());
  checked_.slots.swap(slots);
  checked_.index_changes = index_.changes();
  checked_.valid = true;
}

void EmbeddingTable::count_dropped() {
  for (uint64_t id : dropped_ids_) sketch_->add(id);
  ids_filtered_ += dropped_ids_.size();
  forget_dropped();
}

void EmbeddingTable::forget_dropped() {
  if (dropped_ids_.capacity() > kKeepScratchIds) {
    std::vector<uint64_t>().swap(dropped_ids_);
  } else {
    dropped_ids_.clear();
  }
}

bool EmbeddingTable::push_if_finite(std::span<const uint64_t> ids, std::span<const float> grads,
                                    float scale, uint64_t new_rows,
                                    std::optional<bool> within_bound, Repeats repeats) {
  // Where the optimizer bounds what such gradients can do (SGD, Adagrad), no
  // row, held or new, can become NaN or Inf: one pass over the gradients
  // instead of one over the rows.
  // Gradients within the bound for all the ids are within it for the
  // admitted ones (the bound only grows as the ids get fewer).
  const float bound = safe_gradient_bound(scale, ids.size());
  const bool safe = bound > 0 && (within_bound ? *within_bound : all_finite(grads, bound));
  const ReleaseScratchAfter release{*this, ids.size()};  // as push()'s
  const Admitted a = admit(ids, grads);
  if (new_rows > 0 && !safe) {
    if (!update_finite(a.ids, a.grads, scale)) {
      forget_dropped();
      return false;
    }
    apply_push(a.ids, a.grads, scale, /*check_first=*/false,
               repeats == Repeats::kSenderSaysNone ? Repeats::kMaybe : repeats);
  } else if (!apply_push(a.ids, a.grads, scale, /*check_first=*/!safe, repeats)) {
    forget_dropped();
    return false;
  }
  count_dropped();
  return true;
}

void EmbeddingTable::group_slots_by_part(std::size_t parts) {
  const std::vector<uint64_t>& slots = push_slots_;
  const std::size_t n = slots.size();
  part_begin_.assign(parts + 1, 0);
  if (parts == 1) {  // every position, in order: no list needed
    part_order_.clear();
    part_begin_[1] = static_cast<uint32_t>(n);
    return;
  }
  part_order_.resize(n);
  // A counting sort of the positions by their slot's part: stable, so each
  // part's positions stay in request order.
  auto part_of = [parts](uint64_t slot) { return ((mix_id(slot) >> 32) * parts) >> 32; };
  for (uint64_t slot : slots) ++part_begin_[part_of(slot) + 1];
  for (std::size_t p = 0; p < parts; ++p) part_begin_[p + 1] += part_begin_[p];
  std::vector<uint32_t> next(part_begin_.begin(), part_begin_.end() - 1);
  for (std::size_t i = 0; i < n; ++i)
    part_order_[next[part_of(slots[i])]++] = static_cast<uint32_t>(i);
}

void EmbeddingTable::sum_repeats(std::size_t part, const float* grads) {
  const uint32_t dim = spec_.dim;
  PartSums& p = part_sums_[part];
  p.seen.reset(part_begin_[part + 1] - part_begin_[part]);
  p.sums.clear();
  auto position = [&](uint32_t i) {
    const uint32_t m = p.seen.first(push_slots_[i], i);
    if (m == i) {
      summed_at_[i] = kOwnGradient;
      return;
    }
    // A repeat: the row's gradients are summed in request order (as the
    // first position's gradient plus each later one's).
    if (summed_at_[m] == kOwnGradient) {
      summed_at_[m] = (p.sums.size() / dim) << kPartBits | part;
      p.sums.insert(p.sums.end(), grads + std::size_t(m) * dim, grads + std::size_t(m + 1) * dim);
    }
    float* sum = p.sums.data() + (summed_at_[m] >> kPartBits) * dim;
    for (uint32_t j = 0; j < dim; ++j) sum[j] += grads[std::size_t(i) * dim + j];
    summed_at_[i] = kRepeat;
  };
  if (part_order_.empty()) {  // one part
    for (uint32_t i = 0; i < part_begin_[1]; ++i) position(i);
  } else {
    const std::span<const uint32_t> positions(part_order_.data() + part_begin_[part],
                                              part_begin_[part + 1] - part_begin_[part]);
    for (const uint32_t i : positions) position(i);
  }
}

const float* EmbeddingTable::summed_gradient(uint64_t at) const {
  return part_sums_[at & ((1u << kPartBits) - 1)].sums.data() + (at >> kPartBits) * spec_.dim;
}

bool EmbeddingTable::apply_push(std::span<const uint64_t> ids, std::span<const float> grads,
                                float scale, bool check_first, Repeats repeats) {
  const ReleaseScratchAfter release{*this, ids.size()};
  const uint32_t dim = spec_.dim;
  const std::size_t n = ids.size();
  std::vector<uint64_t>& slots = push_slots_;
  slots.resize(n);
  if (spec_.dynamic) {
    // The rows already held are found (and, with LRU eviction, touched)
    // before any new one is inserted, so that no insertion evicts a row of
    // this push; only the new ids are then inserted. A push checked first
    // creates no row (push_if_finite sends those through update_finite) and
    // touches its rows only once the check has passed: a refused push
    // leaves the LRU order as it was.
    if (check_first) {
      find_slots(ids, slots);
    } else {
      find_and_touch(ids, slots);
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (slots[i] == kEmpty) slots[i] = find_or_insert(ids[i]);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) slots[i] = placement_.local_row(ids[i]);
  }
  // Repeated rows are found and their gradients summed in parts by row (a
  // row's every position in one part). The updates then go in parts by
  // position range, reading the gradients in order: each row is updated
  // once, at its first position, so no two parts write the same row.
  // Without repeats, each position is its own row's only one: no search.
  // A sender's word is taken where a lie only makes its repeats separate
  // updates (Repeats): one part, updates that need no check.
  const std::size_t parts = parts_for(n);
  const bool search = repeats == Repeats::kMaybe ||
                      (repeats == Repeats::kSenderSaysNone && (parts > 1 || check_first));
  if (search) {
    group_slots_by_part(parts);
    summed_at_.resize(n);
    if (part_sums_.size() < parts) part_sums_.resize(parts);
    for_parts(parts, [&](std::size_t part) { sum_repeats(part, grads.data()); });
  }

  // One part's view of the request, its pointers in locals: read through
  // members or captures, they were loaded again after every row's
  // (virtual) optimizer call. A fixed table's rows come from its arrays'
  // bases. The rows a few positions ahead are fetched while this one is
  // worked on, as in pull.
  struct PartView {
    const EmbeddingTable& table;
    const uint64_t* slot;
    const uint64_t* at;  // summed_at_, or null: every position its row's only one
    const float* grads;
    uint32_t dim, comps;
    bool fixed;
    float* base[4] = {};
    float* row(uint32_t c, std::size_t i) const {
      return fixed ? base[c] + slot[i] * dim : table.row(c, slot[i]);
    }
    void prefetch(std::size_t i) const {
      for (uint32_t c = 0; c < comps; ++c)
        prefetch_row<RowAccess::kWrite>(row(c, i), dim * sizeof(float));
    }
    bool repeat(std::size_t i) const { return at != nullptr && at[i] == kRepeat; }
    const float* gradient(std::size_t i) const {
      return at == nullptr || at[i] == kOwnGradient ? grads + i * dim
                                                    : table.summed_gradient(at[i]);
    }
  };
  auto view = [&] {
    PartView v{*this,        slots.data(),  search ? summed_at_.data() : nullptr, grads.data(), dim,
               components(), !spec_.dynamic};
    for (uint32_t c = 0; v.fixed && c < v.comps; ++c) v.base[c] = arrays_[c].get();
    return v;
  };
  constexpr std::size_t kAhead = 8;
  const RowOptimizer* const optimizer = optimizer_.get();
  const RowOptimizer::Step step = optimizer->step(scale, version_ + 1);
  if (check_first) {
    // Each distinct row's update worked out without writing it (the same
    // arithmetic as the update): the table is untouched until every row is
    // known to stay finite, and the rows the second pass updates are then in
    // cache (a request is at most a few MiB).
    std::vector<char> finite(parts, 1);
    for_parts(parts, [&](std::size_t part) {
      const auto [lo, hi] = part_range(n, parts, part);
      const PartView v = view();
      const float* slot_ptrs[4];
      for (std::size_t i = lo; i < hi; ++i) {
        if (i + kAhead < hi) v.prefetch(i + kAhead);
        if (v.repeat(i)) continue;
        for (uint32_t c = 1; c < v.comps; ++c) slot_ptrs[c - 1] = v.row(c, i);
        if (!optimizer->stays_finite(v.row(0, i), slot_ptrs, v.gradient(i), v.dim, step)) {
          finite[part] = 0;
          return;
        }
      }
    });
    if (std::find(finite.begin(), finite.end(), 0) != finite.end()) return false;
    if (spec_.dynamic) touch_slots(slots);
  }
  ++version_;
  for_parts(parts, [&](std::size_t part) {
    const auto [lo, hi] = part_range(n, parts, part);
    const PartView v = view();
    float* slot_ptrs[4];
    for (std::size_t i = lo; i < hi; ++i) {
      if (!check_first && i + kAhead < hi) v.prefetch(i + kAhead);
      if (v.repeat(i)) continue;
      for (uint32_t c = 1; c < v.comps; ++c) slot_ptrs[c - 1] = v.row(c, i);
      optimizer->apply(v.row(0, i), slot_ptrs, v.gradient(i), v.dim, step);
    }
  });
  return true;
}

bool EmbeddingTable::update_finite(std::span<const uint64_t> ids, std::span<const float> grads,
                                   float scale) const {
  const uint32_t dim = spec_.dim, slots = components() - 1;
  // Each distinct id once, its gradients summed, as push() applies them.
  seen_.reset(ids.size());
  std::vector<float> g(grads.begin(), grads.end());
  std::vector<uint32_t> distinct;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const uint32_t m = seen_.first(ids[i], static_cast<uint32_t>(i));
    if (m == i) {
      distinct.push_back(m);
    } else {
      for (uint32_t j = 0; j < dim; ++j) g[std::size_t(m) * dim + j] += grads[i * dim + j];
    }
  }
  std::vector<float> w(dim), s(std::size_t(slots) * dim);
  const RowOptimizer::Step step = optimizer_->step(scale, version_ + 1);
  const float* row_ptrs[4];
  for (uint32_t i : distinct) {
    // The row as push() would find it: held, or (dynamic) created from the initializer.
    const uint64_t slot = spec_.dynamic ? find(ids[i]) : placement_.local_row(ids[i]);
    const float* values = w.data();
    if (spec_.dynamic && slot == kEmpty) {
      initial_values(ids[i], w.data());
      for (uint32_t c = 0; c < slots; ++c) {
        std::fill_n(s.data() + std::size_t(c) * dim, dim, optimizer_->slot_init(c));
        row_ptrs[c] = s.data() + std::size_t(c) * dim;
      }
    } else {
      values = row(0, slot);
      for (uint32_t c = 0; c < slots; ++c) row_ptrs[c] = row(c + 1, slot);
    }
    if (!optimizer_->stays_finite(values, row_ptrs, g.data() + std::size_t(i) * dim, dim, step))
      return false;
  }
  return true;
}

void EmbeddingTable::for_each_row(
    const std::function<void(uint64_t, const float*, std::span<const float* const>, uint32_t)>& fn)
    const {
  const float* slot_ptrs[4];
  const uint32_t now = stamp();
  auto emit = [&](uint64_t slot, uint64_t id) {
    for (uint32_t c = 1; c < components(); ++c) slot_ptrs[c - 1] = row(c, slot);
    fn(id, row(0, slot), std::span<const float* const>(slot_ptrs, components() - 1),
       expires() ? now - touched_at_[slot] : 0);
  };
  if (!spec_.dynamic) {
    for (uint64_t r = 0; r < fixed_rows_; ++r) emit(r, placement_.global_id(shard_, r));
    return;
  }
  if (spec_.on_limit == OnRowLimit::kEvictLru) {
    // Least recently used first: put_rows() puts each row it creates at the
    // front, so a restore of the rows in this order rebuilds the LRU order
    // (in index order, the rows a restored table evicted first were any).
    for (uint32_t s = lru_tail_; s != kEmpty; s = lru_[s].prev) emit(s, slot_ids_[s]);
    return;
  }
  index_.for_each([&](uint64_t id, uint32_t slot) { emit(slot, id); });
}

void EmbeddingTable::put_rows(std::span<const uint64_t> ids, const float* values,
                              std::span<const float* const> slots, std::span<const uint32_t> ages) {
  const ReleaseScratchAfter release{*this, ids.size()};
  const uint32_t dim = spec_.dim;
  std::vector<uint64_t>& where = push_slots_;
  if (spec_.dynamic) {
    find_and_touch(ids, where);
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (where[i] == kEmpty) where[i] = find_or_insert(ids[i]);
  } else {
    where.resize(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) where[i] = placement_.local_row(ids[i]);
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::memcpy(row(0, where[i]), values + i * dim, dim * sizeof(float));
    for (uint32_t c = 1; c < components() && c - 1 < slots.size(); ++c)
      std::memcpy(row(c, where[i]), slots[c - 1] + i * dim, dim * sizeof(float));
  }
  if (expires() && ages.size() == ids.size()) {
    // An age past expire_after_steps is due all the same: capped there, it
    // stays well inside the stamps' 2^31 range.
    const auto most = static_cast<uint32_t>(spec_.expire_after_steps);
    for (std::size_t i = 0; i < ids.size(); ++i)
      touched_at_[where[i]] = stamp() - std::min(ages[i], most);
  }
}

}  // namespace ps
