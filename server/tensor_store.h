// The tensors one psd shard holds: values, optimizer slots and version,
// each tensor guarded by its own lock so different tensors update in parallel.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "common/memory_budget.h"
#include "server/optimizer.h"
#include "common/part_meta.h"
#include "ps/tensor_spec.h"

namespace ps {

// What a caller already knows of an update, so that apply() and
// update_finite() check no more than they must.
struct KnownUpdate {
  // Every |grad value| is at most this (psd checks each gradient as it
  // arrives): within safe_gradient_bound(scale), the update cannot leave
  // NaN or Inf, and is not tried first.
  float grad_max = std::numeric_limits<float>::infinity();
  // The version at which update_finite() accepted this same update; while
  // the tensor is still at it, the check is not made again.
  std::optional<uint64_t> checked_version;
};

class StoredTensor {
 public:
  StoredTensor(uint64_t id, TensorSpec spec, std::optional<PartMeta> part);

  const TensorSpec& spec() const { return spec_; }
  const std::optional<PartMeta>& part() const { return part_; }
  uint64_t id() const { return id_; }
  std::size_t size() const { return size_; }

  // Copies the values out under a shared lock; returns the version read.
  uint64_t read(std::span<float> out) const;

  // The values as they are now, without a copy: an update made while a
  // view is held writes to a fresh copy of the values (copy on write), so
  // a view never changes. A pull sends a view straight from memory.
  struct View {
    std::shared_ptr<const std::vector<float>> values;
    uint64_t version = 0;
  };
  View view() const;
  // Applies scale * grad with the tensor's optimizer under an exclusive
  // lock. With `require_finite`, an update that would leave a value or slot
  // NaN or Inf (Optimizer::result_finite) is not applied: false, nothing
  // changed (version included).
  bool apply(std::span<const float> grad, float scale, bool require_finite = true,
             const KnownUpdate& known = {});
  uint64_t version() const;
  // Whether apply(grad, scale) would be accepted now (Optimizer::result_finite);
  // `grad_max` as KnownUpdate's; `version` (if given) gets the version it was decided at.
  bool update_finite(std::span<const float> grad, float scale,
                     float grad_max = std::numeric_limits<float>::infinity(),
                     uint64_t* version = nullptr) const;
  // The optimizer's: gradients within it need no check (Optimizer::safe_gradient_bound).
  float safe_gradient_bound(float scale) const { return optimizer_->safe_gradient_bound(scale); }
  // Whether gradients of at most grad_max in magnitude are within it (0: no bound).
  bool within_safe_bound(float grad_max, float scale) const {
    const float bound = safe_gradient_bound(scale);
    return bound > 0 && grad_max <= bound;
  }

  // A consistent copy of values, slots and version (for checkpoints), taken
  // under the shared lock: updates wait only for the copy.
  struct Snapshot {
    std::vector<float> values;
    std::vector<std::vector<float>> slots;
    uint64_t version = 0;
  };
  Snapshot snapshot() const;
  std::size_t num_slots() const { return slots_.size(); }

 private:
  const uint64_t id_;
  const TensorSpec spec_;  // init values are dropped once used
  const std::optional<PartMeta> part_;
  const std::unique_ptr<Optimizer> optimizer_;
  const std::size_t size_;
  mutable std::shared_mutex mutex_;
  std::shared_ptr<std::vector<float>> values_;  // shared with views (see view())
  std::vector<std::vector<float>> slots_;
  uint64_t version_ = 0;
};

struct StoreLimits {
  uint64_t max_tensor_bytes = 1ull << 32;  // one tensor (or part)
  uint64_t max_total_bytes = 1ull << 40;
  uint64_t max_tensors = 1u << 20;
  uint64_t max_tables = 1u << 16;  // embedding tables (each walked by every status page)
};

class TensorStore {
 public:
  // With a `budget`, each tensor's values and optimizer slots count against
  // it, and a create that does not fit is refused (the budget must outlive the store).
  explicit TensorStore(StoreLimits limits = {}, MemoryBudget* budget = nullptr);

  // Creates the tensor, or returns the existing one (second = false) when one
  // with the same shape exists. A spec carrying slots / version (a restore)
  // starts the tensor with them; an existing tensor keeps its own state. Throws RequestError for a
  // different shape or part layout, an invalid spec, or a limit exceeded.
  std::pair<StoredTensor*, bool> create(const TensorSpec& spec,
                                        const std::optional<PartMeta>& part);

  // New tensors of one request, counted against the shard's limits as if
  // already created (validate below). With a memory budget, `bytes` counts
  // each tensor's values and optimizer slots; without, its values.
  struct Pending {
    uint64_t bytes = 0;
    std::size_t tensors = 0;
  };

  // Whether a spec to validate carries its initial values and restored
  // slots, or leaves them out (their lengths and finiteness checked by the
  // client; the number of slots still counts): wire::Shard create's
  // valuesLeftOut.
  enum class Values { kGiven, kLeftOut };

  // Checks what create() would check, without creating anything. With
  // `pending`, the limits also count the tensors validated into it before
  // (a request's earlier specs), and this one, if new, is added to it: each
  // spec of a request can fit alone while all of them do not.
  void validate(const TensorSpec& spec, const std::optional<PartMeta>& part,
                Pending* pending = nullptr, Values values = Values::kGiven) const;

  StoredTensor* find(const std::string& name) const;
  StoredTensor& get(const std::string& name) const;  // throws RequestError naming the tensor
  std::vector<StoredTensor*> all() const;            // in name order
  std::size_t count() const;
  uint64_t bytes() const;
  // Drops every tensor: for a restore that failed part way, before anything
  // can hold a pointer to one.
  void clear();

  // Bytes a tensor of `n` elements holds with its optimizer's slots and its
  // bookkeeping (the StoredTensor, its spec, the map's node, its names and
  // lists): many tiny tensors must not hold more memory than the budget counts.
  static uint64_t footprint(const TensorSpec& spec, uint64_t n,
                            const std::optional<PartMeta>& part);

 private:
  void validate_locked(const TensorSpec& spec, const std::optional<PartMeta>& part,
                       Pending* pending, Values values) const;

  static constexpr uint64_t kTensorBookkeepingBytes = 1024;
  static constexpr uint64_t kNameCopies = 3;

  const StoreLimits limits_;
  MemoryBudget* const budget_;
  mutable std::mutex mutex_;
  MemoryBudget::Reservation reserved_;  // every tensor's footprint
  std::map<std::string, std::unique_ptr<StoredTensor>, std::less<>> tensors_;
  uint64_t bytes_ = 0;
  uint64_t next_id_ = 0;
};

}  // namespace ps
