// Client: construction, listing and statistics, and the job coordination
// calls. Declaring and creating tensors are in client_create.cc, pull and
// push in client_transfer.cc, embedding rows in client_tables.cc; the shared
// internals (Client::Impl) in client_impl.h.
#include "ps/client.h"

#include <algorithm>
#include <map>

#include <spdlog/spdlog.h>

#include "common/auth_token.h"
#include "client/client_impl.h"
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
    const auto raised = impl_->options.connect_timeout + std::chrono::milliseconds(10000);
    spdlog::info(
        "call_timeout {} s is below connect_timeout {} s: a call may have to wait for a "
        "connection first, so calls wait up to {} s",
        impl_->options.call_timeout.count() / 1000.0,
        impl_->options.connect_timeout.count() / 1000.0, raised.count() / 1000.0);
    impl_->options.call_timeout = raised;
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
  auto collected = impl_->every_shard<Collected>(
      [](ShardConnection& s) { return s.shard.listRequest().send(); },
      [this](Collected& out, int shard, capnp::Response<wire::Shard::ListResults>& reply) {
        check_reply_list(impl_->shard_name_at(shard), "tensors", reply.getTensors());
        for (auto t : reply.getTensors()) {
          TensorInfo info;
          info.name = t.hasPart() ? t.getPart().getFullName() : t.getName();
          info.shape = shape_from_wire(t.hasPart() ? t.getPart().getFullShape() : t.getShape());
          info.version = t.getVersion();
          info.optimizer = static_cast<OptimizerKind>(t.getOptimizer());
          out.items.emplace_back(shard, std::move(info));
        }
      },
      "list: ");
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
          ->every_shard<Collected>(
              [](ShardConnection& s) { return s.shard.statsRequest().send(); },
              [this](Collected& out, int shard, capnp::Response<wire::Shard::StatsResults>& reply) {
                auto st = reply.getStats();
                check_reply_list(impl_->shard_name_at(shard), "workers", st.getWorkers());
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
                o.awaiting_chief = st.getAwaitingChief();
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
              "stats: ");
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
  impl_->every_shard<Nothing>(
      [config](ShardConnection& s) {
        auto req = s.shard.initJobRequest();
        job_to_wire(config, req.initConfig());
        return req.send();
      },
      [this](Nothing&, int, capnp::Response<wire::Shard::InitJobResults>& reply) {
        impl_->learn_job(reply.getInfo().getJob());
      },
      "initJob: ");
}

void Client::set_ready() {
  impl_->every_shard<Nothing>([](ShardConnection& s) { return s.shard.setReadyRequest().send(); },
                              [](Nothing&, int, auto&) {}, "setReady: ");
}

bool Client::wait_ready(std::chrono::milliseconds timeout) {
  struct Ready {
    bool all = true;
  };
  const auto ms = static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, 3'600'000));
  return impl_
      ->every_shard<Ready>(
          [ms](ShardConnection& s) {
            auto req = s.shard.waitReadyRequest();
            req.setTimeoutMs(ms);
            return req.send();
          },
          [this](Ready& r, int index, capnp::Response<wire::Shard::WaitReadyResults>& reply) {
            r.all = r.all && reply.getReady();
            if (reply.getReady()) {
              impl_->learn_job(reply.getJob());
              impl_->shards[static_cast<std::size_t>(index)]->holds_model = true;
            }
          },
          "waitReady: ", std::chrono::milliseconds(ms))
      .all;
}

namespace {
void fold_step_done(Client::StepDone& d, int shard,
                    capnp::Response<wire::Shard::StepDoneResults>& reply) {
  if (shard == 0)
    d.global_step = reply.getGlobalStep();  // shard 0 holds the job's step, as TF's ps 0
  d.stop = d.stop || reply.getStop();
}
}  // namespace

std::future<Client::StepDone> Client::step_done_async(int64_t local_step) {
  // One id for the call, kept across retries: each shard counts it once.
  const uint64_t id = impl_->new_request_id();
  return impl_->on_every_shard<StepDone>(
      [local_step, id](ShardConnection& s) { return send_step_done(s, local_step, id); },
      fold_step_done, "stepDone: ");
}

Client::StepDone Client::step_done(int64_t local_step) {
  const uint64_t id = impl_->new_request_id();
  return impl_->every_shard<StepDone>(
      [local_step, id](ShardConnection& s) { return send_step_done(s, local_step, id); },
      fold_step_done, "stepDone: ");
}

Client::Checkpoint Client::checkpoint(int64_t step) {
  return impl_->every_shard<Checkpoint>(
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
      "checkpoint: ");
}

uint64_t Client::rollbacks() const { return impl_->retry ? impl_->retry->rollbacks() : 0; }

int64_t Client::recorded_step() const { return impl_->recorded_step; }

uint32_t Client::barrier(const std::string& name, uint32_t count, std::chrono::milliseconds timeout,
                         LostWorkers lost) {
  struct Arrived {
    uint32_t n = 0;
  };
  const auto ms = static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, 3'600'000));
  return impl_
      ->call<Arrived>(
          [this, name, count, ms, lost](Unanswered* unanswered) {
            auto send = [name, count, ms, lost](ShardConnection& c, int) {
              auto req = c.shard.barrierRequest();
              req.setName(name);
              req.setCount(count);
              req.setTimeoutMs(ms);
              req.setSkipLostWorkers(lost == LostWorkers::kSkip);
              return req.send();
            };
            return counted(unanswered, 0, impl_->retry->call(0, send))
                .then([](capnp::Response<wire::Shard::BarrierResults>&& r) {
                  return Arrived{r.getArrived()};
                });
          },
          "barrier: ", std::chrono::milliseconds(ms))
      .n;
}

void Client::finish() {
  impl_->every_shard<Nothing>([](ShardConnection& s) { return s.shard.finishRequest().send(); },
                              [](Nothing&, int, auto&) {}, "finish: ");
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
