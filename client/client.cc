// Client: construction, create/declare, listing and statistics, and the job
// coordination calls. Pull and push are in client_transfer.cc; the shared
// internals (Client::Impl) in client_impl.h.
#include "ps/client.h"

#include <algorithm>
#include <map>

#include <spdlog/spdlog.h>

#include "common/auth_token.h"
#include "client/client_impl.h"
#include "common/finite.h"
#include "common/malloc_tuning.h"

namespace ps {

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  if (impl_->options.tune_malloc) tune_malloc_for_large_messages();
  if (impl_->options.auth_token.empty() && !impl_->options.auth_token_file.empty()) {
    impl_->options.auth_token = read_auth_token(impl_->options.auth_token_file);
  }
  if (!impl_->options.tls_ca.empty() || !impl_->options.tls_cert.empty() ||
      !impl_->options.tls_key.empty()) {
    impl_->tls = std::make_shared<TlsClient>(
        TlsClientFiles{impl_->options.tls_ca, impl_->options.tls_cert, impl_->options.tls_key});
  }
  if (impl_->options.call_timeout.count() > 0 &&
      impl_->options.call_timeout < impl_->options.connect_timeout) {
    impl_->options.call_timeout = impl_->options.connect_timeout + std::chrono::milliseconds(10000);
  }
  impl_->connect();
}

Client::~Client() = default;

int Client::num_shards() const { return static_cast<int>(impl_->options.ps_hosts.size()); }
const ClientOptions& Client::options() const { return impl_->options; }

Placement Client::placement() const {
  std::lock_guard lock(impl_->placement_mutex);
  return impl_->placement;
}

void Client::declare(const std::vector<TensorSpec>& specs) {
  std::lock_guard lock(impl_->placement_mutex);
  for (const auto& s : specs) impl_->placement.add(s);
}

namespace {

// A create request's two forms: a check of everything the shard will get
// (values left out: the client checked them), then the real requests.
enum class CreateRound { kValidate, kCreate };

// What a create's earlier checks found new on a shard (create's
// pendingTensors / pendingBytes).
struct CreatePending {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

// One create request: `batch`'s parts of `specs`, each cut to its part.
kj::Promise<CreatePending> send_create(ShardConnection& c, const ShardBatch& batch,
                                       const std::vector<TensorSpec>& specs, CreateRound round,
                                       CreatePending pending = {}) {
  const bool validate = round == CreateRound::kValidate;
  auto req = c.shard.createRequest();
  req.setValidateOnly(validate);
  req.setValuesLeftOut(validate);
  if (validate) {
    req.setPendingTensors(pending.tensors);
    req.setPendingBytes(pending.bytes);
  }
  auto out = req.initSpecs(static_cast<unsigned>(batch.parts.size()));
  for (unsigned i = 0; i < batch.parts.size(); ++i) {
    const TensorSpec& full = specs[batch.parts[i].tensor];
    const Part& part = batch.parts[i].part;
    // All of the spec but its values (positional, every member named: a
    // member added to TensorSpec warns here until it is passed on).
    TensorSpec piece{
        part.stored_name, part.num_parts > 1 ? std::vector<uint64_t>{part.count} : full.shape,
        full.optimizer,   InitConfig{full.init.kind, full.init.a, full.init.b, full.init.seed, {}},
        full.trainable,   {},
        full.version};
    // Values and restored slots are cut to the part; left out when
    // validating, the slots' number kept.
    auto cut = [&](const std::vector<float>& v) {
      if (validate) return std::vector<float>();
      return std::vector<float>(v.begin() + part.offset, v.begin() + part.offset + part.count);
    };
    if (full.init.kind == InitKind::kValues) piece.init.values = cut(full.init.values);
    for (const auto& slot : full.slots) piece.slots.push_back(cut(slot));
    to_wire(piece, out[i]);
    if (part.num_parts > 1) {
      part_to_wire(PartMeta{full.name, full.shape, part.offset, part.index, part.num_parts},
                   out[i].initPart());
    }
  }
  return req.send().then([](capnp::Response<wire::Shard::CreateResults>&& reply) {
    return CreatePending{reply.getPendingTensors(), reply.getPendingBytes()};
  });
}

// What psd would refuse in values that its check round does not see.
void check_create_values(const TensorSpec& full) {
  if (full.init.kind == InitKind::kValues && full.init.values.size() != full.num_elements()) {
    throw ConfigError("tensor '" + full.name + "' has " + std::to_string(full.num_elements()) +
                      " elements but " + std::to_string(full.init.values.size()) +
                      " initial values");
  }
  if (!all_finite(full.init.values)) {
    throw RequestError("create: tensor '" + full.name + "' has a NaN or Inf initial value");
  }
  for (const auto& slot : full.slots) {
    if (slot.size() != full.num_elements()) {
      throw ConfigError("tensor '" + full.name + "' has " + std::to_string(full.num_elements()) +
                        " elements but a restored optimizer slot of " +
                        std::to_string(slot.size()));
    }
    if (!all_finite(slot))
      throw RequestError("create: tensor '" + full.name + "' has a NaN or Inf restored slot value");
  }
}

// One shard's check requests (`checks`, all for one shard), one after
// another, each told what those before found new: the shard's limits count
// the whole call, in requests that each fit its message limit (one request
// per shard broke the connection past it).
kj::Promise<void> check_in_turn(Reconnector& retry,
                                std::shared_ptr<const std::vector<ShardBatch>> checks,
                                std::shared_ptr<const std::vector<TensorSpec>> specs, std::size_t i,
                                CreatePending pending) {
  if (i == checks->size()) return kj::READY_NOW;
  const ShardBatch* batch = &(*checks)[i];
  return retry
      .call(batch->shard,
            [batch, specs, pending](ShardConnection& c, int) {
              return send_create(c, *batch, *specs, CreateRound::kValidate, pending);
            })
      .then([&retry, checks, specs, i](CreatePending found) {
        return check_in_turn(retry, checks, specs, i + 1, found);
      });
}

// A create's declarations, taken back unless kept (the create succeeded):
// a shape psd refused stays declarable, and the next tensors land where they
// do on workers that never declared it. Not when anything was declared
// meanwhile (another thread's create, even of the same names): theirs
// stand, and so do these (a failed create must not take back a tensor that
// another thread's create of it has just succeeded with).
class Declarations {
 public:
  Declarations(Placement& placement, std::mutex& mutex, const std::vector<TensorSpec>& specs)
      : placement_(placement), mutex_(mutex) {
    std::lock_guard lock(mutex_);
    before_ = placement_.mark();
    try {
      for (const auto& s : specs) placement_.add(s);
    } catch (...) {
      placement_.rollback(before_);
      throw;
    }
    declared_ = placement_.adds();
  }
  Declarations(const Declarations&) = delete;
  ~Declarations() {
    if (kept_) return;
    std::lock_guard lock(mutex_);
    if (placement_.adds() == declared_) placement_.rollback(before_);
  }
  void keep() { kept_ = true; }

