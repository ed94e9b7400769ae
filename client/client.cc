#include "ps/client.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <random>

#include <capnp/orphan.h>
#include <spdlog/spdlog.h>

#include "auth_token.h"
#include "client_loop.h"
#include "malloc_tuning.h"
#include "reconnector.h"
#include "request_plan.h"
#include "shard_connection.h"
#include "wire_convert.h"

namespace ps {

namespace {

// Room left in each message for everything that is not tensor data.
constexpr uint64_t kMessageSlack = 256u << 10;

std::string strip_prefix(std::string s, std::string_view prefix) {
  if (s.rfind(prefix, 0) == 0) s.erase(0, prefix.size());
  return s;
}

// A kj::Exception from the loop as the ps::Error a user should see.
std::exception_ptr translate(const kj::Exception& e, const std::string& context) {
  std::string msg = e.getDescription().cStr();
  msg = strip_prefix(msg, "remote exception: ");
  msg = strip_prefix(msg, "std::exception: ");
  if (e.getType() == kj::Exception::Type::DISCONNECTED || e.getType() == kj::Exception::Type::OVERLOADED) {
    return std::make_exception_ptr(ConnectionError(context + msg));
  }
  return std::make_exception_ptr(RequestError(context + msg));
}

PushStatus from_wire(wire::PushStatus s) {
  switch (s) {
    case wire::PushStatus::APPLIED: return PushStatus::kApplied;
    case wire::PushStatus::ACCUMULATED: return PushStatus::kAccumulated;
    case wire::PushStatus::STALE: return PushStatus::kStale;
    case wire::PushStatus::DUPLICATE: return PushStatus::kDuplicate;
  }
  return PushStatus::kStale;
}

}  // namespace

struct Client::Impl : kj::TaskSet::ErrorHandler {
  explicit Impl(ClientOptions o)
      : options(std::move(o)),
        placement(std::max<int>(1, static_cast<int>(options.ps_hosts.size())), options.placement, options.chunk_bytes,
                  options.part_bytes) {}

  ~Impl() {
    loop.run([this] {
      tasks = nullptr;
      retry = nullptr;
      shards.clear();
    });
  }

  void taskFailed(kj::Exception&& e) override { spdlog::error("libpsclient internal task failed: {}", e.getDescription().cStr()); }

  // Starts op() with the loop; its result or error reaches the future (the
  // helper thread runs the loop until then).
  template <typename T, typename Op>
  std::future<T> submit(Op op, std::string context) {
    auto result = std::make_shared<std::promise<T>>();
    auto future = result->get_future();
    loop.run([&] {
      kj::Promise<T> promise = nullptr;
      try {
        promise = op();
      } catch (...) {
        result->set_exception(std::current_exception());
        return;
      }
      promise = with_timeout(kj::mv(promise));
      tasks->add(loop.kept(promise.then([result](T&& value) { result->set_value(std::move(value)); },
                              [result, context](kj::Exception&& e) { result->set_exception(translate(e, context)); })));
    });
    return future;
  }

  // Runs op() with the loop and waits for its result: on the calling
  // thread when no other thread runs the loop (client_loop.h).
  template <typename T, typename Op>
  T call(Op op, const std::string& context) {
    std::exception_ptr error;
    std::optional<T> value;
    try {
      loop.run([&]() -> kj::Promise<void> {
        kj::Promise<T> promise = nullptr;
        try {
          promise = op();
        } catch (...) {
          error = std::current_exception();
          return kj::READY_NOW;
        }
        return with_timeout(kj::mv(promise)).then([&](T&& v) { value.emplace(std::move(v)); },
                                                  [&](kj::Exception&& e) { error = translate(e, context); });
      });
    } catch (const kj::Exception& e) {
      error = translate(e, context);
    }
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }

  // Blocking (`done` given): the result goes to *done and the future is
  // empty. Otherwise a future.
  template <typename T, typename Op>
  std::future<T> run(Op op, std::string context, T* done) {
    if (done == nullptr) return submit<T>(std::move(op), std::move(context));
    *done = call<T>(std::move(op), context);
    return {};
  }

