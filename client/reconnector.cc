#include "client/reconnector.h"

#include <spdlog/spdlog.h>

#include "common/for_people.h"

namespace ps {

Reconnector::Reconnector(kj::UnixEventPort& io, std::vector<kj::Own<ShardConnection>>& shards,
                         HelloParams hello, std::chrono::milliseconds timeout)
    : io_(io),
      shards_(shards),
      hello_(std::move(hello)),
      timeout_(timeout),
      pending_(shards.size()),
      turns_(shards.size()) {}

Reconnector::~Reconnector() = default;

kj::Promise<kj::Own<Reconnector::Turn>> Reconnector::turn(int index) {
  Turns& t = turns_[index];
  if (t.taken < kMaxIdentifiedInFlight) {
    ++t.taken;
    return kj::heap<Turn>(*this, index);
  }
  auto paf = kj::newPromiseAndFulfiller<kj::Own<Turn>>();
  t.waiting.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void Reconnector::hand_on_turn(int index) {
  Turns& t = turns_[index];
  while (!t.waiting.empty()) {
    auto next = kj::mv(t.waiting.front());
    t.waiting.pop_front();
    if (next->isWaiting()) {  // not cancelled while it waited: the turn is its
      next->fulfill(kj::heap<Turn>(*this, index));
      return;
    }
  }
  --t.taken;
}

kj::Promise<void> Reconnector::reconnect(int index, uint64_t generation,
                                         const kj::Exception& cause) {
  if (shards_[index]->generation != generation)
    return kj::READY_NOW;  // another call already reconnected
  Pending& pending = pending_[index];
  if (pending.generation == generation && !pending.done) {
    KJ_IF_MAYBE (fork, pending.fork) {
      return fork->addBranch();
    }
  }
  const std::string address = shards_[index]->address;
  std::string why = for_people(cause.getDescription().cStr());
  while (!why.empty() && (why.back() == '.' || why.back() == ' ')) why.pop_back();
  spdlog::warn("lost shard {} ({}): {}; reconnecting for up to {:g} s (reconnect_timeout)", index,
               address, why, timeout_.count() / 1000.0);
  pending.generation = generation;
  pending.done = false;
  auto attempt =
      connect_shard(io_, index, address, timeout_, hello_, "ClientOptions::reconnect_timeout")
          .then(
              [this, index](kj::Own<ShardConnection> fresh) {
                kj::Own<ShardConnection>& slot = shards_[index];
                // A psd restarted with other flags: its tensors are not this
                // shard's. Every call that needs it fails with why.
                const std::string problem =
                    shard_order_problem(*fresh, static_cast<std::size_t>(index), shards_.size());
                if (!problem.empty()) {
                  pending_[index].done = true;
                  kj::throwFatalException(kj::Exception(kj::Exception::Type::FAILED, __FILE__,
                                                        __LINE__, kj::str(problem)));
                }
                fresh->generation = slot->generation + 1;
                // A new process holds only what its checkpoint had, even at
                // the step last seen: a gradient this client sent after
                // that checkpoint is gone, and a step waiting for it never
                // comes. An older psd (id 0) says so only by its step.
                const bool new_process = fresh->instance_id != 0 && slot->instance_id != 0 &&
                                         fresh->instance_id != slot->instance_id;
                const bool back = fresh->hello_step < slot->last_step;
                // One that holds nothing where the model was had no checkpoint to
                // restore: whatever this client does next fails on unknown
                // tensors. The job stops, saying why (docs/first-hour.md).
                const bool had_model = slot->holds_model || slot->last_step > 0;
                if ((new_process || back) && fresh->empty_at_hello && had_model) {
                  pending_[index].done = true;
                  kj::throwFatalException(
                      kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                                    kj::str("shard ", index, " (", fresh->address,
                                            ") came back empty: psd restarted without a "
                                            "checkpoint, and the model is lost; start psd with "
                                            "--checkpoint_dir to survive restarts")));
                }
                fresh->holds_model = fresh->holds_model || slot->holds_model;
                fresh->rolled_back = new_process || back;
                fresh->catching_up = fresh->rolled_back || slot->catching_up;
                if (fresh->rolled_back) ++rollbacks_;
                if (back) {
                  spdlog::warn(
                      "shard {} is back at global step {} (this client had seen step {}): it "
                      "restarted "
                      "from a checkpoint",
                      index, fresh->hello_step, slot->last_step);
                } else if (new_process) {
                  spdlog::warn(
                      "shard {} restarted (a new psd, at global step {}): what this client sent it "
                      "after "
                      "its last checkpoint may be lost; going on from that step",
                      index, fresh->hello_step);
                } else {
                  spdlog::info("reconnected to shard {} ({}) at global step {}", index,
                               fresh->address, fresh->hello_step);
                }
                // The broken connection may still be unwinding calls; drop it later.
                if (retired_.size() >= 8) retired_.erase(retired_.begin());
                retired_.push_back(kj::mv(slot));
                slot = kj::mv(fresh);
                pending_[index].done = true;
              },
              [this, index, address](kj::Exception&& e) {
                pending_[index].done = true;
                kj::throwFatalException(
                    disconnected("lost shard " + std::to_string(index) + " (" + address +
                                 ") and could not reconnect: " + e.getDescription().cStr()));
              })
          .fork();
  auto branch = attempt.addBranch();
  pending.fork = kj::mv(attempt);
  return branch;
}

}  // namespace ps
