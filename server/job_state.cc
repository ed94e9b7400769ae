#include "server/job_state.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ps/errors.h"

namespace ps {

void validate_job_config(const JobConfig& config) {
  if (config.total_replicas > kMaxWorkers || config.replicas_to_aggregate > kMaxWorkers) {
    throw RequestError(
        "initJob: a job has at most " + std::to_string(kMaxWorkers) + " workers, not " +
        std::to_string(std::max(config.total_replicas, config.replicas_to_aggregate)));
  }
  if (config.mode == SyncMode::kSync && config.replicas_to_aggregate == 0) {
    throw RequestError("initJob: sync mode needs replicas_to_aggregate >= 1");
  }
  if (config.total_replicas > 0 && config.replicas_to_aggregate > config.total_replicas) {
    throw RequestError("initJob: replicas_to_aggregate " +
                       std::to_string(config.replicas_to_aggregate) + " exceeds the job's " +
                       std::to_string(config.total_replicas) + " workers");
  }
  if (!step_in_range(config.start_step)) {
    throw RequestError("initJob: start step " + std::to_string(config.start_step) +
                       " is out of range [0, 2^62]");
  }
  const uint64_t hosts = host_list_bytes(config.worker_hosts, config.ps_hosts);
  if (hosts > kMaxHostListBytes) {
    throw RequestError("initJob: the host lists take " + std::to_string(hosts) +
                       " bytes, more than the " + std::to_string(kMaxHostListBytes) +
                       " a job may keep (they are informational: send them empty)");
  }
}

void JobState::configure(const JobConfig& config) {
  validate_job_config(config);
  if (configured_) {
    // start_step only says where a new job begins: a chief restarted with
    // restore_from names the newest checkpoint's step, and the job goes on.
    // The stop step may move (a job resumed and extended) as long as it
    // stays ahead of where the job is; the rest would change what the
    // running workers and the stored state mean.
    JobConfig same = config;
    same.start_step = config_.start_step;
    same.train_steps = config_.train_steps;
    same.worker_hosts = config_.worker_hosts;
    same.ps_hosts = config_.ps_hosts;
    if (!(same == config_)) {
      throw RequestError("initJob: the job is already configured as " + to_string(config_) +
                         ", not " + to_string(config) +
                         " (only the stop step may change when a job goes on)");
    }
    if (config.train_steps != config_.train_steps) {
      if (config.train_steps > 0 && config.train_steps < global_step_) {
        throw RequestError("initJob: the job is at global step " + std::to_string(global_step_) +
                           ", past the stop step " + std::to_string(config.train_steps) +
                           " asked for: give more steps (or epochs) to go on");
      }
      spdlog::info("job goes on: stop step {} -> {} (at global step {})", config_.train_steps,
                   config.train_steps, global_step_);
      config_.train_steps = config.train_steps;
      if (!stop_reached()) finished_ = false;
    }
    awaiting_chief_ = false;
    return;
  }
  for (const auto& [index, w] : workers_) {
    if (config.total_replicas > 0 && index >= static_cast<int>(config.total_replicas) &&
        w.connections > 0) {
      throw RequestError("initJob: worker " + std::to_string(index) +
                         " is connected but the job has only " +
                         std::to_string(config.total_replicas) + " workers");
    }
  }
  config_ = config;
  configured_ = true;
  awaiting_chief_ = false;
  // A job restored from a checkpoint (ps/checkpoint.h) goes on from its step.
  if (global_step_ == 0 && config_.start_step > 0) global_step_ = config_.start_step;
  spdlog::info("job configured: {}", to_string(config_));
}

void JobState::check_worker(int worker_index) const {
  if (worker_index < -1)
    throw RequestError("worker index " + std::to_string(worker_index) + " is invalid");
  if (worker_index >= static_cast<int>(kMaxWorkers)) {
    throw RequestError("worker index " + std::to_string(worker_index) +
                       " is out of range: a job has at most " + std::to_string(kMaxWorkers) +
                       " workers");
  }
  if (configured_ && config_.total_replicas > 0 &&
      worker_index >= static_cast<int>(config_.total_replicas)) {
    throw RequestError("worker index " + std::to_string(worker_index) + " is outside the job's " +
                       std::to_string(config_.total_replicas) + " workers (0.." +
                       std::to_string(config_.total_replicas - 1) + ")");
  }
}

int64_t JobState::recorded_step(int worker_index) const {
  auto it = workers_.find(worker_index);
  if (worker_index < 0 || it == workers_.end()) return -1;
  const WorkerRecord& w = it->second;
  return w.pushes > 0 || w.step > 0 ? w.step : -1;
}

void JobState::connect(int worker_index, bool is_chief, const std::string& peer) {
  check_worker(worker_index);
  if (is_chief) {
    if (chief_) {
      throw RequestError("a chief (worker " + std::to_string(*chief_) + ") is already connected; " +
                         peer +
                         " cannot be a second chief (a chief whose host was lost is dropped "
                         "after psd's --dead_peer_secs; a hung one must be ended first)");
    }
    chief_ = worker_index;
  }
  if (worker_index >= 0) {
    WorkerRecord& w = workers_[worker_index];
    ++w.connections;
    w.peer = peer;
    w.hung = false;
    w.given_up = false;
    w.last_seen = timer_.now();
  }
  recheck_staleness_waiters();
}

void JobState::disconnect(int worker_index, bool is_chief) {
  if (is_chief) chief_.reset();
  if (worker_index >= 0) {
    auto it = workers_.find(worker_index);
    if (it != workers_.end() && it->second.connections > 0) --it->second.connections;
  }
  // A departed worker no longer holds back bounded-staleness waiters, the
  // sync step, nor barriers that skip lost workers.
  recheck_staleness_waiters();
  if (worker_index >= 0) release_lost_barriers();
  if (worker_index >= 0 && on_worker_lost_) on_worker_lost_();
  maybe_done();
}

uint32_t JobState::lost_workers(const std::vector<int>& except) const {
  const uint32_t total =
      config_.total_replicas > 0 ? config_.total_replicas : config_.replicas_to_aggregate;
  uint32_t n = 0;
  for (const auto& [i, w] : workers_) {
    if (!w.lost() || (total > 0 && static_cast<uint32_t>(i) >= total)) continue;
    n += std::find(except.begin(), except.end(), i) == except.end();
  }
  return n;
}

void JobState::saw_worker(int worker_index) {
  if (worker_index < 0) return;
  auto it = workers_.find(worker_index);
  if (it == workers_.end()) return;
  it->second.last_seen = timer_.now();
  if (it->second.hung) {
    spdlog::info("worker {} is active again", worker_index);
    it->second.hung = false;
  }
}

void JobState::mark_hung(kj::Duration timeout, const std::vector<int>& waiting) {
  const kj::TimePoint now = timer_.now();
  bool changed = false;
  for (auto& [i, w] : workers_) {
    if (std::find(waiting.begin(), waiting.end(), i) != waiting.end()) continue;
    if (w.connections > 0 && !w.hung && now - w.last_seen > timeout) {
      spdlog::warn("worker {} silent for over {} s: sync steps no longer wait for it", i,
                   timeout / kj::SECONDS);
      w.hung = true;
      changed = true;
    }
  }
  if (changed) release_lost_barriers();
  if (changed && on_worker_lost_) on_worker_lost_();
}

void JobState::restore(bool configured, const JobConfig& config, int64_t global_step, bool ready) {
  configured_ = configured;
  config_ = config;
  global_step_ = global_step;
  ready_ = ready;
  awaiting_chief_ = configured;
}

int JobState::live_workers() const {
  int n = 0;
  for (const auto& [i, w] : workers_) n += w.connections > 0;
  return n;
}

int64_t JobState::slowest_live_step() const {
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const auto& [i, w] : workers_) {
    if (w.connections > 0) slowest = std::min(slowest, w.step);
  }
  return slowest == std::numeric_limits<int64_t>::max() ? 0 : slowest;
}

