// Shard::pull: check (every name and slice, the reply's size), route (async
// reads now; sync waits for the step, bounded staleness for the slowest
// worker), read the tensors into the face's reply and record the counters.
#include <algorithm>
#include <cstring>

#include "ps/errors.h"
#include "server/shard.h"

namespace ps {

kj::Promise<void> Shard::pull(const Caller& caller, const PullRequest& request, PullReply& reply) {
  saw_worker(caller.worker_index);
  PullPlan plan = check_pull(caller, request);
  {
    std::vector<PullReply::Tensor> layout(plan.tensors.size());
    for (std::size_t i = 0; i < layout.size(); ++i) {
      layout[i] = {plan.tensors[i]->spec().name, plan.tensors[i]->size() * sizeof(float),
                   plan.into[i] >= 0};
    }
    reply.start(layout);
  }
  // Async pulls read at once: each promise stage the reply waits for costs
  // an allocation and a loop turn on psd's one network thread.
  const SyncMode mode = job_.config().mode;
  if (mode == SyncMode::kAsync)
    return read_tensors(std::move(plan.tensors), plan.into, caller.shared, reply);
  kj::Promise<void> wait = mode == SyncMode::kSync
                               ? job_.wait_for_step(plan.min_step, caller.worker_index)
                               : job_.wait_for_staleness(plan.min_step, caller.worker_index);
  return wait.then([this, plan = std::move(plan), shared = caller.shared, &reply]() mutable {
    return read_tensors(std::move(plan.tensors), plan.into, std::move(shared), reply);
  });
}

Shard::PullPlan Shard::check_pull(const Caller& caller, const PullRequest& request) const {
  const auto& names = request.names;
  PullPlan plan;
  plan.tensors.reserve(names.size());
  for (std::string_view n : names) plan.tensors.push_back(&store_.get(std::string(n)));
  // Where each tensor goes: -1 in the reply, else an offset in the
  // connection's shared memory region. All checked before anything is read.
  plan.into.assign(plan.tensors.size(), -1);
  const auto& slices = request.into;
  if (slices.size() != 0 && slices.size() != names.size()) {
    throw RequestError("pull: " + std::to_string(slices.size()) + " shared slices for " +
                       std::to_string(names.size()) + " tensors");
  }
  for (std::size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].bytes == 0) continue;
    const uint64_t want = plan.tensors[i]->size() * sizeof(float);
    if (slices[i].bytes != want) {
      throw RequestError("pull: shared slice for '" + plan.tensors[i]->spec().name + "' holds " +
                         std::to_string(slices[i].bytes) + " bytes, the tensor " +
                         std::to_string(want));
    }
    shared_slice(caller, slices[i], "pull");
    plan.into[i] = static_cast<int64_t>(slices[i].offset);
  }
  // A reply over the message limit would be built in full and then not
  // sent (a small request naming one tensor many times asks for gigabytes):
  // refused before anything is read.
  uint64_t bytes = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    bytes += 64 + names[i].size();
    if (plan.into[i] < 0) bytes += plan.tensors[i]->size() * sizeof(float);
  }
  if (bytes > options_.max_message_bytes) {
    throw RequestError("pull: the reply would hold " + std::to_string(bytes) +
                       " bytes, over this psd's message " + "limit of " +
                       std::to_string(options_.max_message_bytes) +
                       " (--max_message_mb); pull fewer tensors at once");
  }
  // Any negative minStep asks for no step: the same as 0.
  plan.min_step = checked_step(std::max<int64_t>(request.min_step, 0), "pull");
  return plan;
}

kj::Promise<void> Shard::read_tensors(std::vector<StoredTensor*> tensors,
                                      const std::vector<int64_t>& into,
                                      std::shared_ptr<SharedRegion> shared, PullReply& reply) {
  reply.step(job_.global_step());
  kj::Vector<kj::Promise<void>> copies;
  uint64_t bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    StoredTensor* t = tensors[i];
    const uint64_t size = t->size() * sizeof(float);
    bytes += size;
    // Into the client's shared memory (nothing in the reply), or in the reply.
    std::byte* dest = into[i] >= 0 ? shared->data() + into[i] : nullptr;
    if (dest) counters_.shared_bytes += size;
    auto fill = [&reply, i, dest, shared](StoredTensor::View& view) {
      if (dest) {
        std::memcpy(dest, view.values->data(), view.values->size() * sizeof(float));
        reply.in_shared(i, view.version);
      } else {
        reply.value(i, view.version, std::move(view.values));
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
    copies.add(pool_.run(t->id(), [t, view] { *view = t->view(); }).then([fill, view]() mutable {
      fill(*view);
    }));
  }
  // Record.
  counters_.pulls += tensors.size();
  counters_.bytes_out += bytes;
  if (copies.empty()) {
    reply.done();
    return kj::READY_NOW;
  }
  return kj::joinPromises(copies.releaseAsArray()).then([&reply] { reply.done(); });
}

}  // namespace ps
