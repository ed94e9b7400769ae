// Shard: snapshots for checkpoints, and restoring one at start-up.
//
// A snapshot copies each tensor under its lock. Large tensors are copied on
// their compute strand, behind every update queued before the snapshot and
// ahead of every update queued after it; small ones are copied on the event
// loop, where their updates run. Either way the copy holds exactly the
// updates committed when snapshot() was called, without stopping the world:
// updates to one tensor wait only while that tensor is copied.
//
// A checkpoint "at step S" (the checkpoint RPC in sync mode) is taken from
// inside the commit that reaches S (step_reached), before the event loop can
// run anything that commits S + 1, so every shard saves the same step.
#include <algorithm>
#include <chrono>
#include <set>
#include <string_view>

#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "server/shard.h"
#include "server/shard_tables.h"

namespace ps {

kj::Promise<std::shared_ptr<ShardCheckpoint>> Shard::snapshot() {
  auto c = std::make_shared<ShardCheckpoint>();
  c->shard_index = options_.shard_index;
  c->num_shards = options_.num_shards;
  c->global_step = job_.global_step();
  c->job_configured = job_.configured();
  c->job = job_.config();
  c->ready = job_.ready();
  c->unix_secs =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  requests_.save(c->requests, c->client_requests);
  // A sync push counted towards the step in progress is not in the saved
  // values (the step's sums are not saved): forget its id too, so a worker
  // retrying it after a restart has it counted again instead of answered.
  for (auto& [worker, list] : c->requests) {
    std::erase_if(list, [&](const RecentRequest& r) {
      return r.step >= c->global_step &&
             std::find(r.statuses.begin(), r.statuses.end(),
                       static_cast<uint8_t>(GradientStatus::kAccumulated)) != r.statuses.end();
    });
  }
  auto tensors = store_.all();
  c->tensors.resize(tensors.size());
  kj::Vector<kj::Promise<void>> copies;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    StoredTensor* t = tensors[i];
    TensorCheckpoint* out = &c->tensors[i];
    out->spec = t->spec();
    out->part = t->part();
    // `c` is shared with the copy: it outlives the promise if that is dropped.
    copies.add(run_on(t, [t, out, c] {
      auto s = t->snapshot();
      out->values = std::move(s.values);
      out->slots = std::move(s.slots);
      out->version = s.version;
    }));
  }
  snapshot_tables(*c);  // on the event loop, where tables change: as of now
  return kj::joinPromises(copies.releaseAsArray()).then([c] { return c; });
}

kj::Promise<std::shared_ptr<ShardCheckpoint>> Shard::snapshot_at_step(
    int64_t step, std::function<std::string()> admit) {
  const int64_t now = job_.global_step();
  if (step < 0 || step == now) return snapshot();
  if (step < now) {
    if (job_.config().mode == SyncMode::kSync) {
      throw RequestError("checkpoint: step " + std::to_string(step) +
                         " has passed (the job is at step " + std::to_string(now) + ")");
    }
    return snapshot();
  }
  // Callers that went away (the call is cancelled) leave their waits here:
  // dropped with each new one, so a client asking for far steps and giving
  // up cannot grow the list.
  for (auto it = step_snapshots_.begin(); it != step_snapshots_.end();) {
    it = it->second.fulfiller->isWaiting() ? std::next(it) : step_snapshots_.erase(it);
  }
  auto paf = kj::newPromiseAndFulfiller<std::shared_ptr<ShardCheckpoint>>();
  step_snapshots_.emplace(step, StepSnapshot{kj::mv(paf.fulfiller), std::move(admit)});
  return kj::mv(paf.promise);
}

void Shard::step_reached() {
  tables_reached_step();
  const int64_t now = job_.global_step();
  while (!step_snapshots_.empty() && step_snapshots_.begin()->first <= now) {
    auto fulfiller = kj::mv(step_snapshots_.begin()->second.fulfiller);
    auto admit = std::move(step_snapshots_.begin()->second.admit);
    step_snapshots_.erase(step_snapshots_.begin());
    if (!fulfiller->isWaiting()) continue;  // its caller went away
    if (admit) {
      const std::string refusal = admit();
      if (!refusal.empty()) {
        fulfiller->reject(kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                                        kj::str(refusal.c_str())));
        continue;
      }
    }
    // snapshot() queues its copies now, inside this commit; only waiting for
    // them to finish happens later.
    tasks_.add(snapshot()
                   .then([f = fulfiller.get()](
                             std::shared_ptr<ShardCheckpoint> c) { f->fulfill(kj::mv(c)); },
                         [f = fulfiller.get()](kj::Exception&& e) { f->reject(kj::mv(e)); })
                   .attach(kj::mv(fulfiller)));
  }
}

std::vector<SkippedTensor> Shard::restore(const ShardCheckpoint& c) {
  if (store_.count() != 0) throw Error("restore: the shard already holds tensors");
  if (c.shard_index != options_.shard_index || c.num_shards != options_.num_shards) {
    throw Error("restore: the checkpoint is of shard " + std::to_string(c.shard_index) + " of " +
                std::to_string(c.num_shards) + ", this is shard " +
                std::to_string(options_.shard_index) + " of " +
                std::to_string(options_.num_shards));
  }
  // A file is content a client could have sent: it passes the checks the
  // live requests do (initJob's, create's, setReady's), through the same
  // functions. A job that initJob would refuse refuses the file; a tensor
  // that create would refuse is left out and named, and the rest restored.
  if (c.job_configured) validate_job_config(c.job);
  // A name twice: which one is meant cannot be told, so the file is refused.
  std::set<std::string_view> names;
  for (const auto& t : c.tensors) {
    if (!names.insert(t.spec.name).second)
      throw Error("restore: tensor '" + t.spec.name + "' appears twice");
  }
  std::vector<SkippedTensor> skipped;
  std::vector<const TensorCheckpoint*> good;
  TensorStore::Pending pending;
  for (const auto& t : c.tensors) {
    try {
      TensorSpec spec = t.spec;
      spec.init = InitConfig::from_values(t.values);
      spec.slots = t.slots;
      spec.version = t.version;
      store_.validate(spec, t.part, &pending);
      good.push_back(&t);
    } catch (const Error& e) {
      skipped.push_back({t.spec.name, e.what()});
    }
  }
  try {
    for (const TensorCheckpoint* t : good) {
      TensorSpec spec = t->spec;
      spec.init = InitConfig::from_values(t->values);
      spec.slots = t->slots;
      spec.version = t->version;
      store_.create(spec, t->part);
    }
    // The job's step first: the tables created from the file take it as
    // their clock, from which the restored rows' ages count back.
    job_.restore(c.job_configured, c.job, c.global_step, c.ready);
    restore_tables(c);
    if (c.ready) check_can_be_ready();
  } catch (...) {
    store_.clear();           // nothing can hold a pointer to a tensor or table yet
    tables_->tables.clear();  // those restored before a refused one: an older file may follow
    if (budget_ != nullptr) tables_->reserved.resize_anyway(0);
    job_.restore(false, JobConfig{}, 0, false);
    throw;
  }
  requests_.load(c.requests, c.client_requests);
  counters_.last_checkpoint_step = c.global_step;
  counters_.last_checkpoint_unix_secs = c.unix_secs;
  restore_skipped_ = skipped;
  return skipped;
}

}  // namespace ps
