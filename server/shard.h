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
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include <kj/async.h>
#include <kj/timer.h>
#include <kj/vector.h>

#include "common/memory_budget.h"
#include "server/compute_pool.h"
#include "server/histogram.h"
#include "server/job_state.h"
#include "common/checkpoint/checkpoint_file.h"
#include "server/request_log.h"
#include "common/net/shared_region.h"
#include "server/shard_requests.h"
#include "server/tensor_store.h"
#include "common/embedding_wire.h"
#include "server/embedding/embedding_table.h"
#include "server/table_requests.h"

namespace ps {

struct ShardOptions {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  bool allow_nonfinite = false;            // accept NaN/Inf gradients (refused by default)
  uint64_t inline_bytes = 1u << 20;        // smaller updates and reads run on the event loop
  // Threads one large embedding-table pull or push is spread over: the
  // event loop's and up to table_threads - 1 of the compute pool's.
  unsigned table_threads = 1;
  uint64_t max_message_bytes = 80u << 20;  // advertised to clients; enforced by the RPC reader
  StoreLimits limits;
  std::string auth_token;   // non-empty: hello must carry it
  std::string unix_socket;  // absolute path psd also listens on, told to clients; empty: none
  uint64_t max_tensors_per_client = 0;  // tensors one connection may create; 0 = no limit
  uint32_t worker_timeout_secs =
      0;  // sync: a silent worker is not waited for after this; 0 = never
  uint64_t max_shared_memory_bytes =
      1ull << 30;  // largest region a Unix-socket client may attach; 0: none
};

// The RPC methods, for per-kind request counts (ps_requests_total{kind=...}).
enum class RequestKind : unsigned {
  kHello,
  kCreate,
  kPull,
  kPush,
  kList,
  kStats,
  kInitJob,
  kSetReady,
  kWaitReady,
  kStepDone,
  kBarrier,
  kFinish,
  kReport,
  kCheckpoint,
  kProbe,
  kAttachMemory,
  kCreateTables,
  kPullRows,
  kPushRows,
  kListTables,
  kRestoreRows,
  kCount
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
  std::atomic<uint64_t> shared_bytes{0};  // of bytes_in and bytes_out, through shared memory
  std::atomic<uint64_t> steps_applied{0};
  std::atomic<uint32_t> connections{0};
  std::atomic<uint64_t> duplicate_requests{
      0};  // retried pushes and step reports answered, not applied again
  std::atomic<int64_t> last_checkpoint_step{-1};
  std::atomic<double> last_checkpoint_unix_secs{0};
};

class Checkpointer;
struct ShardTables;

// A tensor of a checkpoint that a restore left out, and why.
struct SkippedTensor {
  std::string name;
  std::string reason;
};

// Who is calling: set per connection by hello.
struct Caller {
  int worker_index = -1;
  uint64_t client_id = 0;  // hello's: keys the request-id window of a caller with no worker index
  bool is_chief = false;
  std::string peer{};
  // The peer process, for a connection on psd's Unix socket (0: other).
  pid_t peer_pid = 0;
  // Its shared memory region (attachMemory), if any. Held by every copy in
  // flight, so a connection that ends mid-copy leaves the mapping in place
  // until the copy is done.
  std::shared_ptr<SharedRegion> shared{};
  uint32_t shared_id = 0;
};

class Shard {
 public:
  // `budget` (may be null: no budget) counts the tensors stored; it must outlive the shard.
  Shard(ShardOptions options, ComputePool& pool, kj::Timer& timer, MemoryBudget* budget = nullptr);
  ~Shard();
  // Expired once this Shard is being destroyed. A connection's service
  // object can outlive the Shard at shutdown (calls still waiting are
  // destroyed with the event loop, after the server), so it checks this
  // before telling the Shard it is gone.
  std::weak_ptr<void> lifetime() const { return lifetime_; }

