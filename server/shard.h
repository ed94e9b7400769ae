// One psd shard's request handling: validates every request in full before
// touching state, then applies it. Runs on the KJ event-loop thread; the
// arithmetic of large updates goes to the ComputePool.
//
// Consistency modes (JobConfig, sent by the chief with initJob):
//  - async: a push is applied on arrival.
//  - sync: pushes carry the step their parameters were pulled at; for the
//    current step each worker's gradient is summed per tensor, and once every
//    trainable tensor has replicas_to_aggregate of them the averages are
//    applied together and the step advances. Late gradients (backup workers)
//    and those for older steps are dropped as stale.
//  - bounded staleness: async, but a pull for local step c waits until
//    c - (slowest connected worker's step) <= max_staleness.
//
// Failures (see shard_recovery.cc): a sync step needs replicas_to_aggregate
// gradients, or fewer when workers have left: a worker that said hello and
// is no longer connected (or hung past worker_timeout) is not waited for, so
// the step completes with the gradients of the workers still there, averaged
// over their number. A worker that comes back counts again.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include <kj/async.h>
#include <kj/timer.h>

#include "server/compute_pool.h"
#include "server/histogram.h"
#include "server/job_state.h"
#include "common/checkpoint/checkpoint_file.h"
#include "schema/ps.capnp.h"
#include "server/request_log.h"
#include "common/net/shared_region.h"
#include "common/net/socket_stream.h"
#include "server/tensor_store.h"

