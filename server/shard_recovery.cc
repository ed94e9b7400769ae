// Shard: sync steps when workers fail. A sync step waits for
// replicas_to_aggregate gradients; a worker that disconnected (its process
// died, its host went away) or stopped making requests for worker_timeout
// while the others wait is no longer counted, so the job goes on with the
// workers left instead of hanging. The gradients that did arrive are
// averaged over their own number. A worker that comes back (reconnects, or
// speaks again) counts again from its next push.
#include <algorithm>
#include <map>

#include <spdlog/spdlog.h>

#include "server/shard.h"

namespace ps {

uint32_t Shard::replicas_needed(const SyncSlot& slot) const {
  const JobConfig& job = job_.config();
  const uint32_t wanted = job.replicas_to_aggregate;
  const uint32_t total = job.total_replicas > 0 ? job.total_replicas : wanted;
  // Workers never seen yet are presumed on their way (start-up); only the
  // ones that were here and left are not waited for. One that left after
  // its gradient arrived still gave it: the step waits for the others.
  const uint32_t lost = job_.lost_workers(slot.contributors);
  const uint32_t available = total > lost ? total - lost : 0;
  return std::max<uint32_t>(1, std::min(wanted, available));
}

void Shard::recheck_sync_step() {
  if (job_.config().mode != SyncMode::kSync) return;
  uint32_t fewest = job_.config().replicas_to_aggregate;
  recheck_table_sync();
  for (auto& [t, slot] : sync_) {
    if (!slot.complete && slot.count > 0 && slot.count >= replicas_needed(slot)) {
      slot.complete = true;
      ++complete_tensors_;
    }
    if (slot.count > 0) fewest = std::min(fewest, slot.count);
  }
  if (complete_tensors_ > 0 && complete_tensors_ >= trainable_count()) {
    spdlog::info("sync step {} completed with {} of {} replicas (workers lost: {})", job_.global_step(), fewest,
                 job_.config().replicas_to_aggregate, job_.lost_workers());
    commit_sync_step();
  }
}

void Shard::saw_worker(int worker_index) { job_.saw_worker(worker_index); }

void Shard::check_worker_timeouts() {
  if (options_.worker_timeout_secs == 0 || job_.config().mode != SyncMode::kSync) return;
  // A worker that gave its gradient for every tensor waits for the step:
  // silent, not hung. One that gave some and fell silent (stuck in the
  // middle of its push) is hung like one that gave none.
  std::map<int, uint64_t> given;
  bool pending = false;
  for (const auto& [t, slot] : sync_) {
    pending = pending || slot.count > 0;
    for (int w : slot.contributors) ++given[w];
  }
  count_table_contributions(given, pending);
  // Only a step that has started can be held up by a silent worker.
  if (!pending) return;
  std::vector<int> waiting;
  for (const auto& [w, tensors] : given) {
    if (tensors >= trainable_count()) waiting.push_back(w);
  }
  job_.mark_hung(options_.worker_timeout_secs * kj::SECONDS, waiting);
}

}  // namespace ps

namespace ps {

kj::Promise<void> Shard::watch_workers(kj::Timer& timer) {
  return timer.afterDelay(1 * kj::SECONDS).then([this, &timer] {
    check_worker_timeouts();
    return watch_workers(timer);
  });
}

}  // namespace ps
