#include "server/shard.h"

#include "server/shard_tables.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <spdlog/spdlog.h>

#include "common/finite.h"
#include "common/random_bits.h"
#include "common/tensor_name.h"
#include "ps/errors.h"

namespace ps {
namespace {

class LogErrors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override {
    spdlog::error("update task failed: {}", e.getDescription().cStr());
  }
};
LogErrors log_errors;

// Apply latency, seconds: a small tensor applies in microseconds, a
// hundred-megabyte Adam update in tens of milliseconds.
std::vector<double> apply_latency_bounds() {
  return {1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0};
}

// Staleness, steps: 0 is the healthy case, tens means a straggler.
std::vector<double> staleness_bounds() { return {0, 1, 2, 3, 5, 10, 20, 50, 100, 1000}; }

// Never 0: that means "an older psd, no id" to clients.
uint64_t draw_instance_id() {
  const uint64_t id = random_u64();
  return id != 0 ? id : 1;
}

}  // namespace

const char* request_kind_name(RequestKind kind) {
  switch (kind) {
    case RequestKind::kHello:
      return "hello";
    case RequestKind::kCheckpoint:
      return "checkpoint";
    case RequestKind::kCreate:
      return "create";
    case RequestKind::kPull:
      return "pull";
    case RequestKind::kPush:
      return "push";
    case RequestKind::kList:
      return "list";
    case RequestKind::kStats:
      return "stats";
    case RequestKind::kInitJob:
      return "initJob";
    case RequestKind::kSetReady:
      return "setReady";
    case RequestKind::kWaitReady:
      return "waitReady";
    case RequestKind::kStepDone:
      return "stepDone";
    case RequestKind::kBarrier:
      return "barrier";
    case RequestKind::kFinish:
      return "finish";
    case RequestKind::kReport:
      return "report";
    case RequestKind::kProbe:
      return "probe";
    case RequestKind::kAttachMemory:
      return "attachMemory";
    case RequestKind::kCreateTables:
      return "createTables";
    case RequestKind::kPullRows:
      return "pullRows";
    case RequestKind::kPushRows:
      return "pushRows";
    case RequestKind::kListTables:
      return "listTables";
    case RequestKind::kRestoreRows:
      return "restoreRows";
    case RequestKind::kCount:
      break;
  }
  return "?";
}

Shard::Shard(ShardOptions options, ComputePool& pool, kj::Timer& timer, MemoryBudget* budget)
    : options_(std::move(options)),
      instance_id_(draw_instance_id()),
      pool_(pool),
      budget_(budget),
      store_(options_.limits, budget),
      job_(timer),
      apply_latency_(apply_latency_bounds()),
      push_staleness_(staleness_bounds()),
      tasks_(log_errors),
      tables_(std::make_unique<ShardTables>()) {
  if (budget_ != nullptr) tables_->reserved = budget_->reserve_anyway(MemoryUse::kTensors, 0);
  // A worker that leaves may be the one a sync step is waiting for.
  job_.on_worker_lost([this] { recheck_sync_step(); });
}

void Shard::hello(const Caller& caller) {
  job_.connect(caller.worker_index, caller.is_chief, caller.peer);
}

void Shard::goodbye(const Caller& caller) { job_.disconnect(caller.worker_index, caller.is_chief); }

void Shard::init_job(const JobConfig& config) {
  job_.configure(config);
  tables_reached_step();  // a start_step moves the tables' clocks too
}

void Shard::set_ready() {
  check_can_be_ready();
  job_.set_ready();
}

void Shard::create(const CreateRequest& request, CreateReply& reply) {
  if (request.values_left_out && !request.validate_only) {
    throw RequestError("create: values may be left out only when validating");
  }
  if ((request.pending_tensors != 0 || request.pending_bytes != 0) && !request.validate_only) {
    throw RequestError("create: pending tensors are counted only when validating");
  }
  const auto values =
      request.values_left_out ? TensorStore::Values::kLeftOut : TensorStore::Values::kGiven;
  // Validate everything first, so a bad spec in a batch creates nothing.
  std::set<std::string> names;
  // With what the same create's earlier checks found new here (a value too
  // large only makes this check fail: the caller's own loss).
  TensorStore::Pending pending{request.pending_bytes,
                               static_cast<std::size_t>(request.pending_tensors)};
  for (const CreateRequest::Tensor& t : request.tensors) {
    if (!names.insert(t.spec.name).second) {
      throw RequestError("create: tensor '" + t.spec.name + "' appears twice in one request");
    }
    store_.validate(t.spec, t.part, &pending, values);
  }
  reply.tensors.clear();
  if (request.validate_only) {
    reply.pending_tensors = pending.tensors;
    reply.pending_bytes = pending.bytes;
    return;
  }
  reply.tensors.reserve(request.tensors.size());
  for (const CreateRequest::Tensor& t : request.tensors) {
    auto [tensor, created] = store_.create(t.spec, t.part);
    reply.tensors.push_back({tensor, created});
  }
  counters_.creates += request.tensors.size();
}

