// The training job as one shard sees it: mode (async / sync / bounded
// staleness), the global step, which workers are connected and how far each
// has got, the chief's "model ready" flag, barriers and the end of the job.
// Lives on the KJ event-loop thread; nothing here is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/timer.h>

#include "ps/job.h"

namespace ps {

// A worker's last progress report (the report RPC).
struct WorkerReport {
  int64_t step = 0;
  float loss = 0;
  float accuracy = 0;
  float samples_per_sec = 0;
  float learning_rate = 0;
  double unix_secs = 0;  // when psd received it
};

struct WorkerRecord {
  int64_t step = 0;     // steps completed (stepDone) or the step last pushed at
  int connections = 0;  // live connections that said hello with this index
  uint64_t pushes = 0;
  uint64_t stale = 0;
  std::string peer;  // address of its latest connection
  std::optional<WorkerReport> report;
  kj::TimePoint last_seen = kj::origin<kj::TimePoint>();  // last request (worker_timeout)
  bool hung = false;      // connected but silent past worker_timeout: not waited for
  bool given_up = false;  // never connected, not waited for any more (give_up_on_absent)
  bool lost() const { return connections == 0 || hung; }
};

// The checks a job configuration must pass, wherever it comes from: the
// chief's initJob and a checkpoint being restored. Throws RequestError.
void validate_job_config(const JobConfig& config);

class JobState {
 public:
  explicit JobState(kj::Timer& timer) : timer_(timer) {}

  // Throws RequestError when a different configuration is already set.
  void configure(const JobConfig& config);
  bool configured() const { return configured_; }
  const JobConfig& config() const { return config_; }

  // Connection bookkeeping. Throws RequestError for an index outside the job
  // (or at kMaxWorkers and above, job or not) or a second live chief.
  void connect(int worker_index, bool is_chief, const std::string& peer);
  void disconnect(int worker_index, bool is_chief);
  void check_worker(int worker_index) const;
  const std::map<int, WorkerRecord>& workers() const { return workers_; }
  WorkerRecord& worker(int worker_index) { return workers_[worker_index]; }
  int live_workers() const;
  // Workers of the job that said hello once and are gone (or hung): sync
  // steps stop waiting for them. Not counted: `except` (workers whose
  // gradient the step already holds: it still counts), and indices outside
  // the job (a client that said hello with one before the job was set up).
  uint32_t lost_workers(const std::vector<int>& except = {}) const;
  // Called (on the loop) when a worker disconnects or is marked hung.
  void on_worker_lost(std::function<void()> callback) { on_worker_lost_ = std::move(callback); }
  // A request from this worker: it is alive (clears `hung`).
  void saw_worker(int worker_index);
  // Marks connected workers silent for longer than `timeout` as hung, except
  // those in `waiting` (they contributed and wait for the step: not hung).
  void mark_hung(kj::Duration timeout, const std::vector<int>& waiting);
  kj::Timer& timer() { return timer_; }

  // Start-up restore from a checkpoint: before any connection.
  void restore(bool configured, const JobConfig& config, int64_t global_step, bool ready);

  // A worker's recorded step (WorkerRecord::step: the steps it reported
  // done, or the step it last pushed at); -1 when it has none.
  int64_t recorded_step(int worker_index) const;
  // The smallest step among connected workers (bounded staleness).
  int64_t slowest_live_step() const;
  // Resolves once `step - slowest_live_step() <= max_staleness`. `worker`
  // is the caller's worker index (-1: not a worker), named in waits.
  kj::Promise<void> wait_for_staleness(int64_t step, int worker = -1);
  uint64_t staleness_waits() const { return staleness_waits_; }
  void record_staleness(int64_t age) { max_staleness_seen_ = std::max(max_staleness_seen_, age); }
  int64_t max_staleness_seen() const { return max_staleness_seen_; }

  int64_t global_step() const { return global_step_; }
  void advance_step();  // releases the pulls waiting for the new step
  // A worker reported progress: bounded-staleness waiters may go on.
  void worker_progressed() { recheck_staleness_waiters(); }
  // Resolves once the global step reaches `step`; `worker` as above.
  kj::Promise<void> wait_for_step(int64_t step, int worker = -1);
  // At kMaxStep (a job started near it) the job stops: the step cannot
  // move past what requests and checkpoints may name.
  bool stop_reached() const {
    return global_step_ >= kMaxStep ||
           (config_.train_steps > 0 && global_step_ >= config_.train_steps);
  }

  void set_ready();
  bool ready() const { return ready_; }
  // Resolves with true once ready, or false after `timeout`.
  kj::Promise<bool> wait_ready(kj::Duration timeout);

  // `worker` is the caller's worker index (-1: not a worker), named in
  // waits() while it waits. skip_lost: lost workers among the job's
  // workers 0..count-1 that are not waiting here count toward `count` (the
  // barrier ends once every one of them still in the job is there, also
  // when one is lost while it waits); none in a job with no worker count.
  // Resolves with the callers that came.
  kj::Promise<uint32_t> barrier(const std::string& name, uint32_t count, kj::Duration timeout,
                                int worker = -1, bool skip_lost = false);

