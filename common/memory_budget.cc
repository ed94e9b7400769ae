#include "common/memory_budget.h"

#include <malloc.h>

#include <fstream>
#include <sstream>

namespace ps {

const char* memory_use_name(MemoryUse use) {
  switch (use) {
    case MemoryUse::kTensors:
      return "tensors";
    case MemoryUse::kReceiving:
      return "requests";
    case MemoryUse::kReplies:
      return "replies";
    case MemoryUse::kSnapshots:
      return "snapshots";
    case MemoryUse::kCount:
      break;
  }
  return "?";
}

MemoryBudget::MemoryBudget(uint64_t limit_bytes)
    : limit_(limit_bytes > 0 ? limit_bytes : default_limit()) {}

uint64_t MemoryBudget::machine_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      std::istringstream in(line.substr(9));
      uint64_t kib = 0;
      if (in >> kib && kib > 0) return kib * 1024;
    }
  }
  return 0;
}

uint64_t MemoryBudget::default_limit() {
  const uint64_t machine = machine_bytes();
  return machine > 0 ? machine / 4 * 3 : uint64_t{4} << 30;
}

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    reset();
    budget_ = o.budget_;
    use_ = o.use_;
    bytes_ = o.bytes_;
    o.budget_ = nullptr;
  }
  return *this;
}

bool MemoryBudget::Reservation::try_resize(uint64_t bytes) {
  if (budget_ == nullptr) return false;
  if (bytes > bytes_) {
    if (!budget_->add(use_, bytes - bytes_, false)) return false;
  } else if (bytes < bytes_) {
    budget_->give_back(use_, bytes_ - bytes);
  }
  bytes_ = bytes;
  return true;
}

void MemoryBudget::Reservation::resize_anyway(uint64_t bytes) {
  if (budget_ == nullptr) return;
  if (bytes > bytes_)
    budget_->add(use_, bytes - bytes_, true);
  else if (bytes < bytes_)
    budget_->give_back(use_, bytes_ - bytes);
  bytes_ = bytes;
}

void MemoryBudget::Reservation::reset() {
  if (budget_ != nullptr) budget_->give_back(use_, bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

bool MemoryBudget::add(MemoryUse use, uint64_t bytes, bool anyway) {
  uint64_t now = used_.load(std::memory_order_relaxed);
  do {
    if (!anyway && (bytes > limit_ || now > limit_ - bytes)) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!used_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  by_use_[static_cast<unsigned>(use)].fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void MemoryBudget::give_back(MemoryUse use, uint64_t bytes) {
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  by_use_[static_cast<unsigned>(use)].fetch_sub(bytes, std::memory_order_relaxed);
  freed_.fetch_add(bytes, std::memory_order_relaxed);
}

MemoryBudget::Reservation MemoryBudget::try_reserve(MemoryUse use, uint64_t bytes) {
  if (!add(use, bytes, false)) return Reservation();
  return Reservation(this, use, bytes);
}

MemoryBudget::Reservation MemoryBudget::reserve_anyway(MemoryUse use, uint64_t bytes) {
  add(use, bytes, true);
  return Reservation(this, use, bytes);
}

std::string MemoryBudget::describe() const {
  auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  return mib(used()) + " of its " + mib(limit_) + " budget in use (" +
         mib(used(MemoryUse::kTensors)) + " tensors, " + mib(used(MemoryUse::kReceiving)) +
         " requests, " + mib(used(MemoryUse::kReplies)) + " replies, " +
         mib(used(MemoryUse::kSnapshots)) + " snapshots; psd --max_memory_mb)";
}

uint64_t malloc_free_bytes() {
  const struct mallinfo2 info = ::mallinfo2();
  return info.fordblks;
}

void trim_freed_memory() { ::malloc_trim(0); }

}  // namespace ps