kj::Promise<void> JobState::hold(std::multimap<int64_t, HeldPull>& waiters, int64_t step,
                                 int worker) {
  sweep_abandoned();
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiters.emplace(step, HeldPull{kj::mv(paf.fulfiller), worker, timer_.now()});
  return kj::mv(paf.promise);
}

kj::Promise<void> JobState::wait_for_staleness(int64_t step, int worker) {
  if (config_.mode != SyncMode::kBoundedStaleness) return kj::READY_NOW;
  if (step - slowest_live_step() <= static_cast<int64_t>(config_.max_staleness))
    return kj::READY_NOW;
  ++staleness_waits_;
  return hold(staleness_waiters_, step, worker);
}

void JobState::recheck_staleness_waiters() {
  const int64_t limit = slowest_live_step() + static_cast<int64_t>(config_.max_staleness);
  while (!staleness_waiters_.empty() && staleness_waiters_.begin()->first <= limit) {
    staleness_waiters_.begin()->second.fulfiller->fulfill();
    staleness_waiters_.erase(staleness_waiters_.begin());
  }
}

void JobState::advance_step() {
  if (global_step_ < kMaxStep) ++global_step_;
  while (!step_waiters_.empty() && step_waiters_.begin()->first <= global_step_) {
    step_waiters_.begin()->second.fulfiller->fulfill();
    step_waiters_.erase(step_waiters_.begin());
  }
  recheck_staleness_waiters();
}

