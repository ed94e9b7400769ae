// The last few minutes of a shard's progress, one sample a second, for the
// status page's charts (steps/s, bytes/s, loss). A fixed ring: memory stays
// bounded however long psd runs. Event-loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ps {

struct ProgressSample {
  double unix_secs = 0;
  int64_t global_step = 0;
  uint64_t bytes = 0;    // cumulative tensor bytes received + sent
  double mean_loss = 0;  // mean of the workers' last reported losses; NaN before any report
};

class ProgressHistory {
 public:
  explicit ProgressHistory(std::size_t capacity = 300) : ring_(capacity) {}

  void add(const ProgressSample& s) {
    ring_[(first_ + size_) % ring_.size()] = s;
    if (size_ < ring_.size())
      ++size_;
    else
      first_ = (first_ + 1) % ring_.size();
  }

  // Oldest first.
  std::vector<ProgressSample> samples() const {
    std::vector<ProgressSample> out;
    out.reserve(size_);
    for (std::size_t i = 0; i < size_; ++i) out.push_back(ring_[(first_ + i) % ring_.size()]);
    return out;
  }

  std::size_t size() const { return size_; }

 private:
  std::vector<ProgressSample> ring_;
  std::size_t first_ = 0;
  std::size_t size_ = 0;
};

}  // namespace ps
