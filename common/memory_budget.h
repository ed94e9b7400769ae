// One memory budget for a process (psd): everything that can be made to
// grow by what a peer sends counts against it (stored tensors, requests
// being received and held, queued replies, checkpoint snapshots), so that a
// peer can be refused with a clear error instead of psd growing until the
// kernel kills it. Thread-safe: reservations are taken and given back on any
// thread (the event loop, compute threads, the checkpoint writer).
//
// A Reservation gives its bytes back when it is destroyed; keep it next to
// the memory it stands for, declared before it, so it is given back after
// that memory is freed.
//
//   MemoryBudget budget(256 << 20);
//   MemoryBudget::Reservation r = budget.try_reserve(MemoryUse::kReceiving, bytes);
//   if (!r) throw ...;  // over budget: refuse, nothing changed
//   auto buffer = kj::heapArray<capnp::word>(bytes / 8);   // held with r
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ps {

// What memory is used for (the label of ps_memory_used_bytes{use=...}).
enum class MemoryUse : unsigned { kTensors, kReceiving, kReplies, kSnapshots, kCount };
const char* memory_use_name(MemoryUse use);

class MemoryBudget {
 public:
  // limit_bytes 0: default_limit().
  explicit MemoryBudget(uint64_t limit_bytes = 0);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // 3/4 of the machine's memory (MemTotal in /proc/meminfo; 4 GiB if it
  // cannot be read).
  static uint64_t default_limit();
  // The machine's memory (MemTotal); 0 if unknown.
  static uint64_t machine_bytes();

  // Bytes held for one purpose; movable, gives them back when destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept : budget_(o.budget_), use_(o.use_), bytes_(o.bytes_) {
      o.budget_ = nullptr;
    }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { reset(); }
    explicit operator bool() const { return budget_ != nullptr; }
    uint64_t bytes() const { return budget_ ? bytes_ : 0; }
    // Grows or shrinks to `bytes`; false (unchanged) when growing would pass the limit.
    bool try_resize(uint64_t bytes);
    // Grows or shrinks to `bytes` whatever the total (memory that is there
    // already and has to be counted).
    void resize_anyway(uint64_t bytes);
    void reset();

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* b, MemoryUse use, uint64_t bytes)
        : budget_(b), use_(use), bytes_(bytes) {}
    MemoryBudget* budget_ = nullptr;
    MemoryUse use_ = MemoryUse::kTensors;
    uint64_t bytes_ = 0;
  };

  // `bytes` for `use`, or an empty Reservation (and a refusal counted) when
  // they would take the total past the limit.
  Reservation try_reserve(MemoryUse use, uint64_t bytes);
  // Counts `bytes` whatever the total (memory already there, e.g. tensors
  // restored from a checkpoint, that must be accounted).
  Reservation reserve_anyway(MemoryUse use, uint64_t bytes);

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t used(MemoryUse use) const {
    return by_use_[static_cast<unsigned>(use)].load(std::memory_order_relaxed);
  }
  uint64_t available() const {
    const uint64_t u = used();
    return u >= limit_ ? 0 : limit_ - u;
  }
  uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }
  // Counts a refusal decided without reserving (a check ahead of the reservation).
  void count_refusal() { refusals_.fetch_add(1, std::memory_order_relaxed); }
  // Bytes given back since the last call (for deciding when to hand freed
  // memory back to the kernel: see trim_freed_memory()).
  uint64_t take_freed() { return freed_.exchange(0, std::memory_order_relaxed); }

  // "N MiB of M MiB in use (--max_memory_mb)": for refusal messages.
  std::string describe() const;

 private:
  bool add(MemoryUse use, uint64_t bytes, bool anyway);
  void give_back(MemoryUse use, uint64_t bytes);

  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
  std::array<std::atomic<uint64_t>, static_cast<unsigned>(MemoryUse::kCount)> by_use_{};
  std::atomic<uint64_t> refusals_{0};
  std::atomic<uint64_t> freed_{0};
};

// Memory malloc holds free (glibc's mallinfo2: freed blocks kept for reuse).
uint64_t malloc_free_bytes();
// Hands memory malloc keeps after large frees back to the kernel (glibc's
// malloc_trim): psd's malloc tuning keeps freed blocks for reuse, so after an
// attack ends its resident size would otherwise stay at the peak.
void trim_freed_memory();

}  // namespace ps