  template <typename T>
  kj::Promise<T> with_timeout(kj::Promise<T> p) {
    if (options.call_timeout.count() <= 0) return p;
    const auto ms = options.call_timeout.count();
    return p.exclusiveJoin(loop.timer().afterDelay(ms * kj::MILLISECONDS).then([ms]() -> kj::Promise<T> {
      return disconnected("no answer from psd within " + std::to_string(ms) + " ms (ClientOptions::call_timeout)");
    }));
  }

  // Sends one request to every shard (make(shard) builds and sends it) and
  // folds the replies with on_reply(shard index, reply) into a T.
  template <typename T, typename Make, typename OnReply>
  std::future<T> on_every_shard(Make make, OnReply on_reply, std::string context) {
    return submit<T>(
        [this, make, on_reply] {
          auto acc = kj::heap<T>();
          kj::Vector<kj::Promise<void>> calls;
          for (auto& s : shards) {
            calls.add(retry->call(s->index, [make](ShardConnection& c, int) { return make(c); })
                          .then([index = s->index, on_reply, acc = acc.get()](auto&& reply) mutable {
              on_reply(*acc, index, reply);
            }));
          }
          return kj::joinPromises(calls.releaseAsArray()).then([acc = kj::mv(acc)]() mutable { return std::move(*acc); });
        },
        std::move(context));
  }

  std::vector<ShardBatch> plan(const std::vector<std::string>& names) {
    std::lock_guard lock(placement_mutex);
    return plan_batches(placement, names, max_batch_bytes);
  }

  uint64_t tensor_elements(const std::string& name) {
    std::lock_guard lock(placement_mutex);
    return placement.at(name).spec.num_elements();
  }

  void connect() {
    if (options.ps_hosts.empty()) throw ConfigError("no ps hosts given (ClientOptions::ps_hosts / --ps_hosts)");
    struct Outcome {
      std::vector<std::string> errors;
    };
    auto outcome = submit<Outcome>(
        [this] {
          tasks = kj::heap<kj::TaskSet>(*this);
          shards.resize(options.ps_hosts.size());
          kj::Vector<kj::Promise<void>> all;
          auto errors = kj::heap<std::vector<std::string>>();
          for (std::size_t i = 0; i < options.ps_hosts.size(); ++i) {
            auto hello_deadline = options.connect_timeout + std::chrono::milliseconds(5000);
            auto p = connect_shard(loop.port(), static_cast<int>(i), options.ps_hosts[i], options.connect_timeout,
                                   hello_params())
                         .exclusiveJoin(loop.timer().afterDelay(hello_deadline.count() * kj::MILLISECONDS)
                                            .then([host = options.ps_hosts[i]]() -> kj::Promise<kj::Own<ShardConnection>> {
                                              return disconnected("psd at " + host + " accepted but did not answer hello");
                                            }));
            all.add(p.then([this, i](kj::Own<ShardConnection> c) { shards[i] = kj::mv(c); },
                           [e = errors.get()](kj::Exception&& ex) { e->push_back(ex.getDescription().cStr()); }));
          }
          return kj::joinPromises(all.releaseAsArray()).then([errors = kj::mv(errors)]() mutable {
            return Outcome{std::move(*errors)};
          });
        },
        "");
    // connect_shard has its own deadline; the call timeout must not cut it short.
    Outcome o = outcome.get();
    loop.run([this] {
      retry = kj::heap<Reconnector>(loop.port(), shards, hello_params(), options.reconnect_timeout);
    });
    if (!o.errors.empty()) {
      std::string msg = "could not connect to " + std::to_string(o.errors.size()) + " of " +
                        std::to_string(options.ps_hosts.size()) + " ps shards: ";
      for (std::size_t i = 0; i < o.errors.size(); ++i) msg += (i ? "; " : "") + o.errors[i];
      throw ConnectionError(msg);
    }
    {
      std::lock_guard lock(job_mutex);
      job = shards[0]->job;
      job_mode = job.mode;
    }
    uint64_t smallest = std::numeric_limits<uint64_t>::max();
    for (auto& s : shards) smallest = std::min(smallest, s->max_message_bytes);
    if (smallest <= kMessageSlack + sizeof(float)) throw ConfigError("psd's message size limit is too small");
    const uint64_t part = std::min(options.part_bytes, options.chunk_bytes);
    max_batch_bytes = std::min<uint64_t>(smallest - kMessageSlack, std::max<uint64_t>(options.max_request_bytes, part));
    if (part > max_batch_bytes) {
      throw ConfigError("part size " + std::to_string(part) + " bytes exceeds what psd accepts in one message (" +
                        std::to_string(max_batch_bytes) + "); lower ClientOptions::part_bytes or raise psd --max_message_mb");
    }
  }