  // The job's workers not in `present`, each with why: "2 (never
  // connected), 3 (disconnected)"; empty when none is missing. Names about
  // kMaxWaitLine bytes' worth, then counts the rest ("and 40 more").
  std::string missing_workers(const std::vector<int>& present) const;
  // One line for each barrier that has waited longer than `older_than`:
  // what it waits for and whom ("barrier 'x' waits for 3 callers, has
  // workers 0, 1; missing workers 2 (never connected); it gives up at 60 s").
  // At most kMaxBarrierLines of them, then one line that counts the rest.
  std::vector<std::string> barrier_waits(kj::Duration older_than);
  // The bounded-staleness pulls held longer than `older_than`, as one line:
  // whose, for which step and how long, the slowest workers they wait for
  // and max_staleness. Empty when none.
  std::vector<std::string> staleness_waits(kj::Duration older_than);
  // The sync pulls held longer than `older_than` for a later step, as one
  // line that names the workers that have not pushed for the current step.
  // For a step no gradient has started (a started one has its own line).
  std::vector<std::string> unstarted_step_waits(kj::Duration older_than);
  // With an on_done callback (psd --exit_when_done): once the job has been
  // finished longer than `older_than` and workers are still connected, one
  // line naming them (and their addresses). Empty otherwise.
  std::vector<std::string> exit_waits(kj::Duration older_than) const;
  static constexpr std::size_t kMaxWaitLine = 512;
  static constexpr std::size_t kMaxBarrierLines = 8;
  // Declared workers that never connected, once a sync step waited for them
  // longer than the worker timeout: taken as lost, as a worker that left.
  // Returns whether any was newly given up on.
  bool give_up_on_absent(const std::vector<int>& present);

  void finish();
  bool finished() const { return finished_; }
  // Restored from a checkpoint, not configured by a chief since: a worker at
  // the stop step waits for this run's chief, which may move it.
  bool awaiting_chief() const { return awaiting_chief_; }
  // The chief trains on (it pushed, reported, met a barrier or ended the
  // job): the one that reconnected to a restarted psd, which sends no initJob.
  void chief_is_training() { awaiting_chief_ = false; }
  // Called once the job is finished and no worker is connected any more.
  void on_done(std::function<void()> callback) { on_done_ = std::move(callback); }

  // Waits held for pulls, waitReady and barriers, abandoned ones included
  // until swept (for tests).
  size_t held_waits() const;

 private:
  void recheck_staleness_waiters();
  void maybe_done();

  kj::Timer& timer_;
  bool configured_ = false;
  JobConfig config_;
  int64_t global_step_ = 0;
  bool ready_ = false;
  bool finished_ = false;
  bool awaiting_chief_ = false;
  kj::TimePoint finished_since_ = kj::origin<kj::TimePoint>();
  std::optional<int> chief_;
  std::map<int, WorkerRecord> workers_;
  // A pull held until a step (sync) or the slowest worker (bounded staleness).
  struct HeldPull {
    kj::Own<kj::PromiseFulfiller<void>> fulfiller;
    int worker = -1;  // the caller's worker index, -1: not a worker
    kj::TimePoint since = kj::origin<kj::TimePoint>();
  };
  kj::Promise<void> hold(std::multimap<int64_t, HeldPull>& waiters, int64_t step, int worker);
  // "0 (for step 7, 12 s), 2 (for step 8, 6 s)": the live ones of `waiters`
  // held longer than `older_than`, one per worker and step; sets `first` to
  // the smallest step among them. Empty when none.
  std::string held_pulls(std::multimap<int64_t, HeldPull>& waiters, kj::Duration older_than,
                         int64_t& first);
  std::multimap<int64_t, HeldPull> step_waiters_;
  std::multimap<int64_t, HeldPull> staleness_waiters_;
  std::vector<kj::Own<kj::PromiseFulfiller<bool>>> ready_waiters_;
  struct Barrier {
    uint32_t count = 0;  // callers it waits for: every caller must ask the same
    bool skip_lost = false;  // lost workers count as arrived: every caller must ask the same
    std::vector<kj::Own<kj::PromiseFulfiller<uint32_t>>> waiting;
    std::vector<int> who;  // waiting[i]'s worker index
    kj::TimePoint since = kj::origin<kj::TimePoint>();
    kj::Duration timeout = 0 * kj::SECONDS;
  };
  std::map<std::string, Barrier> barriers_;
  size_t next_sweep_ = kFirstSweep;  // held_waits() at which abandoned ones are swept
  static constexpr size_t kFirstSweep = 64;
  void sweep_abandoned();
  static void drop_abandoned(Barrier& b);
  // Lost workers of the job that `b` counts as arrived (skip_lost only).
  uint32_t lost_for(const Barrier& b, int joining = -1) const;
  // Ends the skip_lost barriers that a worker just lost completes.
  void release_lost_barriers();
  uint64_t staleness_waits_ = 0;
  int64_t max_staleness_seen_ = 0;
  std::function<void()> on_done_;
  std::function<void()> on_worker_lost_;
};

}  // namespace ps