 private:
  Placement& placement_;
  std::mutex& mutex_;
  Placement::Mark before_;
  uint64_t declared_ = 0;  // placement_.adds() after ours
  bool kept_ = false;
};

}  // namespace

void Client::create(const std::vector<TensorSpec>& specs) {
  for (const auto& full : specs) check_create_values(full);
  Declarations declarations(impl_->placement, impl_->placement_mutex, specs);
  std::vector<std::string> names;
  // Each part's request carries its initial values and restored slots (or
  // nothing but the spec): batches are cut by what they really carry.
  std::vector<uint32_t> copies;
  for (const auto& s : specs) {
    names.push_back(s.name);
    copies.push_back((s.init.kind == InitKind::kValues ? 1 : 0) +
                     static_cast<uint32_t>(s.slots.size()));
  }
  auto batches = impl_->plan(names, copies);
  for (const ShardBatch& b : batches) {
    if (b.bytes <= impl_->max_payload_bytes) continue;
    // One part alone, with its values and slots, is over psd's limit.
    const std::string& name = names[b.parts.front().tensor];
    throw ConfigError("create: a part of '" + name +
                      "' with its initial values and restored optimizer slots takes " +
                      std::to_string(b.bytes) + " bytes, more than psd accepts in one message (" +
                      std::to_string(impl_->max_payload_bytes) +
                      "); raise psd --max_message_mb or lower ClientOptions::part_bytes");
  }
  auto shared_specs = std::make_shared<const std::vector<TensorSpec>>(specs);
  // Over several requests, every shard first checks all it will get,
  // values left out, before any creates: one refusal creates nothing
  // anywhere, and a shard's limits count every new tensor of the call.
  std::map<int, std::shared_ptr<std::vector<ShardBatch>>> checks;
  if (batches.size() > 1) {
    for (ShardBatch& b : impl_->plan(names, std::vector<uint32_t>(names.size(), 0))) {
      auto& list = checks[b.shard];
      if (!list) list = std::make_shared<std::vector<ShardBatch>>();
      list->push_back(std::move(b));
    }
  }
  auto create_round = [this, shared_specs](const std::vector<ShardBatch>& requests) {
    kj::Vector<kj::Promise<void>> calls;
    for (const auto& b : requests) {
      calls.add(impl_->retry->call(b.shard, [b, shared_specs](ShardConnection& c, int) {
        return send_create(c, b, *shared_specs, CreateRound::kCreate).ignoreResult();
      }));
    }
    return kj::joinPromises(calls.releaseAsArray());
  };
  struct Done {};
  impl_
      ->submit<Done>(
          [this, shared_specs, create_round, batches = std::move(batches),
           checks = std::move(checks)]() mutable {
            kj::Vector<kj::Promise<void>> shards_checked;
            for (auto& [shard, list] : checks) {
              shards_checked.add(
                  check_in_turn(*impl_->retry, list, shared_specs, 0, CreatePending{}));
            }
            // The second round outlives this call: what it sends moves into it.
            return kj::joinPromises(shards_checked.releaseAsArray())
                .then([create_round, batches = std::move(batches)]() mutable {
                  return create_round(batches);
                })
                .then([] { return Done{}; });
          },
          "create: ")
      .get();
  declarations.keep();
}

std::vector<std::string> Client::connection_addresses() {
  std::vector<std::string> out;
  impl_->loop.run([&] {
    for (auto& s : impl_->shards) out.push_back(s.get() != nullptr ? s->via : std::string());
  });
  return out;
}

std::vector<TensorInfo> Client::list() {
  struct Collected {
    std::vector<std::pair<int, TensorInfo>> items;
  };
  auto collected =
      impl_
          ->on_every_shard<Collected>(
              [](ShardConnection& s) { return s.shard.listRequest().send(); },
              [](Collected& out, int shard, capnp::Response<wire::Shard::ListResults>& reply) {
                for (auto t : reply.getTensors()) {
                  TensorInfo info;
                  info.name = t.hasPart() ? t.getPart().getFullName() : t.getName();
                  info.shape =
                      shape_from_wire(t.hasPart() ? t.getPart().getFullShape() : t.getShape());
                  info.version = t.getVersion();
                  info.optimizer = static_cast<OptimizerKind>(t.getOptimizer());
                  out.items.emplace_back(shard, std::move(info));
                }
              },
              "list: ")
          .get();
  // Merge the parts of split tensors into one entry each.
  std::map<std::string, TensorInfo> merged;
  for (auto& [shard, info] : collected.items) {
    auto [it, fresh] = merged.try_emplace(info.name, info);
    if (!fresh) it->second.version = std::min(it->second.version, info.version);
    if (std::find(it->second.shards.begin(), it->second.shards.end(), shard) ==
        it->second.shards.end()) {
      it->second.shards.push_back(shard);
    }
  }
  std::vector<TensorInfo> out;
  for (auto& [name, info] : merged) {
    std::sort(info.shards.begin(), info.shards.end());
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<ShardStats> Client::stats() {
  struct Collected {
    std::vector<ShardStats> items;
  };
  auto collected =
      impl_
          ->on_every_shard<Collected>(
              [](ShardConnection& s) { return s.shard.statsRequest().send(); },
              [this](Collected& out, int shard, capnp::Response<wire::Shard::StatsResults>& reply) {
                auto st = reply.getStats();
                ShardStats o;
                o.shard = shard;
                o.address = impl_->options.ps_hosts[shard];
                o.tensors = st.getTensors();
                o.bytes = st.getBytes();
                o.pushes = st.getPushes();
                o.pulls = st.getPulls();
                o.rejected = st.getRejected();
                o.stale_gradients = st.getStaleGradients();
                o.bytes_in = st.getBytesIn();
                o.bytes_out = st.getBytesOut();
                o.shared_bytes = st.getSharedBytes();
                o.global_step = st.getGlobalStep();
                o.connections = st.getConnections();
                o.job = job_from_wire(st.getJob());
                o.ready = st.getReady();
                o.finished = st.getFinished();
                o.steps_applied = st.getStepsApplied();
                o.staleness_waits = st.getStalenessWaits();
                o.max_staleness = st.getMaxStaleness();
                o.last_checkpoint_step = st.getLastCheckpointStep();
                o.last_checkpoint_unix_secs = st.getLastCheckpointUnixSecs();
                for (auto w : st.getWaits()) o.waits.emplace_back(w.cStr(), w.size());
                for (auto w : st.getWorkers()) {
                  o.workers.push_back({w.getWorkerIndex(), w.getStep(), w.getConnected(),
                                       w.getPushes(), w.getStale()});
                }
                out.items.push_back(std::move(o));
              },
              "stats: ")
          .get();
  std::sort(collected.items.begin(), collected.items.end(),
            [](const ShardStats& a, const ShardStats& b) { return a.shard < b.shard; });
  return collected.items;
}

JobConfig Client::job() const {
  std::lock_guard lock(impl_->job_mutex);
  return impl_->job;
}

namespace {
struct Nothing {};
}  // namespace

void Client::init_job(const JobConfig& config) {
  impl_
      ->on_every_shard<Nothing>(
          [config](ShardConnection& s) {
            auto req = s.shard.initJobRequest();
            job_to_wire(config, req.initConfig());
            return req.send();
          },
          [this](Nothing&, int, capnp::Response<wire::Shard::InitJobResults>& reply) {
            impl_->learn_job(reply.getInfo().getJob());
          },
          "initJob: ")
      .get();
}

void Client::set_ready() {
  impl_
      ->on_every_shard<Nothing>([](ShardConnection& s) { return s.shard.setReadyRequest().send(); },
                                [](Nothing&, int, auto&) {}, "setReady: ")
      .get();
}

bool Client::wait_ready(std::chrono::milliseconds timeout) {
  struct Ready {
    bool all = true;
  };
  const auto ms = static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, 3'600'000));
  return impl_
      ->on_every_shard<Ready>(
          [ms](ShardConnection& s) {
            auto req = s.shard.waitReadyRequest();
            req.setTimeoutMs(ms);
            return req.send();
          },
          [this](Ready& r, int, capnp::Response<wire::Shard::WaitReadyResults>& reply) {
            r.all = r.all && reply.getReady();
            if (reply.getReady()) impl_->learn_job(reply.getJob());
          },
          "waitReady: ", std::chrono::milliseconds(ms))
      .get()
      .all;
}

std::future<Client::StepDone> Client::step_done_async(int64_t local_step) {
  // One id for the call, kept across retries: each shard counts it once.
  const uint64_t id = impl_->new_request_id();
  return impl_->on_every_shard<StepDone>(
      [local_step, id](ShardConnection& s) {
        auto req = s.shard.stepDoneRequest();
        req.setStep(local_step);
        req.setRequestId(id);
        return req.send();
      },
      [](StepDone& d, int shard, capnp::Response<wire::Shard::StepDoneResults>& reply) {
        if (shard == 0)
          d.global_step = reply.getGlobalStep();  // shard 0 holds the job's step, as TF's ps 0
        d.stop = d.stop || reply.getStop();
      },
      "stepDone: ");
}

Client::StepDone Client::step_done(int64_t local_step) { return step_done_async(local_step).get(); }

Client::Checkpoint Client::checkpoint(int64_t step) {
  return impl_
      ->on_every_shard<Checkpoint>(
          [step](ShardConnection& s) {
            auto req = s.shard.checkpointRequest();
            req.setStep(step);
            return req.send();
          },
          [](Checkpoint& c, int shard, capnp::Response<wire::Shard::CheckpointResults>& reply) {
            if (c.paths.size() <= static_cast<std::size_t>(shard)) c.paths.resize(shard + 1);
            c.paths[shard] = reply.getPath();
            c.step = reply.getStep();
          },
          "checkpoint: ")
      .get();
}

uint64_t Client::rollbacks() const { return impl_->retry ? impl_->retry->rollbacks() : 0; }

int64_t Client::recorded_step() const { return impl_->recorded_step; }

uint32_t Client::barrier(const std::string& name, uint32_t count,
                         std::chrono::milliseconds timeout) {
  struct Arrived {
    uint32_t n = 0;
  };
  const auto ms = static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, 3'600'000));
  return impl_
      ->submit<Arrived>(
          [this, name, count, ms] {
            return impl_->retry
                ->call(0,
                       [name, count, ms](ShardConnection& c, int) {
                         auto req = c.shard.barrierRequest();
                         req.setName(name);
                         req.setCount(count);
                         req.setTimeoutMs(ms);
                         return req.send();
                       })
                .then([](capnp::Response<wire::Shard::BarrierResults>&& r) {
                  return Arrived{r.getArrived()};
                });
          },
          "barrier: ", std::chrono::milliseconds(ms))
      .get()
      .n;
}

void Client::finish() {
  impl_
      ->on_every_shard<Nothing>([](ShardConnection& s) { return s.shard.finishRequest().send(); },
                                [](Nothing&, int, auto&) {}, "finish: ")
      .get();
}

void Client::report(int64_t step, float loss, float accuracy, float samples_per_sec,
                    float learning_rate) {
  // run() only sends; nobody waits for the replies. A failed report is
  // logged, never thrown: it must not stop training.
  impl_->loop.run([&] {
    for (auto& s : impl_->shards) {
      auto req = s->shard.reportRequest();
      req.setStep(step);
      req.setLoss(loss);
      req.setAccuracy(accuracy);
      req.setSamplesPerSec(samples_per_sec);
      req.setLearningRate(learning_rate);
      impl_->tasks->add(impl_->loop.kept(
          req.send().ignoreResult().catch_([address = s->address](kj::Exception&& e) {
            spdlog::warn("report to {} failed: {}", address, e.getDescription().cStr());
          })));
    }
  });
}

}  // namespace ps
