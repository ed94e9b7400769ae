// Shard: sync steps when workers fail. A sync step waits for
// replicas_to_aggregate gradients; a worker that disconnected (its process
// died, its host went away) or stopped making requests for worker_timeout
// while the others wait is no longer counted, so the job goes on with the
// workers left instead of hanging. The gradients that did arrive are
// averaged over their own number. A worker that comes back (reconnects, or
// speaks again) counts again from its next push.
#include <algorithm>
#include <map>

#include <fmt/format.h>
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
    spdlog::info("sync step {} completed with {} of {} replicas (workers lost: {})",
                 job_.global_step(), fewest, job_.config().replicas_to_aggregate,
                 job_.lost_workers());
    commit_sync_step();
  }
}

void Shard::saw_worker(int worker_index) { job_.saw_worker(worker_index); }

std::vector<int> Shard::sync_contributors() const {
  std::map<int, uint64_t> given;
  for (const auto& [t, slot] : sync_) {
    for (int w : slot.contributors) ++given[w];
  }
  bool tables_pending = false;
  count_table_contributions(given, tables_pending);
  std::vector<int> out;
  for (const auto& [w, tensors] : given) {
    if (tensors >= trainable_count()) out.push_back(w);
  }
  return out;
}

void Shard::note_sync_pending() {
  bool pending = false;
  for (const auto& [t, slot] : sync_) pending = pending || (slot.count > 0 && !slot.complete);
  std::map<int, uint64_t> table_contributors;
  count_table_contributions(table_contributors, pending);
  if (!pending || job_.config().mode != SyncMode::kSync) {
    pending_step_ = -1;
  } else if (pending_step_ != job_.global_step()) {
    pending_step_ = job_.global_step();
    pending_since_ = job_.timer().now();
  }
}

void Shard::check_worker_timeouts() {
  note_sync_pending();
  if (options_.worker_timeout_secs == 0 || job_.config().mode != SyncMode::kSync) return;
  // Only a step that has started can be held up by a silent worker.
  if (pending_step_ < 0) return;
  // A worker that gave its gradient for every tensor waits for the step:
  // silent, not hung. One that gave some and fell silent (stuck in the
  // middle of its push) is hung like one that gave none.
  const std::vector<int> waiting = sync_contributors();
  const kj::Duration timeout = options_.worker_timeout_secs * kj::SECONDS;
  job_.mark_hung(timeout, waiting);
  // A declared worker that never connected is given up on the same way,
  // once the step has waited that long for it.
  if (job_.timer().now() - pending_since_ > timeout) {
    std::vector<int> present = waiting;
    for (const auto& [w, r] : job_.workers()) present.push_back(w);
    job_.give_up_on_absent(present);
  }
}

std::vector<std::string> Shard::waits(kj::Duration older_than) {
  note_sync_pending();
  std::vector<std::string> out = job_.barrier_waits(older_than);
  const kj::TimePoint now = job_.timer().now();
  if (pending_step_ >= 0 && now - pending_since_ >= older_than) {
    const std::vector<int> in = sync_contributors();
    std::string has;
    for (int w : in) has += (has.empty() ? "" : ", ") + std::to_string(w);
    const std::string missing = job_.missing_workers(in);
    const std::string rule =
        options_.worker_timeout_secs > 0
            ? fmt::format(
                  "after {} s without them (psd --worker_timeout_secs) it goes on without them",
                  options_.worker_timeout_secs)
            : std::string(
                  "psd --worker_timeout_secs is 0: it waits for them (give N to go on without them "
                  "after N s)");
    out.push_back(
        fmt::format("sync step {} waits for workers {} ({} s); has gradients from workers {}; {}",
                    pending_step_, missing.empty() ? "?" : missing,
                    (now - pending_since_) / kj::SECONDS, has.empty() ? "none" : has, rule));
  }
  auto add = [&out](std::vector<std::string> lines) {
    for (std::string& l : lines) out.push_back(std::move(l));
  };
  if (pending_step_ < 0 && job_.config().mode == SyncMode::kSync)
    add(job_.unstarted_step_waits(older_than));
  add(job_.staleness_waits(older_than));
  add(job_.exit_waits(older_than));
  return out;
}

}  // namespace ps

namespace ps {

kj::Promise<void> Shard::watch_workers(kj::Timer& timer) {
  return timer.afterDelay(1 * kj::SECONDS).then([this, &timer] {
    check_worker_timeouts();
    constexpr kj::Duration kSayEvery = 5 * kj::SECONDS;
    const kj::TimePoint now = timer.now();
    current_waits_ = waits(kSayEvery);
    if (now - last_waits_log_ >= kSayEvery && !current_waits_.empty()) {
      last_waits_log_ = now;
      for (const std::string& w : current_waits_) spdlog::info("{}", w);
    }
    return watch_workers(timer);
  });
}

}  // namespace ps