  // Each throws RequestError (nothing changed) for bad input.
  void hello(const Caller& caller);
  void goodbye(const Caller& caller);
  // Creates every tensor of the request or, for any bad spec, none.
  void create(const CreateRequest& request, CreateReply& reply);
  // A configured sync job counts every trainable tensor and table in each
  // step (trainable_count()): a new one that a connection other than the
  // chief's adds would hold every step for gradients the job's workers do
  // not know to send. Throws RequestError, naming the first, for such a
  // create / createTables.
  void check_sync_additions(const Caller& caller, const CreateRequest& request) const;
  void check_sync_additions(const Caller& caller, const std::vector<ShardTableSpec>& specs) const;
  // The data path (shard_pull.cc, shard_push.cc), in plain types
  // (shard_requests.h). Each checks the whole request first and throws
  // RequestError, having changed nothing, for anything wrong with it.
  // pull: the named tensors' values at one global step >= min_step, into
  // `reply` (which must outlive the promise); the promise settles once all
  // are in.
  kj::Promise<void> pull(const Caller& caller, const PullRequest& request, PullReply& reply);
  // push: `reply` is complete once the promise settles, which is when the
  // updates are applied (the gradients' memory must stay valid until then;
  // `request` itself only during the call). An async push is all or nothing:
  // if any tensor's update would leave a value NaN or Inf, none is applied.
  kj::Promise<void> push(const Caller& caller, const PushRequest& request, PushReply& reply);
  std::vector<StoredTensor*> list() const { return store_.all(); }  // in name order
  // The job's configuration, from the chief (initJob): idempotent for the
  // same one; another is refused (JobState::configure).
  void init_job(const JobConfig& config);
  // The chief has created the model. Refused in sync mode on a shard with no
  // trainable tensor: its global step would never move (steps complete by
  // their gradients), so checkpoints at a step there would wait for good.
  void set_ready();
  // set_ready's check on the job and tensors as they are now (a restore
  // runs it too). Throws RequestError.
  void check_can_be_ready() const;
  // Returns (global step, stop).
  std::pair<int64_t, bool> step_done(const Caller& caller, int64_t step);
  // The stepDone RPC: step_done once per request id (nonzero), so that a
  // report retried after a lost reply does not move an async job's step twice.
  std::pair<int64_t, bool> step_done_request(const Caller& caller, int64_t step,
                                             uint64_t request_id);
  // Keeps a worker's progress report (the report RPC) for metrics and the status page.
  // (`report.unix_secs` is set here, to when psd received it.)
  void report(const Caller& caller, WorkerReport report);
  // --- Embedding tables (shard_tables.cc) ---
  // Creates this shard's part of each table, all checked first; existing
  // tables of the same kind are reported (created = false).
  std::vector<TableReport> create_tables(const std::vector<ShardTableSpec>& specs,
                                         bool validate_only);
  // Reads rows into the buffer `out` gives (after waiting for min_step in
  // sync and bounded-staleness modes, as pull).
  kj::Promise<void> pull_rows(const Caller& caller, PullRowsRequest request, RowsOut out);
  // Applies (async), accumulates (sync) or drops (stale) a push of rows.
  PushRowsReply push_rows(const Caller& caller, const PushRowsRequest& request);
  std::vector<TableReport> list_tables() const;
  uint64_t table_count() const;
  // Sets rows (values and optimizer slots) of a table, as a restore into
  // another shard count does; the table's update count becomes at least
  // `version`; ages (empty, or one per id): EmbeddingTable::put_rows'.
  // Checked whole first (ids, lengths, NaN/Inf, row limit).
  void restore_rows(std::string_view table, std::span<const uint64_t> ids,
                    std::span<const float> values, const std::vector<std::span<const float>>& slots,
                    uint64_t version, std::span<const uint32_t> ages = {});
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
  // `admit`, if set, runs just before a later step's snapshot is taken; a
  // non-empty answer refuses that snapshot, with it as the error.
  kj::Promise<std::shared_ptr<ShardCheckpoint>> snapshot_at_step(
      int64_t step, std::function<std::string()> admit = {});
  // Loads a checkpoint into an empty shard (at start-up), running the
  // checks of the live requests on it. Throws ps::Error (the shard left
  // empty) for a file of another shard, a job initJob would refuse, or a
  // ready flag setReady would refuse; a tensor create would refuse is left
  // out, and returned with the reason (also kept: restore_skipped()).
  std::vector<SkippedTensor> restore(const ShardCheckpoint& c);
  const std::vector<SkippedTensor>& restore_skipped() const { return restore_skipped_; }
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
  // (JobState::barrier_waits), sync pulls for a step no gradient has
  // started, bounded-staleness pulls, and psd's exit once the job is done
  // (server/job_waits.cc). For psd's log, status page and stats.
  std::vector<std::string> waits(kj::Duration older_than);
  // waits() as the watcher last found them (a few seconds old at most).
  const std::vector<std::string>& current_waits() const { return current_waits_; }

