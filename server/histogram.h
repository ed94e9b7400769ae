// A fixed-bucket histogram for Prometheus, cheap enough for hot paths: an
// observation is a short scan of the bounds and two relaxed atomic adds, with
// no lock, so compute threads and the event loop may record at once.
//
// Example:
//   Histogram latency({1e-4, 1e-3, 1e-2});    // upper bounds, ascending
//   latency.observe(0.0007);                  // lands in the le=0.001 bucket
//   auto s = latency.snapshot();              // cumulative counts, +Inf last
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace ps {

class Histogram {
 public:
  struct Snapshot {
    std::vector<double> bounds;        // upper bounds, without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries; the last is +Inf (= count)
    double sum = 0;
    uint64_t count = 0;
  };

  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)),
        buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

  void observe(double v) {
    std::size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i])
      ++i;  // a dozen bounds: a scan beats a binary search
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(v, std::memory_order_relaxed);
  }

  // Not an atomic picture across buckets (observations may land meanwhile);
  // count is derived from the buckets so that +Inf always equals _count.
  Snapshot snapshot() const {
    Snapshot s;
    s.bounds = bounds_;
    s.cumulative.resize(bounds_.size() + 1);
    uint64_t running = 0;
    for (std::size_t i = 0; i <= bounds_.size(); ++i) {
      running += buckets_[i].load(std::memory_order_relaxed);
      s.cumulative[i] = running;
    }
    s.count = running;
    s.sum = sum_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket, not cumulative
  std::atomic<double> sum_{0.0};
};

}  // namespace ps