void Shard::refuse_sync_addition(const Caller& caller, const char* what, const char* kind,
                                 const std::string& name) const {
  if (caller.is_chief || !job_.configured() || job_.config().mode != SyncMode::kSync) return;
  const std::string as = caller.worker_index >= 0 ? "worker " + std::to_string(caller.worker_index)
                                                  : std::string("no worker");
  throw RequestError(std::string(what) + ": a new trainable " + kind + " '" + name +
                     "' in a sync job would hold every step for gradients its workers do not "
                     "send; only the chief adds them (this connection said hello as " +
                     as + "; nothing was created)");
}

void Shard::check_sync_additions(const Caller& caller, const CreateRequest& request) const {
  for (const CreateRequest::Tensor& t : request.tensors)
    if (t.spec.trainable && store_.find(t.spec.name) == nullptr)
      refuse_sync_addition(caller, "create", "tensor", t.spec.name);
}

bool Shard::runs_inline(const StoredTensor* t) const {
  return t->size() * sizeof(float) <= options_.inline_bytes;
}

kj::Promise<void> Shard::run_on(StoredTensor* t, std::function<void()> fn) {
  if (runs_inline(t)) {
    // A failure (an update refused) fails this promise, as on the pool: the
    // request's other tensors still go ahead.
    try {
      fn();
    } catch (const std::exception& e) {
      return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(e.what()));
    }
    return kj::READY_NOW;
  }
  return pool_.run(t->id(), std::move(fn));
}

void Shard::timed_apply(StoredTensor* t, std::span<const float> g, float scale,
                        const KnownUpdate& known) {
  // steady_clock::now() is a vDSO call, not a system call: negligible next
  // to an apply.
  const auto start = std::chrono::steady_clock::now();
  const bool applied = t->apply(g, scale, !options_.allow_nonfinite, known);
  apply_latency_.observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (!applied) throw RequestError(nonfinite_update_refusal(t->spec()));
}

// A step a request names, checked before psd counts with it (a step from a
// client could otherwise overflow the differences taken between steps).
int64_t Shard::checked_step(int64_t step, const char* what) {
  if (!step_in_range(step)) {
    throw RequestError(std::string(what) + ": step " + std::to_string(step) +
                       " is out of range [0, 2^62]");
  }
  return step;
}

const std::byte* Shard::shared_slice(const Caller& caller, const SharedSliceRef& slice,
                                     const char* what) const {
  if (!caller.shared) {
    throw RequestError(std::string(what) +
                       ": this connection has no shared memory region (attachMemory first)");
  }
  if (slice.region != caller.shared_id) {
    throw RequestError(std::string(what) + ": no shared memory region " +
                       std::to_string(slice.region) + " on this connection");
  }
  if (!caller.shared->contains(slice.offset, slice.bytes)) {
    throw RequestError(std::string(what) + ": shared slice of " + std::to_string(slice.bytes) +
                       " bytes at " + std::to_string(slice.offset) +
                       " lies outside the region of " + std::to_string(caller.shared->size()) +
                       " bytes");
  }
  return caller.shared->data() + slice.offset;
}

uint64_t Shard::trainable_count() const {
  uint64_t n = 0;
  for (StoredTensor* t : store_.all()) n += t->spec().trainable;
  return n + table_count();
}

void Shard::check_step_done(const Caller& caller, int64_t step) const {
  if (caller.worker_index < 0)
    throw RequestError("stepDone: only workers report steps (say hello with a worker index)");
  checked_step(step, "stepDone");
  job_.check_worker(caller.worker_index);
}

std::pair<int64_t, bool> Shard::step_done(const Caller& caller, int64_t step) {
  check_step_done(caller, step);
  saw_worker(caller.worker_index);
  WorkerRecord& w = job_.worker(caller.worker_index);
  w.step = std::max(w.step, step + 1);
  if (job_.config().mode != SyncMode::kSync) {
    job_.advance_step();
    step_reached();
  }
  job_.worker_progressed();
  return {job_.global_step(), job_.stop_reached()};
}

std::pair<int64_t, bool> Shard::step_done_request(const Caller& caller, int64_t step,
                                                  uint64_t request_id) {
  if (request_id != 0 && caller.worker_index >= 0 &&
      requests_.find(requester(caller), request_id) != nullptr) {
    ++counters_.duplicate_requests;
    return {job_.global_step(), job_.stop_reached()};
  }
  check_step_done(caller, step);
  // Logged before the step counts: a checkpoint taken at the step it reaches holds the id.
  if (request_id != 0)
    requests_.record(requester(caller), RecentRequest{request_id, job_.global_step(), {}});
  return step_done(caller, step);
}

void Shard::report(const Caller& caller, WorkerReport r) {
  if (caller.worker_index < 0)
    throw RequestError("report: only workers report progress (say hello with a worker index)");
  job_.check_worker(caller.worker_index);
  r.unix_secs =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  job_.worker(caller.worker_index).report = r;
}

void Shard::note_checkpoint(int64_t step, double unix_secs) {
  counters_.last_checkpoint_step = step;
  counters_.last_checkpoint_unix_secs = unix_secs;
}

}  // namespace ps
