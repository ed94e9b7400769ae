// How the workers of one job share updates; chosen per job by the chief and
// sent to every shard (all shards agree).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ps {

enum class SyncMode {
  kAsync,             // every push applied on arrival
  kSync,              // SyncReplicasOptimizer: average replicas_to_aggregate gradients per step
  kBoundedStaleness,  // async, but no worker more than max_staleness steps ahead of the slowest
};

// The largest step psd takes in a request (pushes, pulls' minStep, step
// reports, a job's start step): far beyond any run, and small enough that
// the differences psd takes between steps cannot overflow.
inline constexpr int64_t kMaxStep = int64_t{1} << 62;
inline constexpr bool step_in_range(int64_t step) { return step >= 0 && step <= kMaxStep; }

// The most workers a job may declare (total_replicas, replicas_to_aggregate):
// far beyond any job, and small enough that psd's per-worker bookkeeping
// and worker indices (int) stay small.
inline constexpr uint32_t kMaxWorkers = uint32_t{1} << 16;

// The most a job's host lists (JobConfig::worker_hosts and ps_hosts) may
// hold, both together: psd keeps them and sends them in every waitReady and
// stats reply, so they must stay far below any message size limit. About
// 10,000 hosts; a chief with more sends none (they are informational).
inline constexpr uint64_t kMaxHostListBytes = uint64_t{1} << 18;
inline constexpr uint64_t host_list_bytes(const std::vector<std::string>& a,
                                          const std::vector<std::string>& b) {
  uint64_t n = 0;
  for (const auto* list : {&a, &b})
    for (const std::string& h : *list) n += h.size() + 1;
  return n;
}

struct JobConfig {
  SyncMode mode = SyncMode::kAsync;
  uint32_t replicas_to_aggregate =
      0;  // sync: gradients averaged per step (< total_replicas: backup workers)
  uint32_t total_replicas = 0;  // workers in the job; 0 = not checked
  uint32_t max_staleness = 0;   // bounded staleness
  int64_t train_steps = 0;      // stop at this global step; 0 = no stop condition
  int64_t start_step = 0;       // global step a new job starts at (a restored checkpoint's)
  // The chief's cluster (--worker_hosts, --ps_hosts), for every worker to
  // check its own against; not part of what makes two configurations differ.
  std::vector<std::string> worker_hosts{};
  std::vector<std::string> ps_hosts{};
  bool operator==(const JobConfig&) const = default;
};

std::string to_string(const JobConfig& c);

// The mode in one word, as trainers' RESULT lines print it: "async", "sync"
// or "bounded-staleness".
const char* sync_mode_name(SyncMode mode);

}  // namespace ps
