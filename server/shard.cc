#include "server/shard.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <capnp/orphan.h>
#include <spdlog/spdlog.h>

#include "common/finite.h"
#include "common/net/host_id.h"
#include "common/random_bits.h"
#include "ps/errors.h"
#include "common/wire_convert.h"

namespace ps {
namespace {

void to_wire_meta(const StoredTensor& t, bool created, wire::TensorMeta::Builder out) {
  out.setName(t.spec().name);
  auto shape = out.initShape(static_cast<unsigned>(t.spec().shape.size()));
  for (unsigned i = 0; i < t.spec().shape.size(); ++i) shape.set(i, t.spec().shape[i]);
  out.setVersion(t.version());
  out.setOptimizer(static_cast<wire::OptimizerKind>(t.spec().optimizer.kind));
  out.setTrainable(t.spec().trainable);
  out.setCreated(created);
  if (const auto& p = t.part()) part_to_wire(*p, out.initPart());
}

std::optional<PartMeta> part_from_wire(wire::TensorSpec::Reader spec) {
  if (!spec.hasPart()) return std::nullopt;
  auto p = spec.getPart();
  return PartMeta{p.getFullName(), shape_from_wire(p.getFullShape()), p.getOffset(), p.getIndex(), p.getCount()};
}

class LogErrors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override { spdlog::error("update task failed: {}", e.getDescription().cStr()); }
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
    case RequestKind::kHello: return "hello";
    case RequestKind::kCheckpoint: return "checkpoint";
    case RequestKind::kCreate: return "create";
    case RequestKind::kPull: return "pull";
    case RequestKind::kPush: return "push";
    case RequestKind::kList: return "list";
    case RequestKind::kStats: return "stats";
    case RequestKind::kInitJob: return "initJob";
    case RequestKind::kSetReady: return "setReady";
    case RequestKind::kWaitReady: return "waitReady";
    case RequestKind::kStepDone: return "stepDone";
    case RequestKind::kBarrier: return "barrier";
    case RequestKind::kFinish: return "finish";
    case RequestKind::kReport: return "report";
    case RequestKind::kProbe: return "probe";
    case RequestKind::kAttachMemory: return "attachMemory";
    case RequestKind::kCount: break;
  }
  return "?";
}

Shard::Shard(ShardOptions options, ComputePool& pool, kj::Timer& timer)
    : options_(std::move(options)),
      instance_id_(draw_instance_id()),
      pool_(pool),
      store_(options_.limits),
      job_(timer),
      apply_latency_(apply_latency_bounds()),
      push_staleness_(staleness_bounds()),
      tasks_(log_errors) {
  // A worker that leaves may be the one a sync step is waiting for.
  job_.on_worker_lost([this] { recheck_sync_step(); });
}

void Shard::hello(const Caller& caller) { job_.connect(caller.worker_index, caller.is_chief, caller.peer); }

void Shard::goodbye(const Caller& caller) { job_.disconnect(caller.worker_index, caller.is_chief); }

void Shard::init_job(wire::JobConfig::Reader config) { job_.configure(job_from_wire(config)); }

void Shard::set_ready() {
  if (job_.configured() && job_.config().mode == SyncMode::kSync && trainable_count() == 0) {
    throw RequestError("setReady: this shard holds no trainable tensor, and in sync mode a shard's global step moves "
                       "only with its gradients: it would stay at step " + std::to_string(job_.global_step()) +
                       " for good (more ps shards than variable parts? use fewer ps hosts, or a smaller chunk size)");
  }
  job_.set_ready();
}

