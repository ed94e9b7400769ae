#include "server/tensor_store.h"

#include <cmath>
#include <cstdint>

#include "common/finite.h"
#include "common/tensor_name.h"
#include "server/initializer.h"
#include "ps/errors.h"
#include "ps/job.h"

namespace ps {

StoredTensor::StoredTensor(uint64_t id, TensorSpec spec, std::optional<PartMeta> part)
    : id_(id),
      spec_([&] {
        TensorSpec s = spec;
        s.init.values.clear();
        s.init.values.shrink_to_fit();
        s.slots.clear();  // restore state lives in slots_ / version_ only
        s.slots.shrink_to_fit();
        return s;
      }()),
      part_(std::move(part)),
      optimizer_(make_optimizer(spec.optimizer)),
      size_(spec.num_elements()),
      values_(std::make_shared<std::vector<float>>(size_)) {
  initialize(*values_, spec.init, part_ ? part_->full_shape : spec.shape, part_ ? part_->index : 0);
  slots_ = optimizer_->make_slots(size_);
  if (!spec.slots.empty()) slots_ = std::move(spec.slots);  // restore (validated by TensorStore)
  version_ = spec.version;
}

StoredTensor::Snapshot StoredTensor::snapshot() const {
  Snapshot s;
  std::shared_lock lock(mutex_);
  s.values = *values_;
  s.slots = slots_;
  s.version = version_;
  return s;
}

uint64_t StoredTensor::read(std::span<float> out) const {
  std::shared_lock lock(mutex_);
  std::copy(values_->begin(), values_->end(), out.begin());
  return version_;
}

StoredTensor::View StoredTensor::view() const {
  std::shared_lock lock(mutex_);
  return {values_, version_};
}

bool StoredTensor::apply(std::span<const float> grad, float scale, bool require_finite,
                         const KnownUpdate& known) {
  std::unique_lock lock(mutex_);
  if (require_finite && known.checked_version != version_ &&
      !within_safe_bound(known.grad_max, scale) &&
      !optimizer_->result_finite(*values_, grad, slots_, static_cast<int64_t>(version_), scale)) {
    return false;
  }
  // Views are only taken under the shared lock, so none can appear now; a
  // count that is stale high (a view being dropped) costs one copy.
  if (values_.use_count() > 1) {
    values_ = std::make_shared<std::vector<float>>(*values_);
  } else {
    // use_count() is a relaxed read: an acquire on the count (a copy's
    // increment) orders the last view holder's reads before the writes below.
    std::shared_ptr<std::vector<float>>(values_).reset();
  }
  optimizer_->apply(*values_, grad, slots_, static_cast<int64_t>(version_), scale);
  ++version_;
  return true;
}

bool StoredTensor::update_finite(std::span<const float> grad, float scale, float grad_max,
                                 uint64_t* version) const {
  std::shared_lock lock(mutex_);
  if (version != nullptr) *version = version_;
  if (within_safe_bound(grad_max, scale)) return true;
  return optimizer_->result_finite(*values_, grad, slots_, static_cast<int64_t>(version_), scale);
}

uint64_t StoredTensor::version() const {
  std::shared_lock lock(mutex_);
  return version_;
}

TensorStore::TensorStore(StoreLimits limits, MemoryBudget* budget)
    : limits_(limits),
      budget_(budget),
      reserved_(budget ? budget->reserve_anyway(MemoryUse::kTensors, 0)
                       : MemoryBudget::Reservation()) {}

uint64_t TensorStore::footprint(const TensorSpec& spec, uint64_t n,
                                const std::optional<PartMeta>& part) {
  const uint64_t names = spec.name.size() + (part ? part->full_name.size() : 0);
  // The spec and the optimizer each keep the boundaries.
  const uint64_t lists = sizeof(int64_t) * (2 * spec.optimizer.boundaries.size() +
                                            (part ? part->full_shape.size() : 0));
  return n * sizeof(float) * (1 + make_optimizer(spec.optimizer)->make_slots(0).size()) +
         kTensorBookkeepingBytes + kNameCopies * names + lists;
}

void TensorStore::validate(const TensorSpec& spec, const std::optional<PartMeta>& part,
                           Pending* pending, Values values) const {
  std::lock_guard lock(mutex_);
  validate_locked(spec, part, pending, values);
}

void TensorStore::validate_locked(const TensorSpec& spec, const std::optional<PartMeta>& part,
                                  Pending* pending, Values values) const {
  const std::string& name = spec.name;
  check_name(name, "create: tensor");
  if (part) check_name(part->full_name, "create: split tensor");
  if (spec.shape.size() > kMaxDims || (part && part->full_shape.size() > kMaxDims))
    throw RequestError("create: tensor '" + name + "' has more than " + std::to_string(kMaxDims) +
                       " dimensions");
  uint64_t n = 1;
  for (uint64_t d : spec.shape) {
    if (d == 0)
      throw RequestError("create: tensor '" + name + "' has a zero dimension in shape " +
                         shape_to_string(spec.shape));
    if (n > limits_.max_tensor_bytes / d)
      n = limits_.max_tensor_bytes;  // saturate; rejected below
    else
      n *= d;
  }
  if (n * sizeof(float) > limits_.max_tensor_bytes) {
    throw RequestError("create: tensor '" + name + "' of shape " + shape_to_string(spec.shape) +
                       " is over this shard's limit of " +
                       std::to_string(limits_.max_tensor_bytes) + " bytes");
  }
  validate_optimizer(spec.optimizer);
  validate_initializer(spec.init, name, part ? part->full_shape : spec.shape);
  // The update count feeds the schedule and Adam's bias correction as a
  // step: past kMaxStep (a crafted restore) they turn NaN.
  if (spec.version > static_cast<uint64_t>(kMaxStep)) {
    throw RequestError("create: tensor '" + name + "' is restored with " +
                       std::to_string(spec.version) +
                       " updates applied, over the largest step (2^62)");
  }
  const bool given = values == Values::kGiven;
  if (given && spec.init.kind == InitKind::kValues && spec.init.values.size() != n) {
    throw RequestError("create: tensor '" + name + "' has " + std::to_string(n) + " elements but " +
                       std::to_string(spec.init.values.size()) + " initial values");
  }
  if (!all_finite(spec.init.values))
    throw RequestError("create: tensor '" + name + "' has a NaN or Inf initial value");
  if (!spec.slots.empty()) {
    const std::size_t want = make_optimizer(spec.optimizer)->make_slots(0).size();
    if (spec.slots.size() != want) {
      throw RequestError("create: tensor '" + name + "' is restored with " +
                         std::to_string(spec.slots.size()) +
                         " optimizer slots; its optimizer has " + std::to_string(want));
    }
    for (std::size_t k = 0; given && k < spec.slots.size(); ++k) {
      if (spec.slots[k].size() != n) {
        throw RequestError("create: tensor '" + name + "' has " + std::to_string(n) +
                           " elements but a restored slot of " +
                           std::to_string(spec.slots[k].size()));
      }
      if (!all_finite(spec.slots[k])) {
        throw RequestError("create: tensor '" + name + "' has a NaN or Inf restored slot value");
      }
    }
    if (given) {
      try {
        validate_slots(spec.optimizer, spec.slots);
      } catch (const RequestError& e) {
        throw RequestError("create: tensor '" + name + "': " + e.what());
      }
    }
  }
  if (part) {
    // A logical shape whose element count overflows holds no part (its
    // initializer's fans would wrap too).
    uint64_t full = 1;
    bool overflow = false;
    for (uint64_t d : part->full_shape) {
      if (d != 0 && full > UINT64_MAX / d)
        overflow = true;
      else
        full *= d;
    }
    if (overflow || part->count == 0 || part->index >= part->count || part->offset > full ||
        n > full - part->offset) {
      throw RequestError("create: part " + std::to_string(part->index) + " of '" + part->full_name +
                         "' does not fit its tensor");
    }
  }
  if (auto it = tensors_.find(name); it != tensors_.end()) {
    const StoredTensor& t = *it->second;
    if (t.spec().shape != spec.shape) {
      throw RequestError("create: tensor '" + name + "' exists with shape " +
                         shape_to_string(t.spec().shape) + ", not " + shape_to_string(spec.shape));
    }
    if (t.part() != part)
      throw RequestError("create: tensor '" + name + "' exists with another part layout");
    return;
  }
  // Pending counts can come from a client (create's pendingTensors): no sums that could wrap.
  const Pending before = pending != nullptr ? *pending : Pending{};
  if (before.tensors >= limits_.max_tensors ||
      tensors_.size() >= limits_.max_tensors - before.tensors) {
    throw RequestError("create: this shard holds its maximum number of tensors");
  }
  if (before.bytes > limits_.max_total_bytes ||
      bytes_ + n * sizeof(float) > limits_.max_total_bytes - before.bytes) {
    throw RequestError("create: tensor '" + name +
                       "' would take this shard over its memory limit of " +
                       std::to_string(limits_.max_total_bytes) + " bytes");
  }
  if (budget_ != nullptr) {
    const uint64_t need = footprint(spec, n, part);
    const uint64_t free = budget_->available();
    if (before.bytes > free || need > free - before.bytes) {
      budget_->count_refusal();
      throw RequestError("create: tensor '" + name + "' (" + std::to_string(need >> 20) +
                         " MiB with its optimizer's " +
                         "slots) would take psd over its memory limit: " + budget_->describe());
    }
  }
  if (pending != nullptr) {
    // With a budget, what the tensor will hold, slots included (the budget's measure).
    pending->bytes += budget_ != nullptr ? footprint(spec, n, part) : n * sizeof(float);
    ++pending->tensors;
  }
}

std::pair<StoredTensor*, bool> TensorStore::create(const TensorSpec& spec,
                                                   const std::optional<PartMeta>& part) {
  std::lock_guard lock(mutex_);
  validate_locked(spec, part, nullptr, Values::kGiven);
  if (auto it = tensors_.find(spec.name); it != tensors_.end()) return {it->second.get(), false};
  if (budget_ != nullptr) {
    const uint64_t need = footprint(spec, spec.num_elements(), part);
    if (!reserved_.try_resize(reserved_.bytes() + need)) {
      throw RequestError("create: tensor '" + spec.name +
                         "' would take psd over its memory limit: " + budget_->describe());
    }
  }
  auto tensor = std::make_unique<StoredTensor>(next_id_++, spec, part);
  StoredTensor* raw = tensor.get();
  bytes_ += raw->size() * sizeof(float);
  tensors_.emplace(spec.name, std::move(tensor));
  return {raw, true};
}

StoredTensor* TensorStore::find(const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.get();
}

StoredTensor& TensorStore::get(const std::string& name) const {
  StoredTensor* t = find(name);
  if (!t) throw RequestError("unknown tensor '" + name + "'");
  return *t;
}

std::vector<StoredTensor*> TensorStore::all() const {
  std::lock_guard lock(mutex_);
  std::vector<StoredTensor*> out;
  out.reserve(tensors_.size());
  for (auto& [name, t] : tensors_) out.push_back(t.get());
  return out;
}

std::size_t TensorStore::count() const {
  std::lock_guard lock(mutex_);
  return tensors_.size();
}

uint64_t TensorStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

void TensorStore::clear() {
  std::lock_guard lock(mutex_);
  tensors_.clear();
  bytes_ = 0;
  reserved_.resize_anyway(0);
}

}  // namespace ps