  JobState& job() { return job_; }
  const JobState& job() const { return job_; }
  const ShardOptions& options() const { return options_; }
  uint64_t instance_id() const { return instance_id_; }
  TensorStore& store() { return store_; }
  const TensorStore& store() const { return store_; }
  // The memory budget psd counts against (null: none), for metrics.
  const MemoryBudget* memory_budget() const { return budget_; }
  ShardCounters& counters() { return counters_; }
  const ShardCounters& counters() const { return counters_; }
  // Seconds spent in an optimizer apply, per tensor (async pushes and sync commits).
  const Histogram& apply_latency() const { return apply_latency_; }
  // Per push from a worker, in steps: sync: global step - the gradient's step;
  // async and bounded staleness: the worker's step - the slowest connected worker's step.
  const Histogram& push_staleness() const { return push_staleness_; }
  int64_t last_checkpoint_step() const { return counters_.last_checkpoint_step; }  // -1: none yet
  double last_checkpoint_unix_secs() const { return counters_.last_checkpoint_unix_secs; }
  // The bytes a slice names in the caller's region; throws RequestError
  // (naming `what`) for a slice that is not there (the RPC face's row paths use it too).
  const std::byte* shared_slice(const Caller& caller, const SharedSliceRef& slice,
                                const char* what) const;

 private:
  // step_done's checks: throws RequestError.
  void check_step_done(const Caller& caller, int64_t step) const;
  // `step` if within [0, kMaxStep]; else throws RequestError naming `what`.
  static int64_t checked_step(int64_t step, const char* what);
  // Per-tensor sums for the current sync step.
  struct SyncSlot {
    std::vector<float> sum;  // written on the tensor's strand
    MemoryBudget::Reservation sum_bytes;  // the sum's, held as long as it is
    uint32_t count = 0;      // the rest on the event loop
    std::vector<int> contributors;
    bool complete = false;
    double grad_max_sum = 0;  // of the contributions' PushGrad::grad_max: bounds |sum|
  };
  // Gradients a sync step waits for in `slot`, given the workers that have
  // left (shard_recovery.cc).
  uint32_t replicas_needed(const SyncSlot& slot) const;

  // --- pull's steps (shard_pull.cc) ---
  struct PullPlan {
    std::vector<StoredTensor*> tensors;
    std::vector<int64_t>
        into;  // per tensor: -1 into the reply, else an offset in the caller's region
    int64_t min_step = 0;
  };
  // Check: every name, slice and the reply's size; throws RequestError.
  PullPlan check_pull(const Caller& caller, const PullRequest& request) const;
  // Reads the tensors into `reply` (route: the wait for the step comes first).
  kj::Promise<void> read_tensors(std::vector<StoredTensor*> tensors,
                                 const std::vector<int64_t>& into,
                                 std::shared_ptr<SharedRegion> shared, PullReply& reply);

  // --- push's steps (shard_push.cc) ---
  struct PushGrad {
    StoredTensor* tensor;
    std::span<const float> values;
    // Every |value| is at most this, as checked on arrival: half the
    // tensor's safe gradient bound where the values are within it (half, so
    // that a sync step's sum of such gradients is within the bound of their
    // average), else the gradient limit (infinity when nothing is checked).
    float grad_max;
  };
  struct PushWork {
    std::vector<PushGrad> grads;
    // Gradients that came in shared memory, copied out (kept until applied).
    std::shared_ptr<std::vector<std::unique_ptr<float[]>>> copied;
    uint64_t bytes = 0;
    uint64_t shared_bytes = 0;
    // Per gradient, the version its update was found finite at (checked
    // before anything of the push was applied); empty: checked as applied.
    std::vector<std::optional<uint64_t>> checked_versions;
    // Sync: for a step already done, dropped whole as stale (route_push):
    // nothing of it is applied, so none of its updates is checked.
    bool stale = false;
  };
  // Record, route and record the answer of a checked push.
  kj::Promise<void> commit_push(const Caller& caller, const PushRequest& request, PushReply& reply,
                                PushWork work);
  // A push with a tensor updated on arrival (async, or a non-trainable one in
  // sync mode) on the compute pool: every such update is checked first, on
  // the tensors' strands, and then all are applied (and the request counted),
  // or none. Later pushes of the same pool tensors wait
  // until this one's updates are queued, so what is applied is what was checked.
  kj::Promise<void> push_checked_whole(const Caller& caller, const PushRequest& request,
                                       PushReply& reply, PushWork work);
  bool needs_whole_check(const PushWork& work) const;
  // Whether a pushed gradient updates its tensor now (async and bounded
  // staleness; a non-trainable tensor in sync mode) rather than at the sync
  // step's commit.
  bool applied_on_arrival(const PushGrad& g) const;
  // Sync: the sums a push's trainable gradients go into, allocated and
  // counted in the memory budget the first time, before anything of the
  // push is recorded; throws RequestError when psd has no room.
  void reserve_sync_sums(const PushWork& work);
  // Check: the steps and the caller; throws RequestError.
  void check_push_caller(const Caller& caller, const PushRequest& request);
  // A retry of a push already applied (its reply was lost): answers it
  // again into `reply` and returns true.
  bool answer_retry(const Caller& caller, const PushRequest& request, PushReply& reply);
  // Check: every gradient (name, size, finite values) and the step; throws RequestError.
  PushWork check_push(const Caller& caller, const PushRequest& request) const;
  // Record: the worker's progress, staleness and the counters.
  void record_push_arrival(const Caller& caller, int64_t step, const PushWork& work);
  // Route: async applies now; sync sums into the step's slots (or finds the
  // gradients stale). Sets reply.status; the applies and sums go to `pending`.
  void route_push(const Caller& caller, int64_t step, const PushWork& work, PushReply& reply,
                  kj::Vector<kj::Promise<void>>& pending);
  // Record: the request log's answer for a retry, then the step report.
  void record_push_answer(const Caller& caller, const PushRequest& request, PushReply& reply);