void Shard::create(wire::Shard::CreateParams::Reader params, wire::Shard::CreateResults::Builder results) {
  auto specs = params.getSpecs();
  if (params.getValuesLeftOut() && !params.getValidateOnly()) {
    throw RequestError("create: values may be left out only when validating");
  }
  if ((params.getPendingTensors() != 0 || params.getPendingBytes() != 0) && !params.getValidateOnly()) {
    throw RequestError("create: pending tensors are counted only when validating");
  }
  const auto values = params.getValuesLeftOut() ? TensorStore::Values::kLeftOut : TensorStore::Values::kGiven;
  // Validate everything first, so a bad spec in a batch creates nothing.
  std::vector<std::pair<TensorSpec, std::optional<PartMeta>>> parsed;
  std::set<std::string> names;
  // With what the same create's earlier checks found new here (a value too
  // large only makes this check fail: the caller's own loss).
  TensorStore::Pending pending{params.getPendingBytes(), static_cast<std::size_t>(params.getPendingTensors())};
  for (auto s : specs) {
    parsed.emplace_back(from_wire(s), part_from_wire(s));
    if (!names.insert(parsed.back().first.name).second) {
      throw RequestError("create: tensor '" + parsed.back().first.name + "' appears twice in one request");
    }
    store_.validate(parsed.back().first, parsed.back().second, &pending, values);
  }
  if (params.getValidateOnly()) {
    results.initTensors(0);
    results.setPendingTensors(pending.tensors);
    results.setPendingBytes(pending.bytes);
    return;
  }
  auto out = results.initTensors(specs.size());
  for (unsigned i = 0; i < parsed.size(); ++i) {
    auto [tensor, created] = store_.create(parsed[i].first, parsed[i].second);
    to_wire_meta(*tensor, created, out[i]);
  }
  counters_.creates += specs.size();
}

bool Shard::runs_inline(const StoredTensor* t) const { return t->size() * sizeof(float) <= options_.inline_bytes; }

kj::Promise<void> Shard::run_on(StoredTensor* t, std::function<void()> fn) {
  if (runs_inline(t)) {
    fn();
    return kj::READY_NOW;
  }
  return pool_.run(t->id(), std::move(fn));
}