size_t JobState::held_waits() const {
  size_t n = step_waiters_.size() + staleness_waiters_.size() + ready_waiters_.size();
  for (const auto& [name, b] : barriers_) n += b.waiting.size();
  return n;
}

// A wait whose call was cancelled (its caller gave up or went away;
// shard_service.cc) stays listed until its step, readiness or barrier
// comes, which may be never: once the lists have doubled since the last
// sweep they are swept of those, so a client that keeps asking and giving
// up cannot grow them without bound. (An abandoned barrier wait is no
// arrival any more either: see barrier().)
void JobState::sweep_abandoned() {
  if (held_waits() < next_sweep_) return;
  auto abandoned = [](auto& fulfiller) { return !fulfiller->isWaiting(); };
  // (Not std::erase_if on the maps: it hands out const entries, and
  // isWaiting() is not const.)
  for (auto* waiters : {&step_waiters_, &staleness_waiters_}) {
    for (auto it = waiters->begin(); it != waiters->end();)
      it = abandoned(it->second.fulfiller) ? waiters->erase(it) : std::next(it);
  }
  std::erase_if(ready_waiters_, abandoned);
  for (auto& [name, b] : barriers_) drop_abandoned(b);
  std::erase_if(barriers_, [](const auto& entry) { return entry.second.waiting.empty(); });
  next_sweep_ = std::max(kFirstSweep, 2 * held_waits());
}

kj::Promise<void> JobState::wait_for_step(int64_t step, int worker) {
  if (step <= global_step_) return kj::READY_NOW;
  return hold(step_waiters_, step, worker);
}

void JobState::set_ready() {
  if (!ready_) spdlog::info("model initialised by the chief; releasing waiting workers");
  ready_ = true;
  for (auto& f : ready_waiters_) f->fulfill(true);
  ready_waiters_.clear();
}

kj::Promise<bool> JobState::wait_ready(kj::Duration timeout) {
  if (ready_) return true;
  sweep_abandoned();
  auto paf = kj::newPromiseAndFulfiller<bool>();
  ready_waiters_.push_back(kj::mv(paf.fulfiller));
  return paf.promise.exclusiveJoin(timer_.afterDelay(timeout).then([] { return false; }));
}