  // A push whose update on arrival of a tensor applied on the event loop
  // would leave a value NaN or Inf is refused before any of it is applied (larger
  // tensors are checked on their strands: push_checked_whole). Throws
  // RequestError (shard_checks.cc).
  void refuse_nonfinite_updates(const std::vector<PushGrad>& work) const;
  // Tensors up to ShardOptions::inline_bytes are worked on in the event
  // loop; larger ones on the compute pool (run_on decides).
  bool runs_inline(const StoredTensor* t) const;
  kj::Promise<void> run_on(StoredTensor* t, std::function<void()> fn);
  // t->apply(g, scale), timed into apply_latency_; runs on any thread.
  void timed_apply(StoredTensor* t, std::span<const float> g, float scale,
                   const KnownUpdate& known = {});
  GradientStatus offer_sync(const PushGrad& grad, int worker, kj::Vector<kj::Promise<void>>& work);
  void commit_sync_step();
  uint64_t trainable_count() const;
  // Applies a table update (`new_rows`: what check() returned for the ids):
  // false, and nothing changed, where it would store a NaN or Inf, unless
  // --allow_nonfinite lets it through. `within_bound` and `repeats`: as
  // EmbeddingTable::push_if_finite's.
  bool apply_table_update(EmbeddingTable& table, std::span<const uint64_t> ids,
                          std::span<const float> grads, float scale, uint64_t new_rows,
                          std::optional<bool> within_bound, EmbeddingTable::Repeats repeats);
  // Tables' part of sync steps (shard_tables.cc).
  void commit_table_step();
  void recheck_table_sync();
  uint32_t table_replicas_needed(const std::vector<int>& contributors) const;
  void snapshot_tables(ShardCheckpoint& c) const;
  // Sync: per worker, the tables it gave this step's gradient for; `pending`
  // set if any table has one (check_worker_timeouts).
  void count_table_contributions(std::map<int, uint64_t>& given, bool& pending) const;
  void restore_tables(const ShardCheckpoint& c);
  // The tables' clocks to the global step now, dropping rows that expire
  // (TableSpec::expire_after_steps).
  void tables_reached_step();
  void check_memory(uint64_t extra, const std::string& what) const;
  // check_sync_additions' refusal of `name` (`kind`: "tensor" or "table"),
  // when the rule applies to `caller`.
  void refuse_sync_addition(const Caller& caller, const char* what, const char* kind,
                            const std::string& name) const;
  void step_reached();  // expires table rows, fires snapshots waiting for the new global step

  ShardOptions options_;
  // Tells clients that reconnect whether this is the psd they lost (ShardInfo.instanceId).
  const uint64_t instance_id_;
  ComputePool& pool_;
  MemoryBudget* budget_;
  TensorStore store_;
  ShardCounters counters_;
  JobState job_;
  std::unordered_map<StoredTensor*, SyncSlot> sync_;
  // Pool tensors whose whole-checked push has not queued its updates yet:
  // fulfilled (or broken, if that push is dropped) once it has.
  struct PushGate {
    uint64_t id = 0;
    std::shared_ptr<kj::ForkedPromise<void>> open;
  };
  std::unordered_map<const StoredTensor*, PushGate> push_gates_;
  uint64_t next_gate_id_ = 0;
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
  static RequestLog::Requester requester(const Caller& c) {
    return RequestLog::requester(c.worker_index, c.client_id);
  }
  Checkpointer* checkpointer_ = nullptr;
  std::vector<SkippedTensor> restore_skipped_;
  struct StepSnapshot {
    kj::Own<kj::PromiseFulfiller<std::shared_ptr<ShardCheckpoint>>> fulfiller;
    std::function<std::string()> admit;
  };
  std::multimap<int64_t, StepSnapshot> step_snapshots_;
  kj::TaskSet tasks_;  // sync-step applies nobody waits for
  std::unique_ptr<ShardTables> tables_;
  // Expires first when the Shard goes (the last member): see lifetime().
  std::shared_ptr<char> lifetime_ = std::make_shared<char>();
};

}  // namespace ps
