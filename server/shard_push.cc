// Shard::push: check (the whole request, before anything changes), record
// the arrival, route (async: apply now; sync: sum into the step, commit it
// once every trainable tensor has its gradients), record the answer.
#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include <spdlog/spdlog.h>

#include <kj/common.h>
#include <kj/debug.h>

#include "common/finite.h"
#include "ps/errors.h"
#include "server/shard.h"

namespace ps {

kj::Promise<void> Shard::push(const Caller& caller, const PushRequest& request, PushReply& reply) {
  check_push_caller(caller, request);
  saw_worker(caller.worker_index);
  if (answer_retry(caller, request, reply)) return kj::READY_NOW;
  PushWork work = check_push(caller, request);
  if (job_.config().mode == SyncMode::kSync && !work.stale) reserve_sync_sums(work);
  if (needs_whole_check(work)) return push_checked_whole(caller, request, reply, std::move(work));
  return commit_push(caller, request, reply, std::move(work));
}

kj::Promise<void> Shard::commit_push(const Caller& caller, const PushRequest& request,
                                     PushReply& reply, PushWork work) {
  record_push_arrival(caller, request.step, work);
  reply.step = job_.global_step();
  kj::Vector<kj::Promise<void>> pending;
  route_push(caller, request.step, work, reply, pending);
  record_push_answer(caller, request, reply);
  return kj::joinPromises(pending.releaseAsArray()).attach(kj::mv(work.copied));
}

bool Shard::applied_on_arrival(const PushGrad& g) const {
  return job_.config().mode != SyncMode::kSync || !g.tensor->spec().trainable;
}

void Shard::reserve_sync_sums(const PushWork& work) {
  for (const PushGrad& g : work.grads) {
    if (applied_on_arrival(g)) continue;
    SyncSlot& slot = sync_[g.tensor];
    if (slot.sum.size() == g.tensor->size()) continue;
    const uint64_t bytes = g.tensor->size() * sizeof(float);
    check_memory(bytes, "push: the sum of tensor '" + g.tensor->spec().name +
                            "''s sync gradients (" + std::to_string(bytes) + " bytes)");
    if (budget_ != nullptr) slot.sum_bytes = budget_->reserve_anyway(MemoryUse::kTensors, bytes);
    slot.sum.resize(g.tensor->size());
  }
}

bool Shard::needs_whole_check(const PushWork& work) const {
  if (options_.allow_nonfinite || work.stale) return false;
  // Any pool tensor updated on arrival, even a push's only one, whose update
  // may fail: a refusal found as it is applied would come after the push's
  // request id, its sync gradients and its step report count.
  for (const PushGrad& g : work.grads) {
    if (applied_on_arrival(g) && !runs_inline(g.tensor) &&
        !g.tensor->within_safe_bound(g.grad_max, 1.0f))
      return true;
  }
  return false;
}

kj::Promise<void> Shard::push_checked_whole(const Caller& caller, const PushRequest& request,
                                            PushReply& reply, PushWork work) {
  struct State {
    Caller caller;
    PushRequest request;  // its views point into the call's message, alive until it settles
    PushWork work;
    std::vector<uint8_t> finite;
    std::vector<uint64_t> versions;
    kj::Own<kj::PromiseFulfiller<void>> gate;
    uint64_t gate_id = 0;
  };
  auto state = std::make_shared<State>(State{caller, request, std::move(work), {}, {}, {}, 0});
  const std::size_t n = state->work.grads.size();
  state->finite.assign(n, 1);
  state->versions.assign(n, 0);

  // Wait for earlier pushes of these tensors still being checked; then hold
  // them until this push's updates are queued behind theirs.
  kj::Vector<kj::Promise<void>> before;
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto open = std::make_shared<kj::ForkedPromise<void>>(paf.promise.fork());
  state->gate = kj::mv(paf.fulfiller);
  state->gate_id = ++next_gate_id_;
  for (const PushGrad& g : state->work.grads) {
    StoredTensor* t = g.tensor;
    if (runs_inline(t) || !applied_on_arrival(g)) continue;
    auto it = push_gates_.find(t);
    if (it != push_gates_.end()) {
      // Broken if that push was dropped: this one goes ahead all the same.
      before.add(it->second.open->addBranch().catch_([](kj::Exception&&) {}));
    }
    push_gates_[t] = PushGate{state->gate_id, open};
  }

  return kj::joinPromises(before.releaseAsArray())
      .then([this, state] {
        // Each pool tensor's update checked on its strand, behind every update queued before.
        kj::Vector<kj::Promise<void>> checks;
        for (std::size_t i = 0; i < state->work.grads.size(); ++i) {
          const PushGrad& g = state->work.grads[i];
          if (runs_inline(g.tensor) || !applied_on_arrival(g)) continue;
          checks.add(pool_.run(g.tensor->id(), [g, state, i] {
            state->finite[i] =
                g.tensor->update_finite(g.values, 1.0f, g.grad_max, &state->versions[i]);
          }));
        }
        return kj::joinPromises(checks.releaseAsArray());
      })
      .then([this, state, &reply]() -> kj::Promise<void> {
        // On the event loop, in one go: the verdict, then every update queued.
        KJ_DEFER({
          for (const PushGrad& g : state->work.grads) {
            auto it = push_gates_.find(g.tensor);
            if (it != push_gates_.end() && it->second.id == state->gate_id) push_gates_.erase(it);
          }
          state->gate->fulfill();
        });
        std::vector<std::optional<uint64_t>> checked(state->work.grads.size());
        for (std::size_t i = 0; i < state->work.grads.size(); ++i) {
          StoredTensor* t = state->work.grads[i].tensor;
          if (runs_inline(t) || !applied_on_arrival(state->work.grads[i])) continue;
          if (!state->finite[i]) {
            throw RequestError("push: " + nonfinite_update_refusal(t->spec()));
          }
          checked[i] = state->versions[i];
        }
        // A retry of this push may have been applied while it was checked.
        if (answer_retry(state->caller, state->request, reply)) return kj::READY_NOW;
        refuse_nonfinite_updates(state->work.grads);  // the small tensors, as they are now
        state->work.checked_versions = std::move(checked);
        return commit_push(state->caller, state->request, reply, std::move(state->work));
      });
}

void Shard::check_push_caller(const Caller& caller, const PushRequest& request) {
  checked_step(request.step, "push");
  if (request.done_step >= 0) checked_step(request.done_step, "push (doneStep)");
  job_.check_worker(caller.worker_index);
  if (request.done_step >= 0 && caller.worker_index < 0) {
    throw RequestError("push: only workers report steps (say hello with a worker index)");
  }
}

bool Shard::answer_retry(const Caller& caller, const PushRequest& request, PushReply& reply) {
  if (request.request_id == 0) return false;
  const RecentRequest* seen = requests_.find(requester(caller), request.request_id);
  if (seen == nullptr) return false;
  ++counters_.duplicate_requests;
  reply.step = seen->step;
  reply.status.clear();
  for (uint8_t s : seen->statuses) reply.status.push_back(static_cast<GradientStatus>(s));
  if (request.done_step >= 0) {
    // Its step report counted the first time; the answer is the job's now
    // (as stepDone's would be), stop included.
    reply.step = job_.global_step();
    reply.stop = job_.stop_reached();
  }
  return true;
}

Shard::PushWork Shard::check_push(const Caller& caller, const PushRequest& request) const {
  if (job_.configured() && !job_.ready()) {
    throw RequestError("push: the chief has not finished initialising the model (waitReady first)");
  }
  PushWork work;
  work.grads.reserve(request.grads.size());
  // Gradients that came in shared memory, copied out before they are
  // checked: the client can still write there, and what is applied must be
  // what was checked.
  work.copied = std::make_shared<std::vector<std::unique_ptr<float[]>>>();
  std::set<StoredTensor*> seen;
  const uint32_t summed = gradients_summed_per_step(job_.config());
  const float limit = gradient_limit(summed);
  for (const PushGradient& g : request.grads) {
    StoredTensor& t = store_.get(std::string(g.name));
    const uint64_t got = g.shared ? g.shared->bytes : g.bytes;
    if (got != t.size() * sizeof(float)) {
      throw RequestError("push: tensor '" + t.spec().name + "' of shape " +
                         shape_to_string(t.spec().shape) + " expects " + std::to_string(t.size()) +
                         " floats (" + std::to_string(t.size() * 4) + " bytes), got " +
                         std::to_string(got) + " bytes");
    }
    if (!seen.insert(&t).second)
      throw RequestError("push: tensor '" + t.spec().name + "' appears twice in one request");
    // The pass that refuses NaN/Inf also tells whether every value is
    // within half the safe bound (PushGrad::grad_max): the smaller limit
    // first, the larger only where that fails.
    const float half_bound = t.safe_gradient_bound(1.0f) / 2;
    const float first = half_bound > 0 ? std::min(limit, half_bound) : limit;
    std::span<const float> values;
    bool finite;
    if (g.shared) {
      if (g.bytes != 0)
        throw RequestError("push: gradient for '" + t.spec().name +
                           "' has both values and a shared slice");
      const auto* src = reinterpret_cast<const float*>(shared_slice(caller, *g.shared, "push"));
      work.copied->push_back(std::unique_ptr<float[]>(new float[t.size()]));
      finite = copy_all_finite(work.copied->back().get(), src, t.size(), first);
      values = std::span<const float>(work.copied->back().get(), t.size());
      work.shared_bytes += got;
    } else {
      values = g.values;
      finite = options_.allow_nonfinite || all_finite(values, first);
    }
    float grad_max = std::numeric_limits<float>::infinity();  // nothing known
    if (!options_.allow_nonfinite) {
      grad_max = finite ? first : limit;
      if (!finite && first < limit) finite = all_finite(values, limit);
      if (!finite) throw RequestError(gradient_refusal(t.spec().name, values, summed));
    }
    work.grads.push_back({&t, values, grad_max});
    work.bytes += got;
  }
  work.stale = job_.config().mode == SyncMode::kSync && request.step < job_.global_step();
  if (!work.stale) refuse_nonfinite_updates(work.grads);
  if (job_.config().mode == SyncMode::kSync) {
    if (caller.worker_index < 0)
      throw RequestError("push: sync mode needs a worker index (say hello as a worker)");
    if (request.step > job_.global_step()) {
      throw RequestError("push: gradient for step " + std::to_string(request.step) +
                         ", but the job is at step " + std::to_string(job_.global_step()) +
                         " (a push carries the step its parameters were pulled at)");
    }
  }
  return work;
}

void Shard::record_push_arrival(const Caller& caller, int64_t step, const PushWork& work) {
  const SyncMode mode = job_.config().mode;
  if (caller.worker_index >= 0) {
    WorkerRecord& worker = job_.worker(caller.worker_index);
    worker.pushes += work.grads.size();
    if (mode != SyncMode::kSync && step > worker.step) {
      worker.step = step;
      job_.worker_progressed();  // the slowest worker moving on releases bounded-staleness pulls
    }
    if (mode == SyncMode::kBoundedStaleness) job_.record_staleness(step - job_.slowest_live_step());
    // Sync: how many steps old the gradient is (stale ones included).
    // Otherwise there is no common step to be behind: how far this worker
    // runs ahead of the slowest connected one.
    const int64_t staleness =
        mode == SyncMode::kSync ? job_.global_step() - step : step - job_.slowest_live_step();
    push_staleness_.observe(static_cast<double>(std::max<int64_t>(0, staleness)));
  }
  counters_.pushes += work.grads.size();
  counters_.bytes_in += work.bytes;
  counters_.shared_bytes += work.shared_bytes;
}

void Shard::route_push(const Caller& caller, int64_t step, const PushWork& work, PushReply& reply,
                       kj::Vector<kj::Promise<void>>& pending) {
  const bool sync = job_.config().mode == SyncMode::kSync;
  WorkerRecord* worker = caller.worker_index >= 0 ? &job_.worker(caller.worker_index) : nullptr;
  reply.status.assign(work.grads.size(), GradientStatus::kApplied);
  if (sync && step < job_.global_step()) {
    // For a step already done: dropped whole.
    std::fill(reply.status.begin(), reply.status.end(), GradientStatus::kStale);
    counters_.stale += work.grads.size();
    if (worker) worker->stale += work.grads.size();
    return;
  }
  for (std::size_t i = 0; i < work.grads.size(); ++i) {
    // Not a structured binding: clang before 16 cannot capture those.
    const PushGrad& g = work.grads[i];
    StoredTensor* t = g.tensor;
    if (sync && t->spec().trainable) {
      const GradientStatus s = offer_sync(g, caller.worker_index, pending);
      if (s == GradientStatus::kStale && worker) ++worker->stale;
      reply.status[i] = s;
    } else {
      const KnownUpdate known{
          g.grad_max, work.checked_versions.empty() ? std::nullopt : work.checked_versions[i]};
      std::span<const float> values = g.values;
      pending.add(run_on(t, [this, t, values, known] { timed_apply(t, values, 1.0f, known); }));
    }
  }
}

void Shard::record_push_answer(const Caller& caller, const PushRequest& request, PushReply& reply) {
  // Logged before a commit moves the step: a retry is answered as the first time.
  if (request.request_id != 0) {
    RecentRequest r{request.request_id, job_.global_step(), {}};
    r.statuses.reserve(reply.status.size());
    for (GradientStatus s : reply.status) r.statuses.push_back(static_cast<uint8_t>(s));
    requests_.record(requester(caller), std::move(r));
  }
  if (job_.config().mode == SyncMode::kSync && complete_tensors_ > 0 &&
      complete_tensors_ >= trainable_count()) {
    commit_sync_step();
  }
  if (request.done_step >= 0) {
    auto [global, stop] = step_done(caller, request.done_step);
    reply.step = global;
    reply.stop = stop;
  }
}

GradientStatus Shard::offer_sync(const PushGrad& grad, int worker,
                                 kj::Vector<kj::Promise<void>>& pending) {
  StoredTensor* t = grad.tensor;
  std::span<const float> g = grad.values;
  SyncSlot& slot = sync_[t];
  if (slot.complete) {
    ++counters_.stale;  // a backup worker's gradient, after enough arrived
    return GradientStatus::kStale;
  }
  if (std::find(slot.contributors.begin(), slot.contributors.end(), worker) !=
      slot.contributors.end()) {
    return GradientStatus::kDuplicate;
  }
  slot.contributors.push_back(worker);
  KJ_REQUIRE(slot.sum.size() == t->size(), "reserve_sync_sums allocates the sum first");
  const bool first = slot.count++ == 0;
  slot.grad_max_sum = (first ? 0.0 : slot.grad_max_sum) + double(grad.grad_max);
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
  return GradientStatus::kAccumulated;
}

void Shard::commit_sync_step() {
  for (auto& [t, slot] : sync_) {
    if (!slot.complete) continue;
    StoredTensor* tensor = t;
    // The average of what arrived: replicas_to_aggregate gradients, or
    // fewer when workers have left (shard_recovery.cc).
    const float scale = 1.0f / static_cast<float>(slot.count);
    std::span<const float> sum(slot.sum);
    // |sum| is within the contributions' bounds added up, grown by each
    // float addition's rounding (and this conversion's).
    const double sum_max = slot.grad_max_sum * (1 + double(slot.count) * 0x1p-23);
    KnownUpdate known;
    if (sum_max <= std::numeric_limits<float>::max()) known.grad_max = static_cast<float>(sum_max);
    // Queued on the tensor's strand behind this step's sums and ahead of the
    // next step's, and ahead of every read that starts after this point.
    tasks_.add(run_on(
        tensor, [this, tensor, sum, scale, known] { timed_apply(tensor, sum, scale, known); }));
    slot.count = 0;
    slot.contributors.clear();
    slot.complete = false;
  }
  commit_table_step();
  complete_tensors_ = 0;
  ++counters_.steps_applied;
  job_.advance_step();
  spdlog::debug("sync step {} committed", job_.global_step());
  step_reached();
}

}  // namespace ps