kj::Promise<uint32_t> JobState::barrier(const std::string& name, uint32_t count,
                                        kj::Duration timeout, int worker, bool skip_lost) {
  if (count == 0) throw RequestError("barrier '" + name + "': count must be >= 1");
  Barrier& b = barriers_[name];
  // A caller that timed out or went away (its call cancelled) is not there
  // any more: it does not count, or a worker that retries after a broken
  // connection would count twice.
  drop_abandoned(b);
  if (b.waiting.empty()) {
    b.since = timer_.now();
    b.timeout = timeout;
  }
  if (!b.waiting.empty() && count != b.count) {
    throw RequestError("barrier '" + name + "': " + std::to_string(b.waiting.size()) +
                       " caller(s) wait for " + std::to_string(b.count) + ", this call asks for " +
                       std::to_string(count));
  }
  if (!b.waiting.empty() && skip_lost != b.skip_lost) {
    throw RequestError("barrier '" + name + "': " + std::to_string(b.waiting.size()) +
                       " caller(s) wait " + (b.skip_lost ? "skipping" : "for") +
                       " lost workers, this call asks to " + (skip_lost ? "skip" : "wait for") +
                       " them");
  }
  b.count = count;
  b.skip_lost = skip_lost;
  const auto arrived = static_cast<uint32_t>(b.waiting.size() + 1);
  if (arrived + lost_for(b, worker) >= count) {
    for (auto& f : b.waiting) f->fulfill(kj::cp(arrived));
    barriers_.erase(name);
    return arrived;
  }
  sweep_abandoned();
  auto paf = kj::newPromiseAndFulfiller<uint32_t>();
  b.waiting.push_back(kj::mv(paf.fulfiller));
  b.who.push_back(worker);
  return paf.promise.exclusiveJoin(
      timer_.afterDelay(timeout).then([this, name, count, timeout]() -> kj::Promise<uint32_t> {
        // Who came and who never did, as the barrier's wait line says it.
        std::vector<int> here;
        std::size_t had = 0;
        if (auto it = barriers_.find(name); it != barriers_.end()) {
          had = it->second.waiting.size();
          for (int w : it->second.who)
            if (w >= 0) here.push_back(w);
        }
        std::string has;
        for (int w : here) has += (has.empty() ? "" : ", ") + std::to_string(w);
        const std::string missing = missing_workers(here);
        return kj::Exception(
            kj::Exception::Type::FAILED, __FILE__, __LINE__,
            kj::str(fmt::format("barrier '{}' timed out after {:g} s waiting for {} callers, had {} "
                                "(workers {}){}",
                                name, static_cast<double>(timeout / kj::MILLISECONDS) / 1000,
                                count, had,
                                has.empty() ? "none" : has,
                                missing.empty() ? "" : "; missing workers " + missing)
                        .c_str()));
      }));
}

uint32_t JobState::lost_for(const Barrier& b, int joining) const {
  if (!b.skip_lost) return 0;
  // Of the job's workers 0..count-1: a barrier of fewer callers than the
  // job has workers skips none of the others, and a job that does not say
  // how many workers it has skips nobody.
  const uint32_t total =
      config_.total_replicas > 0 ? config_.total_replicas : config_.replicas_to_aggregate;
  const auto upto = static_cast<int64_t>(std::min(total, b.count));
  uint32_t n = 0;
  for (const auto& [i, w] : workers_) {
    if (i < 0 || i >= upto || !w.lost() || i == joining) continue;
    n += std::find(b.who.begin(), b.who.end(), i) == b.who.end();
  }
  return n;
}

void JobState::release_lost_barriers() {
  std::vector<std::string> done;
  for (auto& [name, b] : barriers_) {
    if (!b.skip_lost) continue;
    drop_abandoned(b);
    if (b.waiting.empty() || b.waiting.size() + lost_for(b) < b.count) continue;
    const auto arrived = static_cast<uint32_t>(b.waiting.size());
    for (auto& f : b.waiting) f->fulfill(kj::cp(arrived));
    done.push_back(name);
  }
  for (const std::string& name : done) barriers_.erase(name);
}

void JobState::drop_abandoned(Barrier& b) {
  for (std::size_t i = b.waiting.size(); i-- > 0;) {
    if (b.waiting[i]->isWaiting()) continue;
    b.waiting.erase(b.waiting.begin() + static_cast<std::ptrdiff_t>(i));
    b.who.erase(b.who.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

bool JobState::give_up_on_absent(const std::vector<int>& present) {
  std::vector<int> here = present;
  std::sort(here.begin(), here.end());
  bool changed = false;
  for (uint32_t i = 0; i < config_.total_replicas; ++i) {
    const int w = static_cast<int>(i);
    if (workers_.count(w) || std::binary_search(here.begin(), here.end(), w)) continue;
    WorkerRecord& r = workers_[w];
    r.given_up = true;
    changed = true;
    spdlog::warn(
        "worker {} never connected: sync steps no longer wait for it (--worker_timeout_secs)", w);
  }
  if (changed) release_lost_barriers();
  if (changed && on_worker_lost_) on_worker_lost_();
  return changed;
}

void JobState::finish() {
  if (!finished_) {
    spdlog::info("job finished at global step {}; exiting once workers disconnect", global_step_);
    finished_since_ = timer_.now();
  }
  finished_ = true;
  maybe_done();
}

void JobState::maybe_done() {
  if (finished_ && live_workers() == 0 && on_done_) {
    auto cb = std::move(on_done_);
    on_done_ = nullptr;
    cb();
  }
}

}  // namespace ps