  HelloParams hello_params() const {
    return {options.worker_index, options.is_chief, options.auth_token};
  }

  // Push request ids: a random base per Client (a restarted worker does not
  // reuse its predecessor's ids), then one per message.
  uint64_t new_request_id() { return next_request_id.fetch_add(1); }

  // A pull in flight: which batches, where their values go, and the step
  // and versions each batch was read at.
  struct PullState {
    std::vector<ShardBatch> batches;
    std::vector<std::span<float>> out;
    std::vector<int64_t> steps;
    std::vector<std::vector<uint64_t>> versions;
  };

  // Pulls the given batches (waiting for min_step). In sync mode all parts
  // must come from one global step: batches read at an older step than the
  // newest are read again at that step, so a worker never trains on a mix.
  kj::Promise<void> pull_round(PullState& st, std::vector<std::size_t> which, int64_t min_step, int round) {
    kj::Vector<kj::Promise<void>> calls;
    for (std::size_t b : which) {
      const ShardBatch& batch = st.batches[b];
      calls.add(retry->call(batch.shard, [&st, b, min_step](ShardConnection& c, int attempt) {
        const ShardBatch& batch = st.batches[b];
        auto req = c.shard.pullRequest();
        auto names_out = req.initNames(static_cast<unsigned>(batch.parts.size()));
        for (unsigned i = 0; i < batch.parts.size(); ++i) names_out.set(i, batch.parts[i].part.stored_name);
        // A shard back from a restart at an older step may never reach the
        // step asked for: read what it has (reconnector.h).
        req.setMinStep(attempt > 0 && c.rolled_back ? std::min(min_step, c.hello_step) : min_step);
        return req.send().then([&c](capnp::Response<wire::Shard::PullResults>&& reply) {
          c.last_step = std::max(c.last_step, reply.getStep());
          return kj::mv(reply);
        });
      }).then([&st, b](capnp::Response<wire::Shard::PullResults>&& reply) {
        const ShardBatch& batch = st.batches[b];
        auto tensors = reply.getTensors();
        if (tensors.size() != batch.parts.size()) {
          throw RequestError("shard answered " + std::to_string(tensors.size()) + " tensors for " +
                             std::to_string(batch.parts.size()));
        }
        st.versions[b].resize(tensors.size());
        for (unsigned i = 0; i < tensors.size(); ++i) {
          const PartRef& ref = batch.parts[i];
          auto data = tensors[i].getValues();
          if (data.size() != ref.part.count * sizeof(float)) {
            throw RequestError("'" + ref.part.stored_name + "' came back with " + std::to_string(data.size()) +
                               " bytes, expected " + std::to_string(ref.part.count * sizeof(float)) +
                               " (was it created with another shape or chunk size?)");
          }
          std::memcpy(st.out[ref.tensor].data() + ref.part.offset, data.begin(), data.size());
          st.versions[b][i] = tensors[i].getVersion();
        }
        st.steps[b] = reply.getStep();
      }));
    }
    return kj::joinPromises(calls.releaseAsArray()).then([this, &st, round]() -> kj::Promise<void> {
      if (job_mode.load() != SyncMode::kSync || st.steps.empty()) return kj::READY_NOW;
      const int64_t newest = *std::max_element(st.steps.begin(), st.steps.end());
      std::vector<std::size_t> behind;
      for (std::size_t b = 0; b < st.steps.size(); ++b) {
        if (st.steps[b] < newest) behind.push_back(b);
      }
      if (behind.empty()) return kj::READY_NOW;
      if (round >= 16) throw RequestError("shards kept moving to new steps; could not read one consistent step");
      return pull_round(st, std::move(behind), newest, round + 1);
    });
  }