void Shard::timed_apply(StoredTensor* t, std::span<const float> g, float scale) {
  // steady_clock::now() is a vDSO call (~20 ns): negligible next to an apply.
  const auto start = std::chrono::steady_clock::now();
  t->apply(g, scale);
  apply_latency_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

namespace {

// Tensors from this size up are sent from their own memory (a copy-on-write
// view held by the stream until written) rather than copied into the reply:
// no memset and memcpy on the event loop before the send. Each is a message
// segment of its own; readers refuse messages of 512 segments or more, hence
// the cap per reply.
constexpr uint64_t kSendInPlaceBytes = wire::K_PULL_SEGMENT_BYTES;
constexpr unsigned kMaxInPlacePerReply = 64;

// What a pull reply will take: `first_segment`, room for everything but
// the in-place tensors, so all of it lands in the reply's first segment,
// ahead of the tensors' own segments (a client then knows where each tensor
// goes before its bytes arrive); `bytes`, about the whole reply, checked
// against the message limit.
struct PullReplySize {
  capnp::MessageSize first_segment;
  uint64_t bytes;
};

PullReplySize pull_reply_size(capnp::List<capnp::Text>::Reader names, const std::vector<StoredTensor*>& tensors,
                              const std::vector<int64_t>& into) {
  uint64_t words = 16;
  uint64_t bytes = 0;
  for (unsigned i = 0; i < names.size(); ++i) {
    words += 8 + (names[i].size() + 8) / sizeof(capnp::word);
    bytes += 64 + names[i].size();
    if (into[i] >= 0) continue;
    const uint64_t size = tensors[i]->size() * sizeof(float);
    bytes += size;
    if (size < kSendInPlaceBytes || size % sizeof(capnp::word) != 0) words += (size + 7) / sizeof(capnp::word);
  }
  return {{words, 0}, bytes};
}

}  // namespace

// A step a request names, checked before psd counts with it (a step from a
// client could otherwise overflow the differences taken between steps).
int64_t Shard::checked_step(int64_t step, const char* what) {
  if (!step_in_range(step)) {
    throw RequestError(std::string(what) + ": step " + std::to_string(step) + " is out of range [0, 2^62]");
  }
  return step;
}

kj::Promise<void> Shard::pull(const Caller& caller, wire::Shard::PullParams::Reader params,
                              kj::FunctionParam<wire::Shard::PullResults::Builder(capnp::MessageSize)> results_of_size) {
  saw_worker(caller.worker_index);
  auto names = params.getNames();
  std::vector<StoredTensor*> tensors;
  tensors.reserve(names.size());
  for (auto n : names) tensors.push_back(&store_.get(n));
  // Where each tensor goes: -1 in the reply, else an offset in the
  // connection's shared memory region. All checked before anything is read.
  std::vector<int64_t> into(tensors.size(), -1);
  if (params.hasInto()) {
    auto slices = params.getInto();
    if (slices.size() != 0 && slices.size() != names.size()) {
      throw RequestError("pull: " + std::to_string(slices.size()) + " shared slices for " + std::to_string(names.size()) +
                         " tensors");
    }
    for (unsigned i = 0; i < slices.size(); ++i) {
      if (slices[i].getBytes() == 0) continue;
      const uint64_t want = tensors[i]->size() * sizeof(float);
      if (slices[i].getBytes() != want) {
        throw RequestError("pull: shared slice for '" + tensors[i]->spec().name + "' holds " +
                           std::to_string(slices[i].getBytes()) + " bytes, the tensor " + std::to_string(want));
      }
      shared_slice(caller, slices[i], "pull");
      into[i] = static_cast<int64_t>(slices[i].getOffset());
    }
  }
  // A reply over the message limit would be built in full and then not
  // sent (a small request naming one tensor many times asks for gigabytes):
  // refused before anything is read.
  const PullReplySize size = pull_reply_size(names, tensors, into);
  if (size.bytes > options_.max_message_bytes) {
    throw RequestError("pull: the reply would hold " + std::to_string(size.bytes) + " bytes, over this psd's message " +
                       "limit of " + std::to_string(options_.max_message_bytes) + " (--max_message_mb); pull fewer tensors at once");
  }
  auto results = results_of_size(size.first_segment);
  results.setTag(params.getTag());

  // Any negative minStep asks for no step: the same as 0.
  const int64_t min_step = checked_step(std::max<int64_t>(params.getMinStep(), 0), "pull");
  // Async pulls read at once: each promise stage the reply waits for costs
  // an allocation and a loop turn on psd's one network thread.
  if (job_.config().mode == SyncMode::kAsync) return read_tensors(std::move(tensors), results, caller.stream, into, caller.shared);
  kj::Promise<void> wait = job_.config().mode == SyncMode::kSync ? job_.wait_for_step(min_step)
                                                                 : job_.wait_for_staleness(min_step);
  return wait.then([this, tensors = std::move(tensors), into = std::move(into), results, stream = caller.stream,
                    shared = caller.shared]() mutable {
    return read_tensors(std::move(tensors), results, stream, into, std::move(shared));
  });
}

kj::Promise<void> Shard::read_tensors(std::vector<StoredTensor*> tensors, wire::Shard::PullResults::Builder results,
                                      SocketStream* stream, const std::vector<int64_t>& into,
                                      std::shared_ptr<SharedRegion> shared) {
  auto out = results.initTensors(static_cast<unsigned>(tensors.size()));
  results.setStep(job_.global_step());
  auto orphanage = capnp::Orphanage::getForMessageContaining(results);
  kj::Vector<kj::Promise<void>> copies;
  uint64_t bytes = 0;
  unsigned in_place = 0;
  // Handed to the stream only once the whole reply is built: a reply that
  // fails is never written, and must leave nothing held.
  auto held = std::make_shared<std::vector<std::shared_ptr<const std::vector<float>>>>();
  for (unsigned i = 0; i < tensors.size(); ++i) {
    StoredTensor* t = tensors[i];
    auto entry = out[i];
    entry.setName(t->spec().name);
    const uint64_t size = t->size() * sizeof(float);
    bytes += size;
    // Into the client's shared memory (nothing in the reply), or in the reply.
    std::byte* dest = into[i] >= 0 ? shared->data() + into[i] : nullptr;
    if (dest) counters_.shared_bytes += size;
    const bool send_in_place = !dest && stream != nullptr && size >= kSendInPlaceBytes &&
                               size % sizeof(capnp::word) == 0 && in_place < kMaxInPlacePerReply;
    in_place += send_in_place;
    auto fill = [entry, orphanage, held, send_in_place, dest, shared](StoredTensor::View& view) mutable {
      auto data = kj::arrayPtr(reinterpret_cast<const kj::byte*>(view.values->data()), view.values->size() * sizeof(float));
      entry.setVersion(view.version);
      if (dest) {
        std::memcpy(dest, data.begin(), data.size());
      } else if (send_in_place) {
        entry.adoptValues(orphanage.referenceExternalData(data));
        held->push_back(std::move(view.values));
      } else {
        entry.setValues(data);
      }
    };
    if (runs_inline(t)) {
      StoredTensor::View view = t->view();
      fill(view);
      continue;
    }
    // Larger tensors: the view is taken on the tensor's strand, so a pull
    // that starts after a sync step's commit sees all of that step's updates.
    auto view = std::make_shared<StoredTensor::View>();
    copies.add(pool_.run(t->id(), [t, view] { *view = t->view(); }).then([fill, view]() mutable { fill(*view); }));
  }
  counters_.pulls += tensors.size();
  counters_.bytes_out += bytes;
  auto hand_over = [stream, held] {
    for (auto& values : *held) {
      const float* data = values->data();  // before the move: argument order is unspecified
      stream->hold_until_sent(data, std::move(values));
    }
  };
  if (copies.empty()) {
    hand_over();
    return kj::READY_NOW;
  }
  return kj::joinPromises(copies.releaseAsArray()).then(kj::mv(hand_over));
}

kj::Promise<void> Shard::push(const Caller& caller, wire::Shard::PushParams::Reader params,
                              wire::Shard::PushResults::Builder results) {
  auto grads = params.getGrads();
  const int64_t step = checked_step(params.getStep(), "push");
  const int64_t done_step = params.getDoneStep();  // < 0: no step report
  if (done_step >= 0) checked_step(done_step, "push (doneStep)");
  const JobConfig& job = job_.config();
  job_.check_worker(caller.worker_index);
  if (done_step >= 0 && caller.worker_index < 0) {
    throw RequestError("push: only workers report steps (say hello with a worker index)");
  }
  saw_worker(caller.worker_index);
  const uint64_t request_id = params.getRequestId();
  if (request_id != 0) {
    if (const RecentRequest* seen = requests_.find(caller.worker_index, request_id)) {
      // A retry of a push already applied (its reply was lost): answer it
      // again, apply nothing.
      ++counters_.duplicate_requests;
      results.setStep(seen->step);
      auto status = results.initStatus(static_cast<unsigned>(seen->statuses.size()));
      for (unsigned i = 0; i < seen->statuses.size(); ++i) status.set(i, static_cast<wire::PushStatus>(seen->statuses[i]));
      if (done_step >= 0) {
        // Its step report counted the first time; the answer is the job's
        // now (as stepDone's would be), stop included.
        results.setStep(job_.global_step());
        results.setStop(job_.stop_reached());
      }
      return kj::READY_NOW;
    }
  }
  if (job_.configured() && !job_.ready()) {
    throw RequestError("push: the chief has not finished initialising the model (waitReady first)");
  }
  std::vector<std::pair<StoredTensor*, std::span<const float>>> work;
  work.reserve(grads.size());
  std::set<StoredTensor*> seen;
  uint64_t bytes = 0;
  // Gradients that came in shared memory, copied out before they are
  // checked: the client can still write there, and what is applied must be
  // what was checked. Kept until the applies are done.
  auto copied = std::make_shared<std::vector<std::unique_ptr<float[]>>>();
  uint64_t shared_bytes = 0;
  const uint32_t summed = gradients_summed_per_step(job);
  const float limit = gradient_limit(summed);
  for (auto g : grads) {
    StoredTensor& t = store_.get(g.getName());
    const bool in_shared = g.hasShared();
    auto data = g.getValues();
    const uint64_t got = in_shared ? g.getShared().getBytes() : data.size();
    if (got != t.size() * sizeof(float)) {
      throw RequestError("push: tensor '" + t.spec().name + "' of shape " + shape_to_string(t.spec().shape) +
                         " expects " + std::to_string(t.size()) + " floats (" + std::to_string(t.size() * 4) +
                         " bytes), got " + std::to_string(got) + " bytes");
    }
    if (!seen.insert(&t).second) throw RequestError("push: tensor '" + t.spec().name + "' appears twice in one request");
    std::span<const float> values;
    bool finite;
    if (in_shared) {
      if (data.size() != 0) throw RequestError("push: gradient for '" + t.spec().name + "' has both values and a shared slice");
      const auto* src = reinterpret_cast<const float*>(shared_slice(caller, g.getShared(), "push"));
      copied->push_back(std::unique_ptr<float[]>(new float[t.size()]));
      finite = copy_all_finite(copied->back().get(), src, t.size(), limit);
      values = std::span<const float>(copied->back().get(), t.size());
      shared_bytes += got;
    } else {
      values = as_floats(data);
      finite = options_.allow_nonfinite || all_finite(values, limit);
    }
    if (!options_.allow_nonfinite && !finite) throw RequestError(gradient_refusal(t.spec().name, values, summed));
    work.emplace_back(&t, values);
    bytes += got;
  }
  const bool sync = job.mode == SyncMode::kSync;
  if (sync) {
    if (caller.worker_index < 0) throw RequestError("push: sync mode needs a worker index (say hello as a worker)");
    if (step > job_.global_step()) {
      throw RequestError("push: gradient for step " + std::to_string(step) + ", but the job is at step " +
                         std::to_string(job_.global_step()) + " (a push carries the step its parameters were pulled at)");
    }
  }

  WorkerRecord* worker = caller.worker_index >= 0 ? &job_.worker(caller.worker_index) : nullptr;
  if (worker) {
    worker->pushes += work.size();
    if (job.mode != SyncMode::kSync && step > worker->step) {
      worker->step = step;
      job_.worker_progressed();  // the slowest worker moving on releases bounded-staleness pulls
    }
  }
  if (job.mode == SyncMode::kBoundedStaleness && worker) job_.record_staleness(step - job_.slowest_live_step());
  if (worker) {
    // Sync: how many steps old the gradient is (stale ones included).
    // Otherwise there is no common step to be behind: how far this worker
    // runs ahead of the slowest connected one.
    const int64_t staleness = sync ? job_.global_step() - step : step - job_.slowest_live_step();
    push_staleness_.observe(static_cast<double>(std::max<int64_t>(0, staleness)));
  }
  counters_.pushes += work.size();
  counters_.bytes_in += bytes;
  counters_.shared_bytes += shared_bytes;
  results.setStep(job_.global_step());
  auto status = results.initStatus(static_cast<unsigned>(work.size()));

  auto report_done = [&] {
    if (done_step < 0) return;
    auto [global, stop] = step_done(caller, done_step);
    results.setStep(global);
    results.setStop(stop);
  };

  auto remember = [&] {
    if (request_id == 0) return;
    RecentRequest r{request_id, job_.global_step(), {}};
    for (unsigned i = 0; i < status.size(); ++i) r.statuses.push_back(static_cast<uint8_t>(status[i]));
    requests_.record(caller.worker_index, std::move(r));
  };
  if (sync && step < job_.global_step()) {
    for (unsigned i = 0; i < work.size(); ++i) status.set(i, wire::PushStatus::STALE);
    counters_.stale += work.size();
    if (worker) worker->stale += work.size();
    report_done();
    remember();
    return kj::READY_NOW;
  }

  kj::Vector<kj::Promise<void>> pending;
  for (unsigned i = 0; i < work.size(); ++i) {
    // Not a structured binding: clang before 16 cannot capture those.
    StoredTensor* t = work[i].first;
    std::span<const float> g = work[i].second;
    if (sync && t->spec().trainable) {
      wire::PushStatus s = offer_sync(t, caller.worker_index, g, pending);
      if (s == wire::PushStatus::STALE && worker) ++worker->stale;
      status.set(i, s);
    } else {
      status.set(i, wire::PushStatus::APPLIED);
      pending.add(run_on(t, [this, t, g] { timed_apply(t, g, 1.0f); }));
    }
  }
  remember();
  if (sync && complete_tensors_ > 0 && complete_tensors_ >= trainable_count()) commit_sync_step();
  report_done();
  return kj::joinPromises(pending.releaseAsArray()).attach(kj::mv(copied));
}

const std::byte* Shard::shared_slice(const Caller& caller, wire::SharedSlice::Reader slice, const char* what) const {
  if (!caller.shared) {
    throw RequestError(std::string(what) + ": this connection has no shared memory region (attachMemory first)");
  }
  if (slice.getRegion() != caller.shared_id) {
    throw RequestError(std::string(what) + ": no shared memory region " + std::to_string(slice.getRegion()) +
                       " on this connection");
  }
  if (!caller.shared->contains(slice.getOffset(), slice.getBytes())) {
    throw RequestError(std::string(what) + ": shared slice of " + std::to_string(slice.getBytes()) + " bytes at " +
                       std::to_string(slice.getOffset()) + " lies outside the region of " +
                       std::to_string(caller.shared->size()) + " bytes");
  }
  return caller.shared->data() + slice.getOffset();
}

wire::PushStatus Shard::offer_sync(StoredTensor* t, int worker, std::span<const float> g,
                                   kj::Vector<kj::Promise<void>>& pending) {
  SyncSlot& slot = sync_[t];
  if (slot.complete) {
    ++counters_.stale;  // a backup worker's gradient, after enough arrived
    return wire::PushStatus::STALE;
  }
  if (std::find(slot.contributors.begin(), slot.contributors.end(), worker) != slot.contributors.end()) {
    return wire::PushStatus::DUPLICATE;
  }
  slot.contributors.push_back(worker);
  if (slot.sum.size() != t->size()) slot.sum.resize(t->size());  // once per tensor; reused every step
  const bool first = slot.count++ == 0;
  float* sum = slot.sum.data();
  pending.add(run_on(t, [sum, g, first] {
    if (first) {
      std::memcpy(sum, g.data(), g.size_bytes());
    } else {
      const std::size_t n = g.size();
      const float* __restrict gp = g.data();
      float* __restrict sp = sum;
      for (std::size_t i = 0; i < n; ++i) sp[i] += gp[i];
    }
  }));
  if (slot.count >= replicas_needed(slot)) {
    slot.complete = true;
    ++complete_tensors_;
  }
  return wire::PushStatus::ACCUMULATED;
}

void Shard::commit_sync_step() {
  for (auto& [t, slot] : sync_) {
    if (!slot.complete) continue;
    StoredTensor* tensor = t;
    // The average of what arrived: replicas_to_aggregate gradients, or
    // fewer when workers have left (shard_recovery.cc).
    const float scale = 1.0f / static_cast<float>(slot.count);
    std::span<const float> sum(slot.sum);
    // Queued on the tensor's strand behind this step's sums and ahead of the
    // next step's, and ahead of every read that starts after this point.
    tasks_.add(run_on(tensor, [this, tensor, sum, scale] { timed_apply(tensor, sum, scale); }));
    slot.count = 0;
    slot.contributors.clear();
    slot.complete = false;
  }
  complete_tensors_ = 0;
  ++counters_.steps_applied;
  job_.advance_step();
  spdlog::debug("sync step {} committed", job_.global_step());
  step_reached();
}

uint64_t Shard::trainable_count() const {
  uint64_t n = 0;
  for (StoredTensor* t : store_.all()) n += t->spec().trainable;
  return n;
}

std::pair<int64_t, bool> Shard::step_done(const Caller& caller, int64_t step) {
  if (caller.worker_index < 0) throw RequestError("stepDone: only workers report steps (say hello with a worker index)");
  checked_step(step, "stepDone");
  job_.check_worker(caller.worker_index);
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

std::pair<int64_t, bool> Shard::step_done_request(const Caller& caller, int64_t step, uint64_t request_id) {
  if (request_id != 0 && caller.worker_index >= 0 && requests_.find(caller.worker_index, request_id) != nullptr) {
    ++counters_.duplicate_requests;
    return {job_.global_step(), job_.stop_reached()};
  }
  auto answer = step_done(caller, step);
  if (request_id != 0) requests_.record(caller.worker_index, RecentRequest{request_id, answer.first, {}});
  return answer;
}

void Shard::report(const Caller& caller, wire::Shard::ReportParams::Reader params) {
  if (caller.worker_index < 0) throw RequestError("report: only workers report progress (say hello with a worker index)");
  job_.check_worker(caller.worker_index);
  WorkerReport r;
  r.step = params.getStep();
  r.loss = params.getLoss();  // NaN kept: a diverging loss is worth seeing
  r.accuracy = params.getAccuracy();
  r.samples_per_sec = params.getSamplesPerSec();
  r.learning_rate = params.getLearningRate();
  r.unix_secs = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  job_.worker(caller.worker_index).report = r;
}

void Shard::note_checkpoint(int64_t step, double unix_secs) {
  counters_.last_checkpoint_step = step;
  counters_.last_checkpoint_unix_secs = unix_secs;
}

void Shard::list(wire::Shard::ListResults::Builder results) const {
  auto all = store_.all();
  auto out = results.initTensors(static_cast<unsigned>(all.size()));
  for (unsigned i = 0; i < all.size(); ++i) to_wire_meta(*all[i], false, out[i]);
}

void Shard::stats(wire::ShardStats::Builder out) const {
  out.setTensors(store_.count());
  out.setBytes(store_.bytes());
  out.setPushes(counters_.pushes);
  out.setPulls(counters_.pulls);
  out.setRejected(counters_.rejected);
  out.setStaleGradients(counters_.stale);
  out.setGlobalStep(job_.global_step());
  out.setConnections(counters_.connections);
  job_to_wire(job_.config(), out.initJob());
  out.setReady(job_.ready());
  out.setStalenessWaits(job_.staleness_waits());
  out.setMaxStaleness(job_.max_staleness_seen());
  out.setStepsApplied(counters_.steps_applied);
  out.setFinished(job_.finished());
  out.setBytesIn(counters_.bytes_in);
  out.setBytesOut(counters_.bytes_out);
  out.setSharedBytes(counters_.shared_bytes);
  out.setLastCheckpointStep(counters_.last_checkpoint_step);
  out.setLastCheckpointUnixSecs(counters_.last_checkpoint_unix_secs);
  auto waits = out.initWaits(static_cast<unsigned>(current_waits_.size()));
  for (unsigned w = 0; w < current_waits_.size(); ++w) waits.set(w, current_waits_[w]);
  auto workers = out.initWorkers(static_cast<unsigned>(job_.workers().size()));
  unsigned i = 0;
  for (const auto& [index, w] : job_.workers()) {
    workers[i].setWorkerIndex(index);
    workers[i].setStep(w.step);
    workers[i].setConnected(w.connections > 0);
    workers[i].setPushes(w.pushes);
    workers[i].setStale(w.stale);
    workers[i].setPeer(w.peer);
    if (w.report) {
      workers[i].setLoss(w.report->loss);
      workers[i].setSamplesPerSec(w.report->samples_per_sec);
    }
    ++i;
  }
}

void Shard::info(wire::ShardInfo::Builder out) const {
  out.setProtocolVersion(wire::K_PROTOCOL_VERSION);
  out.setShardIndex(options_.shard_index);
  out.setNumShards(options_.num_shards);
  out.setServerVersion("psd " PS_VERSION);
  out.setGlobalStep(job_.global_step());
  out.setMaxMessageBytes(options_.max_message_bytes);
  out.setUnixSocket(options_.unix_socket);
  out.setHostId(host_id());
  out.setInstanceId(instance_id_);
  out.setTensors(store_.count());
  out.setSharedMemory(!options_.unix_socket.empty() && options_.max_shared_memory_bytes > 0);
  out.setAllowsNonfinite(options_.allow_nonfinite);
  job_to_wire(job_.config(), out.initJob());
}

}  // namespace ps