namespace ps {

struct ShardOptions {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  bool allow_nonfinite = false;            // accept NaN/Inf gradients (refused by default)
  uint64_t inline_bytes = 1u << 20;        // smaller updates and reads run on the event loop
  uint64_t max_message_bytes = 80u << 20;  // advertised to clients; enforced by the RPC reader
  StoreLimits limits;
  std::string auth_token;                  // non-empty: hello must carry it
  std::string unix_socket;                 // absolute path psd also listens on, told to clients; empty: none
  uint64_t max_tensors_per_client = 0;     // tensors one connection may create; 0 = no limit
  uint32_t worker_timeout_secs = 0;        // sync: a silent worker is not waited for after this; 0 = never
  uint64_t max_shared_memory_bytes = 1ull << 30;  // largest region a Unix-socket client may attach; 0: none
};

// The RPC methods, for per-kind request counts (ps_requests_total{kind=...}).
enum class RequestKind : unsigned {
  kHello, kCreate, kPull, kPush, kList, kStats, kInitJob, kSetReady, kWaitReady, kStepDone, kBarrier, kFinish,
  kReport, kCheckpoint, kProbe, kAttachMemory, kCount
};
constexpr std::size_t kRequestKinds = static_cast<std::size_t>(RequestKind::kCount);
// The name used as the metric label (the schema's method name; "probe" for
// a hello that only asks where psd is).
const char* request_kind_name(RequestKind kind);

// Counters read by stats() and the metrics endpoint; updated on any thread.
// pushes/pulls/creates count tensors (a request may carry several);
// `requests` counts RPC calls, whatever their outcome.
struct ShardCounters {
  std::array<std::atomic<uint64_t>, kRequestKinds> requests{};
  std::atomic<uint64_t> pushes{0};
  std::atomic<uint64_t> pulls{0};
  std::atomic<uint64_t> creates{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> stale{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> shared_bytes{0};        // of bytes_in and bytes_out, through shared memory
  std::atomic<uint64_t> steps_applied{0};
  std::atomic<uint32_t> connections{0};
  std::atomic<uint64_t> duplicate_requests{0};   // retried pushes and step reports answered, not applied again
  std::atomic<int64_t> last_checkpoint_step{-1};
  std::atomic<double> last_checkpoint_unix_secs{0};
};

class Checkpointer;

// Who is calling: set per connection by hello.
struct Caller {
  int worker_index = -1;
  bool is_chief = false;
  std::string peer;
  // The caller's connection: pull replies send large tensors straight from
  // their memory, held here until written (null: always copy).
  SocketStream* stream = nullptr;
  // The peer process, for a connection on psd's Unix socket (0: other).
  pid_t peer_pid = 0;
  // Its shared memory region (attachMemory), if any. Held by every copy in
  // flight, so a connection that ends mid-copy leaves the mapping in place
  // until the copy is done.
  std::shared_ptr<SharedRegion> shared;
  uint32_t shared_id = 0;
};

class Shard {
 public:
  Shard(ShardOptions options, ComputePool& pool, kj::Timer& timer);

  // Each throws RequestError (nothing changed) for bad input.
  void hello(const Caller& caller);
  void goodbye(const Caller& caller);
  void create(wire::Shard::CreateParams::Reader params, wire::Shard::CreateResults::Builder results);
  // results_of_size gets the reply, sized to hold all but the tensors sent
  // from their own memory in its first segment.
  kj::Promise<void> pull(const Caller& caller, wire::Shard::PullParams::Reader params,
                         kj::FunctionParam<wire::Shard::PullResults::Builder(capnp::MessageSize)> results_of_size);
  kj::Promise<void> push(const Caller& caller, wire::Shard::PushParams::Reader params,
                         wire::Shard::PushResults::Builder results);
  void list(wire::Shard::ListResults::Builder results) const;
  void stats(wire::ShardStats::Builder out) const;
  void info(wire::ShardInfo::Builder out) const;
  void init_job(wire::JobConfig::Reader config);
  // The chief has created the model. Refused in sync mode on a shard with no
  // trainable tensor: its global step would never move (steps complete by
  // their gradients), so checkpoints at a step there would wait for good.
  void set_ready();
  // Returns (global step, stop).
  std::pair<int64_t, bool> step_done(const Caller& caller, int64_t step);
  // The stepDone RPC: step_done once per request id (nonzero), so that a
  // report retried after a lost reply does not move an async job's step twice.
  std::pair<int64_t, bool> step_done_request(const Caller& caller, int64_t step, uint64_t request_id);
  // Keeps a worker's progress report (the report RPC) for metrics and the status page.
  void report(const Caller& caller, wire::Shard::ReportParams::Reader params);
  // Called by whoever writes a checkpoint, once it is durable.
  void note_checkpoint(int64_t step, double unix_secs);

  // --- Checkpoints and restarts (shard_snapshot.cc) ---
  // Copies every tensor (values, slots, version) and the job state as they
  // are now; the copies of large tensors run on their strands, so each one
  // sees exactly the updates committed before this call.
  kj::Promise<std::shared_ptr<ShardCheckpoint>> snapshot();
  // The same, at global step `step`: now if the job is there, or at the
  // moment it gets there (before any later commit). step < 0: now. A sync
  // step already passed is an error; other modes take the first step >= it.
  kj::Promise<std::shared_ptr<ShardCheckpoint>> snapshot_at_step(int64_t step);
  // Loads a checkpoint into an empty shard (at start-up). Throws ps::Error.
  void restore(const ShardCheckpoint& c);
  void set_checkpointer(Checkpointer* c) { checkpointer_ = c; }
  Checkpointer* checkpointer() const { return checkpointer_; }

  // --- Worker failures (shard_recovery.cc) ---
  // Completes the current sync step if the workers left have all contributed.
  void recheck_sync_step();
  // A worker made a request (liveness for worker_timeout).
  void saw_worker(int worker_index);
  // Marks workers silent past worker_timeout as lost; called periodically.
  void check_worker_timeouts();
  // Runs check_worker_timeouts every second and logs waits() every few
  // seconds, forever (cancel to stop).
  kj::Promise<void> watch_workers(kj::Timer& timer);
  // What the job waits for, one line each, for waits older than
  // `older_than`: the sync step and the workers it misses, barriers
  // (JobState::barrier_waits). For psd's log, status page and stats.
  std::vector<std::string> waits(kj::Duration older_than);
  // waits() as the watcher last found them (a few seconds old at most).
  const std::vector<std::string>& current_waits() const { return current_waits_; }

  JobState& job() { return job_; }
  const JobState& job() const { return job_; }
  const ShardOptions& options() const { return options_; }
  TensorStore& store() { return store_; }
  const TensorStore& store() const { return store_; }
  ShardCounters& counters() { return counters_; }
  const ShardCounters& counters() const { return counters_; }
  // Seconds spent in an optimizer apply, per tensor (async pushes and sync commits).
  const Histogram& apply_latency() const { return apply_latency_; }
  // Per push from a worker, in steps: sync: global step - the gradient's step;
  // async and bounded staleness: the worker's step - the slowest connected worker's step.
  const Histogram& push_staleness() const { return push_staleness_; }
  int64_t last_checkpoint_step() const { return counters_.last_checkpoint_step; }  // -1: none yet
  double last_checkpoint_unix_secs() const { return counters_.last_checkpoint_unix_secs; }

 private:
  // `step` if within [0, kMaxStep]; else throws RequestError naming `what`.
  static int64_t checked_step(int64_t step, const char* what);
  // Per-tensor sums for the current sync step.
  struct SyncSlot {
    std::vector<float> sum;        // written on the tensor's strand
    uint32_t count = 0;            // the rest on the event loop
    std::vector<int> contributors;
    bool complete = false;
  };
  // Gradients a sync step waits for in `slot`, given the workers that have
  // left (shard_recovery.cc).
  uint32_t replicas_needed(const SyncSlot& slot) const;

  // into[i] >= 0: tensor i goes to that offset of `shared` instead of the reply.
  kj::Promise<void> read_tensors(std::vector<StoredTensor*> tensors, wire::Shard::PullResults::Builder results,
                                 SocketStream* stream, const std::vector<int64_t>& into,
                                 std::shared_ptr<SharedRegion> shared);
  // The bytes a slice names in the caller's region; throws RequestError
  // (naming `what`) for a slice that is not there.
  const std::byte* shared_slice(const Caller& caller, wire::SharedSlice::Reader slice, const char* what) const;
  // Tensors up to ShardOptions::inline_bytes are worked on in the event
  // loop; larger ones on the compute pool (run_on decides).
  bool runs_inline(const StoredTensor* t) const;
  kj::Promise<void> run_on(StoredTensor* t, std::function<void()> fn);
  // t->apply(g, scale), timed into apply_latency_; runs on any thread.
  void timed_apply(StoredTensor* t, std::span<const float> g, float scale);
  wire::PushStatus offer_sync(StoredTensor* t, int worker, std::span<const float> g, kj::Vector<kj::Promise<void>>& work);
  void commit_sync_step();
  uint64_t trainable_count() const;
  void step_reached();  // fires snapshots waiting for the new global step

  ShardOptions options_;
  // Tells clients that reconnect whether this is the psd they lost (ShardInfo.instanceId).
  const uint64_t instance_id_;
  ComputePool& pool_;
  TensorStore store_;
  ShardCounters counters_;
  JobState job_;
  std::unordered_map<StoredTensor*, SyncSlot> sync_;
  uint64_t complete_tensors_ = 0;
  // The sync step pending (a gradient in, not complete) and since when
  // (shard_recovery.cc); -1: none.
  int64_t pending_step_ = -1;
  kj::TimePoint pending_since_ = kj::origin<kj::TimePoint>();
  kj::TimePoint last_waits_log_ = kj::origin<kj::TimePoint>();
  std::vector<std::string> current_waits_;
  void note_sync_pending();
  std::vector<int> sync_contributors() const;  // workers that gave every tensor of the step
  Histogram apply_latency_;
  Histogram push_staleness_;
  RequestLog requests_;
  Checkpointer* checkpointer_ = nullptr;
  std::multimap<int64_t, kj::Own<kj::PromiseFulfiller<std::shared_ptr<ShardCheckpoint>>>> step_snapshots_;
  kj::TaskSet tasks_;  // sync-step applies nobody waits for
};


}  // namespace ps