  void learn_job(wire::JobConfig::Reader job) {
    JobConfig c = job_from_wire(job);
    std::lock_guard lock(job_mutex);
    this->job = c;
    job_mode = c.mode;
  }

  ClientOptions options;
  std::atomic<uint64_t> next_request_id{(std::random_device{}() | (uint64_t{std::random_device{}()} << 32)) << 8 | 1};
  std::mutex job_mutex;
  JobConfig job;
  std::atomic<SyncMode> job_mode{SyncMode::kAsync};
  std::mutex placement_mutex;
  Placement placement;
  uint64_t max_batch_bytes = 64u << 20;
  ClientLoop loop;
  // Loop-thread state.
  std::vector<kj::Own<ShardConnection>> shards;
  kj::Own<Reconnector> retry;
  kj::Own<kj::TaskSet> tasks;
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  if (impl_->options.tune_malloc) tune_malloc_for_large_messages();
  if (impl_->options.auth_token.empty() && !impl_->options.auth_token_file.empty()) {
    impl_->options.auth_token = read_auth_token(impl_->options.auth_token_file);
  }
  if (impl_->options.call_timeout.count() > 0 && impl_->options.call_timeout < impl_->options.connect_timeout) {
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

void Client::create(const std::vector<TensorSpec>& specs) {
  for (const auto& full : specs) {
    if (full.init.kind == InitKind::kValues && full.init.values.size() != full.num_elements()) {
      throw ConfigError("tensor '" + full.name + "' has " + std::to_string(full.num_elements()) + " elements but " +
                        std::to_string(full.init.values.size()) + " initial values");
    }
    for (const auto& slot : full.slots) {
      if (slot.size() != full.num_elements()) {
        throw ConfigError("tensor '" + full.name + "' has " + std::to_string(full.num_elements()) +
                          " elements but a restored optimizer slot of " + std::to_string(slot.size()));
      }
    }
  }
  declare(specs);
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  auto batches = impl_->plan(names);
  auto shared_specs = std::make_shared<const std::vector<TensorSpec>>(specs);
  struct Done {};
  impl_->submit<Done>(
            [this, batches = std::move(batches), shared_specs]() {
              kj::Vector<kj::Promise<void>> calls;
              for (const auto& b : batches) {
                calls.add(impl_->retry->call(b.shard, [b, shared_specs](ShardConnection& c, int) {
                  const auto& specs = *shared_specs;
                  auto req = c.shard.createRequest();
                  auto out = req.initSpecs(static_cast<unsigned>(b.parts.size()));
                  for (unsigned i = 0; i < b.parts.size(); ++i) {
                    const TensorSpec& full = specs[b.parts[i].tensor];
                    const Part& part = b.parts[i].part;
                    TensorSpec piece = full;
                    piece.name = part.stored_name;
                    if (part.num_parts > 1) piece.shape = {part.count};
                    // Values and restored slots are cut to the part.
                    auto cut = [&](const std::vector<float>& v) {
                      return std::vector<float>(v.begin() + part.offset, v.begin() + part.offset + part.count);
                    };
                    if (full.init.kind == InitKind::kValues) piece.init.values = cut(full.init.values);
                    for (std::size_t k = 0; k < full.slots.size(); ++k) piece.slots[k] = cut(full.slots[k]);
                    to_wire(piece, out[i]);
                    if (part.num_parts > 1) {
                      auto p = out[i].initPart();
                      p.setFullName(full.name);
                      auto fs = p.initFullShape(static_cast<unsigned>(full.shape.size()));
                      for (unsigned d = 0; d < full.shape.size(); ++d) fs.set(d, full.shape[d]);
                      p.setOffset(part.offset);
                      p.setIndex(part.index);
                      p.setCount(part.num_parts);
                    }
                  }
                  return req.send().ignoreResult();
                }));
              }
              return kj::joinPromises(calls.releaseAsArray()).then([] { return Done{}; });
            },
            "create: ")
      .get();
}

std::future<PullResult> Client::pull_async(std::vector<std::string> names, std::vector<std::span<float>> out,
                                           int64_t min_step) {
  return start_pull(std::move(names), std::move(out), min_step, nullptr);
}

std::future<PullResult> Client::start_pull(std::vector<std::string> names, std::vector<std::span<float>> out,
                                           int64_t min_step, PullResult* done) {
  if (names.size() != out.size()) throw ConfigError("pull: " + std::to_string(names.size()) + " names but " +
                                                    std::to_string(out.size()) + " buffers");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const uint64_t n = impl_->tensor_elements(names[i]);
    if (out[i].size() != n) {
      throw ConfigError("pull: buffer for '" + names[i] + "' holds " + std::to_string(out[i].size()) + " floats, tensor has " +
                        std::to_string(n));
    }
  }
  auto batches = impl_->plan(names);
  return impl_->run<PullResult>(
      [this, batches = std::move(batches), out = std::move(out), n = names.size(), min_step]() mutable {
        auto state = kj::heap<Impl::PullState>();
        state->batches = std::move(batches);
        state->out = std::move(out);
        state->steps.assign(state->batches.size(), 0);
        state->versions.resize(state->batches.size());
        std::vector<std::size_t> all(state->batches.size());
        for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
        auto* raw = state.get();
        return impl_->pull_round(*raw, std::move(all), min_step, 0).then([state = kj::mv(state), n]() mutable {
          PullResult result;
          result.versions.assign(n, std::numeric_limits<uint64_t>::max());
          result.step = state->steps.empty() ? 0 : state->steps[0];
          for (std::size_t b = 0; b < state->batches.size(); ++b) {
            result.step = std::min(result.step, state->steps[b]);
            for (std::size_t i = 0; i < state->batches[b].parts.size(); ++i) {
              auto& v = result.versions[state->batches[b].parts[i].tensor];
              v = std::min(v, state->versions[b][i]);
            }
          }
          return result;
        });
      },
      "pull: ", done);
}

PullResult Client::pull(const std::vector<std::string>& names, const std::vector<std::span<float>>& out,
                        int64_t min_step) {
  PullResult result;
  start_pull(names, out, min_step, &result);
  return result;
}

uint64_t Client::pull(const std::string& name, std::span<float> out) {
  return pull(std::vector<std::string>{name}, std::vector<std::span<float>>{out}).versions.at(0);
}

std::vector<float> Client::pull(const std::string& name) {
  std::vector<float> values(impl_->tensor_elements(name));
  pull(name, values);
  return values;
}

std::future<PushResult> Client::push_async(std::vector<std::string> names, std::vector<std::span<const float>> grads,
                                           int64_t step) {
  return start_push(std::move(names), std::move(grads), step, nullptr);
}

PushResult Client::push_and_step(const std::vector<std::string>& names, const std::vector<std::span<const float>>& grads,
                                  int64_t step, int64_t done_step) {
  PushResult result;
  start_push(names, grads, step, &result, done_step);
  return result;
}

std::future<PushResult> Client::push_and_step_async(std::vector<std::string> names,
                                                    std::vector<std::span<const float>> grads, int64_t step,
                                                    int64_t done_step) {
  return start_push(std::move(names), std::move(grads), step, nullptr, done_step);
}

std::future<PushResult> Client::start_push(std::vector<std::string> names, std::vector<std::span<const float>> grads,
                                           int64_t step, PushResult* done, int64_t done_step) {
  if (names.size() != grads.size()) throw ConfigError("push: " + std::to_string(names.size()) + " names but " +
                                                      std::to_string(grads.size()) + " gradients");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const uint64_t n = impl_->tensor_elements(names[i]);
    if (grads[i].size() != n) {
      throw RequestError("push: gradient for '" + names[i] + "' has " + std::to_string(grads[i].size()) +
                         " floats, tensor has " + std::to_string(n));
    }
  }
  auto batches = impl_->plan(names);
  return impl_->run<PushResult>(
      [this, batches = std::move(batches), grads = std::move(grads), n = names.size(), step, done_step]() mutable {
        auto result = kj::heap<PushResult>();
        result->status.assign(n, PushStatus::kApplied);
        result->step = std::numeric_limits<int64_t>::max();
        kj::Vector<kj::Promise<void>> calls;
        auto shared_grads = std::make_shared<const std::vector<std::span<const float>>>(std::move(grads));
        struct BatchReply {
          std::vector<PushStatus> status;
          int64_t step = 0;
          bool stop = false;
        };
        // The step report rides on the first message to each shard; shards
        // that get no gradient get a stepDone of their own.
        std::vector<bool> reported(impl_->shards.size(), done_step < 0);
        for (auto& b : batches) {
          // One id per message, kept across retries: the shard applies it once.
          const uint64_t id = impl_->new_request_id();
          auto batch = std::make_shared<const ShardBatch>(std::move(b));
          const int64_t reports = reported[batch->shard] ? -1 : done_step;
          reported[batch->shard] = true;
          auto send = [this, batch, shared_grads, step, id, reports](ShardConnection& c, int attempt) -> kj::Promise<BatchReply> {
            if (attempt > 0 && c.rolled_back && impl_->job_mode.load() == SyncMode::kSync && step > c.hello_step) {
              // The shard restarted from a step before this gradient's: it
              // was computed from parameters the shard no longer has.
              return BatchReply{std::vector<PushStatus>(batch->parts.size(), PushStatus::kStale), c.hello_step};
            }
            auto req = c.shard.pushRequest();
            req.setStep(step);
            req.setRequestId(id);
            req.setDoneStep(reports);
            auto list = req.initGrads(static_cast<unsigned>(batch->parts.size()));
            auto orphanage = capnp::Orphanage::getForMessageContaining(static_cast<wire::Shard::PushParams::Builder>(req));
            for (unsigned i = 0; i < batch->parts.size(); ++i) {
              const PartRef& ref = batch->parts[i];
              list[i].setName(ref.part.stored_name);
              auto bytes = as_data((*shared_grads)[ref.tensor].subspan(ref.part.offset, ref.part.count));
              if (reinterpret_cast<uintptr_t>(bytes.begin()) % sizeof(capnp::word) == 0 &&
                  bytes.size() % sizeof(capnp::word) == 0) {
                // The gradient goes out straight from the caller's buffer: no copy.
                list[i].adoptValues(orphanage.referenceExternalData(bytes));
              } else {
                // External data is sent in whole words: a buffer not a
                // multiple of 8 bytes (or not aligned) would be read past
                // its end (found by AddressSanitizer). Copy those.
                list[i].setValues(bytes);
              }
            }
            return req.send().then([&c](capnp::Response<wire::Shard::PushResults>&& reply) {
              BatchReply r;
              for (auto st : reply.getStatus()) r.status.push_back(from_wire(st));
              r.step = reply.getStep();
              r.stop = reply.getStop();
              c.last_step = std::max(c.last_step, r.step);
              return r;
            });
          };
          calls.add(impl_->retry->call(batch->shard, kj::mv(send)).then([batch, reports, res = result.get()](BatchReply&& reply) {
            if (reports >= 0) {
              if (batch->shard == 0) res->global_step = reply.step;
              res->stop = res->stop || reply.stop;
            }
            for (unsigned i = 0; i < reply.status.size() && i < batch->parts.size(); ++i) {
              auto& slot = res->status[batch->parts[i].tensor];
              slot = std::max(slot, reply.status[i]);
            }
            res->step = std::min(res->step, reply.step);
          }));
        }
        for (std::size_t shard = 0; shard < reported.size(); ++shard) {
          if (reported[shard]) continue;
          auto send = [done_step](ShardConnection& c, int) {
            auto req = c.shard.stepDoneRequest();
            req.setStep(done_step);
            return req.send();
          };
          calls.add(impl_->retry->call(static_cast<int>(shard), kj::mv(send))
                        .then([shard, res = result.get()](capnp::Response<wire::Shard::StepDoneResults>&& reply) {
            if (shard == 0) res->global_step = reply.getGlobalStep();
            res->stop = res->stop || reply.getStop();
          }));
        }
        return kj::joinPromises(calls.releaseAsArray()).then([result = kj::mv(result)]() mutable {
          if (result->step == std::numeric_limits<int64_t>::max()) result->step = 0;
          return std::move(*result);
        });
      },
      "push: ", done);
}

PushResult Client::push(const std::vector<std::string>& names, const std::vector<std::span<const float>>& grads,
                        int64_t step) {
  PushResult result;
  start_push(names, grads, step, &result);
  return result;
}

PushStatus Client::push(const std::string& name, std::span<const float> grad) {
  return push(std::vector<std::string>{name}, std::vector<std::span<const float>>{grad}).status.at(0);
}

std::vector<TensorInfo> Client::list() {
  struct Collected {
    std::vector<std::pair<int, TensorInfo>> items;
  };
  auto collected = impl_->on_every_shard<Collected>(
                            [](ShardConnection& s) { return s.shard.listRequest().send(); },
                            [](Collected& out, int shard, capnp::Response<wire::Shard::ListResults>& reply) {
                              for (auto t : reply.getTensors()) {
                                TensorInfo info;
                                info.name = t.hasPart() ? t.getPart().getFullName() : t.getName();
                                info.shape = shape_from_wire(t.hasPart() ? t.getPart().getFullShape() : t.getShape());
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
    if (std::find(it->second.shards.begin(), it->second.shards.end(), shard) == it->second.shards.end()) {
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
  auto collected = impl_->on_every_shard<Collected>(
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
                              for (auto w : st.getWorkers()) {
                                o.workers.push_back({w.getWorkerIndex(), w.getStep(), w.getConnected(), w.getPushes(),
                                                     w.getStale()});
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
  impl_->on_every_shard<Nothing>(
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
  impl_->on_every_shard<Nothing>([](ShardConnection& s) { return s.shard.setReadyRequest().send(); },
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
          "waitReady: ")
      .get()
      .all;
}

std::future<Client::StepDone> Client::step_done_async(int64_t local_step) {
  return impl_->on_every_shard<StepDone>(
      [local_step](ShardConnection& s) {
        auto req = s.shard.stepDoneRequest();
        req.setStep(local_step);
        return req.send();
      },
      [](StepDone& d, int shard, capnp::Response<wire::Shard::StepDoneResults>& reply) {
        if (shard == 0) d.global_step = reply.getGlobalStep();  // shard 0 holds the job's step, as TF's ps 0
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

uint32_t Client::barrier(const std::string& name, uint32_t count, std::chrono::milliseconds timeout) {
  struct Arrived {
    uint32_t n = 0;
  };
  const auto ms = static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, 3'600'000));
  return impl_
      ->submit<Arrived>(
          [this, name, count, ms] {
            return impl_->retry->call(0, [name, count, ms](ShardConnection& c, int) {
              auto req = c.shard.barrierRequest();
              req.setName(name);
              req.setCount(count);
              req.setTimeoutMs(ms);
              return req.send();
            }).then([](capnp::Response<wire::Shard::BarrierResults>&& r) { return Arrived{r.getArrived()}; });
          },
          "barrier: ")
      .get()
      .n;
}

void Client::finish() {
  impl_->on_every_shard<Nothing>([](ShardConnection& s) { return s.shard.finishRequest().send(); },
                                 [](Nothing&, int, auto&) {}, "finish: ")
      .get();
}

void Client::report(int64_t step, float loss, float accuracy, float samples_per_sec, float learning_rate) {
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
      impl_->tasks->add(impl_->loop.kept(req.send().ignoreResult().catch_([address = s->address](kj::Exception&& e) {
        spdlog::warn("report to {} failed: {}", address, e.getDescription().cStr());
      })));
    }
  });
}

}  // namespace ps
