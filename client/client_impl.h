// libpsclient's Client internals, shared by client.cc (connection, job
// coordination, listing) and client_transfer.cc (pull and push): the
// connections, placement and call plumbing that every request goes through.
// One header: these pieces are one object's state, which every client_*.cc
// file reads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/net/client_loop.h"
#include "common/net/connection_control.h"
#include "common/finite.h"
#include "common/for_people.h"
#include "ps/client.h"
#include "common/random_bits.h"
#include "client/reconnector.h"
#include "client/request_plan.h"
#include "client/row_plan.h"
#include "client/shard_connection.h"
#include "client/unanswered.h"
#include "common/wire_convert.h"

namespace ps {

// Room left in each message for everything that is not tensor data.
constexpr uint64_t kMessageSlack = 256u << 10;

inline std::string strip_prefix(std::string s, std::string_view prefix) {
  if (s.rfind(prefix, 0) == 0) s.erase(0, prefix.size());
  return s;
}

// A kj::Exception from the loop as the ps::Error a user should see.
inline std::exception_ptr translate(const kj::Exception& e, const std::string& context) {
  std::string msg = e.getDescription().cStr();
  msg = strip_prefix(msg, "remote exception: ");
  msg = strip_prefix(msg, "std::exception: ");
  // psd's messages name their request already ("initJob: initJob: ..." before).
  msg = strip_prefix(msg, context);
  if (e.getType() == kj::Exception::Type::DISCONNECTED ||
      e.getType() == kj::Exception::Type::OVERLOADED) {
    return std::make_exception_ptr(ConnectionError(context + msg));
  }
  return std::make_exception_ptr(RequestError(context + msg));
}

// A part this large or larger goes through shared memory when its
// connection has some (and a block is free); smaller ones ride in the message.
constexpr uint64_t kMinSharedBytes = 16u << 10;

inline std::optional<uint64_t> take_shared(SharedBlocks& blocks, uint64_t bytes) {
  if (bytes < kMinSharedBytes) return std::nullopt;
  return blocks.take(bytes);
}

inline void set_slice(wire::SharedSlice::Builder slice, const SharedArena& arena, uint64_t offset,
                      uint64_t bytes) {
  slice.setRegion(arena.id());
  slice.setOffset(offset);
  slice.setBytes(bytes);
}

// `call`, telling `watch` (any type with `answered()`) once psd has
// answered, whatever the answer, and holding it until then. A call given up
// before (a timeout, the Client closing) destroys `watch` unanswered.
template <typename T, typename Watch>
kj::Promise<T> tell_when_answered(kj::Promise<T> call, kj::Own<Watch> watch) {
  Watch* w = watch.get();
  return call
      .then(
          [w](T&& reply) {
            w->answered();
            return kj::mv(reply);
          },
          [w](kj::Exception&& e) -> T {
            w->answered();
            kj::throwFatalException(kj::mv(e));
          })
      .attach(kj::mv(watch));
}

// `call`, holding `blocks` until it settles. psd is done with them once it
// has answered; a call given up before leaves them out of use
// (shared_arena.h).
template <typename T>
kj::Promise<T> until_answered(kj::Promise<T> call, kj::Own<SharedBlocks> blocks) {
  if (!blocks || blocks->empty()) return call;
  return tell_when_answered(kj::mv(call), kj::mv(blocks));
}

// `call` to shard `index`, counted in `unanswered` (if given) until psd
// answers it or it is given up. Evaluated eagerly: kj runs a continuation
// only when its result is asked for, and a join asks once every branch is
// in, which would leave a shard that answered early counted until then.
template <typename T>
kj::Promise<T> counted(Unanswered* unanswered, int index, kj::Promise<T> call) {
  if (unanswered == nullptr) return call;
  return tell_when_answered(kj::mv(call), kj::heap<Unanswered::Mark>(*unanswered, index))
      .eagerlyEvaluate(nullptr);
}

// A request that goes out from the caller's memory (a push's gradient,
// sent without a copy) and whose call is given up before psd answers
// (call_timeout, or the Client closing): its message may still be going
// out, or waiting its turn, and the caller, once it has its error, may
// reuse or free that memory. The connection is cut then
// (ConnectionControl::abort): the rest is never sent, psd drops the
// truncated message, and the next call reconnects.
template <typename T>
kj::Promise<T> cut_if_abandoned(kj::Promise<T> call, ConnectionControl::Weak connection) {
  struct Guard {
    explicit Guard(ConnectionControl::Weak c) : connection(std::move(c)) {}
    Guard(const Guard&) = delete;
    ~Guard() {
      if (!was_answered) connection.abort();
    }
    void answered() { was_answered = true; }
    ConnectionControl::Weak connection;
    bool was_answered = false;
  };
  return tell_when_answered(kj::mv(call), kj::heap<Guard>(std::move(connection)));
}

inline PushStatus from_wire(wire::PushStatus s) {
  switch (s) {
    case wire::PushStatus::APPLIED:
      return PushStatus::kApplied;
    case wire::PushStatus::ACCUMULATED:
      return PushStatus::kAccumulated;
    case wire::PushStatus::STALE:
      return PushStatus::kStale;
    case wire::PushStatus::DUPLICATE:
      return PushStatus::kDuplicate;
  }
  return PushStatus::kStale;
}

// A reply is checked against what was asked before any of it is used as a
// size, a count or a step: a psd of another version, a broken one or
// anything else listening on its port must fail the call with what was
// wrong, never make the client read or write out of bounds or report what
// psd never did. The messages name the shard as "shard 0 (host:port)".
inline std::string shard_name(int index, const std::string& address) {
  return "shard " + std::to_string(index) + " (" + address + ")";
}
inline std::string shard_name(const ShardConnection& c) { return shard_name(c.index, c.address); }

// A step in a reply: psd's global steps are in [0, 2^62] (ps/job.h).
inline int64_t reply_step(const ShardConnection& c, int64_t step) {
  if (!step_in_range(step)) {
    throw RequestError(shard_name(c) + " replied step " + std::to_string(step) +
                       ", outside [0, 2^62]");
  }
  return step;
}

// Reports local step `step` done to the shard (stepDone with request id
// `id`); the reply's global step is checked.
inline kj::Promise<capnp::Response<wire::Shard::StepDoneResults>> send_step_done(ShardConnection& c,
                                                                                 int64_t step,
                                                                                 uint64_t id) {
  auto req = c.shard.stepDoneRequest();
  req.setStep(step);
  req.setRequestId(id);
  return req.send().then([&c](capnp::Response<wire::Shard::StepDoneResults>&& reply) {
    reply_step(c, reply.getGlobalStep());
    return kj::mv(reply);
  });
}

// A list of structs in a reply, whose elements psd always sends with their
// fields: a list pointer of a few bytes can claim up to 2^29 elements of no
// size, which Cap'n Proto reads as defaults and a client copying them out
// would turn into gigabytes. Each element must take a word of the message.
template <typename List>
void check_reply_list(const std::string& shard, const char* what, List list) {
  if (list.size() > 0 && list.totalSize().wordCount < list.size()) {
    throw RequestError(shard + " replied a list of " + std::to_string(list.size()) + " " + what +
                       " that takes " + std::to_string(list.totalSize().wordCount) +
                       " words of its message (each takes at least one)");
  }
}

struct Client::Impl : kj::TaskSet::ErrorHandler {
  explicit Impl(ClientOptions o)
      : options(std::move(o)),
        placement(std::max<int>(1, static_cast<int>(options.ps_hosts.size())), options.placement,
                  options.chunk_bytes, options.part_bytes),
        loop(options.busy_poll) {}

  // ClientOptions::tls_ca (made by the Client's constructor); null: plain TCP.
  std::shared_ptr<TlsClient> tls;

  ~Impl() {
    loop.run([this] {
      tasks = nullptr;
      retry = nullptr;
      shards.clear();
    });
  }

  void taskFailed(kj::Exception&& e) override {
    spdlog::error("libpsclient internal task failed: {}", e.getDescription().cStr());
  }

  // Starts op() with the loop; its result or error reaches the future (the
  // helper thread runs the loop until then). `waits`: how long psd may
  // rightly hold the call (waitReady, barrier), on top of call_timeout.
  template <typename T, typename Op>
  std::future<T> submit(Op op, std::string context, std::chrono::milliseconds waits = {}) {
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
      promise = with_timeout(kj::mv(promise), waits);
      auto settle = kj::heap<Settle<T>>(result, context);
      Settle<T>* s = settle.get();
      tasks->add(loop.kept(kj::mv(promise))
                     .then([s](T&& value) { s->value(std::move(value)); },
                           [s](kj::Exception&& e) { s->error(translate(e, s->context)); })
                     .attach(kj::mv(settle)));
    });
    return future;
  }

  // A future's promise, settled whatever becomes of its call: one the
  // Client drops unanswered (destroyed with the call in flight) gets a
  // ConnectionError, not std::future_error's "Broken promise".
  template <typename T>
  struct Settle {
    Settle(std::shared_ptr<std::promise<T>> r, std::string c)
        : result(std::move(r)), context(std::move(c)) {}
    Settle(const Settle&) = delete;
    ~Settle() {
      if (!settled)
        error(std::make_exception_ptr(
            ConnectionError(context + "the Client was destroyed with this call in flight")));
    }
    void value(T&& v) {
      settled = true;
      result->set_value(std::move(v));
    }
    void error(std::exception_ptr e) {
      settled = true;
      result->set_exception(std::move(e));
    }
    std::shared_ptr<std::promise<T>> result;
    std::string context;
    bool settled = false;
  };

  // Runs op(&unanswered) with the loop and waits for its result: on the
  // calling thread when no other thread runs the loop (client_loop.h). op
  // counts each request it sends in `unanswered` (counted()): a call with
  // no answer for 5 s says whom it waits for (unanswered.h).
  // options.interrupted, if set, is asked every 100 ms on this thread;
  // true gives the call up as call_timeout does (its promise destroyed:
  // nothing more is written into a pull's buffers nor read from a push's)
  // and throws InterruptedError.
  // `waits`: how long psd may rightly hold the call (waitReady, barrier):
  // added to call_timeout, and no line is said before it has passed.
  template <typename T, typename Op>
  T call(Op op, const std::string& context, std::chrono::milliseconds waits = {}) {
    std::exception_ptr error;
    std::optional<T> value;
    Unanswered unanswered;  // the loop's
    const bool say = !QuietWaitLines::active();  // this thread's, read before the loop runs work
    auto work = [&]() -> kj::Promise<void> {
      kj::Promise<T> promise = nullptr;
      try {
        promise = op(&unanswered);
      } catch (...) {
        error = std::current_exception();
        return kj::READY_NOW;
      }
      // One timer for the call: its wait lines and call_timeout.
      const auto limit = options.call_timeout.count() > 0 ? options.call_timeout + waits
                                                          : std::chrono::milliseconds(0);
      return promise
          .exclusiveJoin(watch_call(loop, unanswered, context, limit, options.ps_hosts, clock_now(),
                                    waits.count() * kj::MILLISECONDS, say)
                             .then([]() -> T { KJ_UNREACHABLE; }))
          .then([&](T&& v) { value.emplace(std::move(v)); },
                [&](kj::Exception&& e) { error = translate(e, context); });
    };
    bool answered = true;
    std::exception_ptr stop_error;  // thrown by options.interrupted
    auto stop = [&]() noexcept {
      try {
        return options.interrupted();
      } catch (...) {
        stop_error = std::current_exception();
        return true;
      }
    };
    try {
      if (options.interrupted) {
        answered = loop.run_interruptible(work, stop, kAskInterruptedEvery.count() * kj::MILLISECONDS);
      } else {
        loop.run(work);
      }
    } catch (const kj::Exception& e) {
      error = translate(e, context);
    }
    if (stop_error) std::rethrow_exception(stop_error);
    if (!answered) {
      throw InterruptedError(context +
                             "interrupted while waiting for psd's answer; the call was given up");
    }
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }

  // How often a blocking call asks options.interrupted.
  static constexpr std::chrono::milliseconds kAskInterruptedEvery{100};

  // Blocking (`done` given): the result goes to *done and the future is
  // empty. Otherwise a future.
  // op(Unanswered*) as call() takes it; an async call passes nullptr.
  template <typename T, typename Op>
  std::future<T> run(Op op, std::string context, T* done) {
    if (done == nullptr) {
      return submit<T>([op = std::move(op)]() mutable { return op(nullptr); }, std::move(context));
    }
    *done = call<T>(std::move(op), context);
    return {};
  }

  template <typename T>
  kj::Promise<T> with_timeout(kj::Promise<T> p, std::chrono::milliseconds waits = {}) {
    if (options.call_timeout.count() <= 0) return p;
    const auto limit = options.call_timeout + waits;
    return p.exclusiveJoin(loop.after(limit.count() * kj::MILLISECONDS)
                               .then([limit]() -> kj::Promise<T> { return call_timeout_error(limit); }));
  }

  // Sends one request to every shard (make(shard) builds and sends it) and
  // folds the replies with on_reply(acc, shard index, reply) into a T; each
  // request counted in `unanswered` (null: not counted) until answered.
  template <typename T, typename Make, typename OnReply>
  kj::Promise<T> to_every_shard(Make make, OnReply on_reply, Unanswered* unanswered) {
    auto acc = kj::heap<T>();
    kj::Vector<kj::Promise<void>> calls;
    for (auto& s : shards) {
      calls.add(
          counted(unanswered, s->index, retry->call(s->index, [make](ShardConnection& c, int) {
            return make(c);
          })).then([index = s->index, on_reply, acc = acc.get()](auto&& reply) mutable {
            on_reply(*acc, index, reply);
          }));
    }
    return kj::joinPromises(calls.releaseAsArray()).then([acc = kj::mv(acc)]() mutable {
      return std::move(*acc);
    });
  }

  // to_every_shard, async: a future.
  template <typename T, typename Make, typename OnReply>
  std::future<T> on_every_shard(Make make, OnReply on_reply, std::string context,
                                std::chrono::milliseconds waits = {}) {
    return submit<T>([this, make, on_reply] { return to_every_shard<T>(make, on_reply, nullptr); },
                     std::move(context), waits);
  }

  // to_every_shard, blocking (call()): after 5 s with no answer (past
  // `waits`) it says which shards it waits for, and Ctrl-C gives it up.
  template <typename T, typename Make, typename OnReply>
  T every_shard(Make make, OnReply on_reply, const std::string& context,
                std::chrono::milliseconds waits = {}) {
    return call<T>(
        [this, make, on_reply](Unanswered* unanswered) {
          return to_every_shard<T>(make, on_reply, unanswered);
        },
        context, waits);
  }

  // `copies`: as plan_batches takes them (empty: one array per part).
  std::vector<ShardBatch> plan(const std::vector<std::string>& names,
                               const std::vector<uint32_t>& copies = {}) {
    std::lock_guard lock(placement_mutex);
    return plan_batches(placement, names, max_batch_bytes, copies);
  }

  // shard_name of shard `index` as configured.
  std::string shard_name_at(int index) const {
    return shard_name(index, options.ps_hosts[static_cast<std::size_t>(index)]);
  }

  uint64_t tensor_elements(const std::string& name) {
    std::lock_guard lock(placement_mutex);
    return placement.at(name).spec.num_elements();
  }

  // What every push of tensors checks before anything is sent (`what` names
  // the call in the messages). A step report (done_step >= 0) rides on one
  // message per shard: psd refusing it would refuse that message alone and
  // apply the others, so a refused call would still change values.
  void check_push(const char* what, const std::vector<std::string>& names,
                  const std::vector<std::span<const float>>& grads, int64_t done_step) {
    if (names.size() != grads.size()) {
      throw ConfigError(std::string(what) + ": " + std::to_string(names.size()) + " names but " +
                        std::to_string(grads.size()) + " gradients");
    }
    if (done_step >= 0 && options.worker_index < 0) {
      throw ConfigError(
          "push_and_step: only workers report steps: set ClientOptions::worker_index (nothing was "
          "sent)");
    }
    if (done_step >= 0 && !step_in_range(done_step)) {
      throw RequestError("push_and_step: doneStep " + std::to_string(done_step) +
                         " is out of range [0, 2^62] (nothing was sent)");
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      const uint64_t n = tensor_elements(names[i]);
      if (grads[i].size() != n) {
        throw RequestError(std::string(what) + ": gradient for '" + names[i] + "' has " +
                           std::to_string(grads[i].size()) + " floats, tensor has " +
                           std::to_string(n) + " (nothing was sent)");
      }
    }
  }

  void connect() {
    if (options.ps_hosts.empty())
      throw ConfigError("no ps hosts given (ClientOptions::ps_hosts / --ps_hosts)");
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
            auto p = connect_shard(loop.port(), static_cast<int>(i), options.ps_hosts[i],
                                   options.connect_timeout, hello_params());
            all.add(p.then([this, i](kj::Own<ShardConnection> c) { shards[i] = kj::mv(c); },
                           [e = errors.get()](kj::Exception&& ex) {
                             e->push_back(ex.getDescription().cStr());
                           }));
          }
          return kj::joinPromises(all.releaseAsArray()).then([errors = kj::mv(errors)]() mutable {
            return Outcome{std::move(*errors)};
          });
        },
        "");
    // connect_shard has its own deadline; the call timeout must not cut it short.
    // options.interrupted is asked meanwhile, as a blocking call asks it: a
    // long connect_timeout (a cluster starting) is no wait Ctrl-C cannot end.
    if (options.interrupted) {
      while (outcome.wait_for(kAskInterruptedEvery) != std::future_status::ready) {
        if (options.interrupted()) {
          // ~Impl drops the attempts under way (the loop's tasks).
          throw InterruptedError("connecting to the ps shards: interrupted; nothing is connected");
        }
      }
    }
    Outcome o = outcome.get();
    loop.run([this] {
      retry = kj::heap<Reconnector>(loop.port(), shards, hello_params(), options.reconnect_timeout);
    });
    if (!o.errors.empty()) {
      std::string msg = "could not connect to " + std::to_string(o.errors.size()) + " of " +
                        std::to_string(options.ps_hosts.size()) + " ps shards: ";
      for (std::size_t i = 0; i < o.errors.size(); ++i)
        msg += (i ? "; " : "") + for_people(o.errors[i]);
      throw ConnectionError(msg);
    }
    check_shard_order();
    {
      std::lock_guard lock(job_mutex);
      job = shards[0]->job;
      job_mode = job.mode;
    }
    for (auto& s : shards) recorded_step = std::max(recorded_step, s->worker_step);
    uint64_t smallest = std::numeric_limits<uint64_t>::max();
    for (auto& s : shards) smallest = std::min(smallest, s->max_message_bytes);
    if (smallest <= kMessageSlack + sizeof(float))
      throw ConfigError("psd's message size limit is too small");
    const uint64_t part = std::min(options.part_bytes, options.chunk_bytes);
    max_payload_bytes = smallest - kMessageSlack;
    max_batch_bytes =
        std::min<uint64_t>(max_payload_bytes, std::max<uint64_t>(options.max_request_bytes, part));
    if (part > max_batch_bytes) {
      throw ConfigError("part size " + std::to_string(part) +
                        " bytes exceeds what psd accepts in one message (" +
                        std::to_string(max_batch_bytes) +
                        "); lower ClientOptions::part_bytes or raise psd --max_message_mb");
    }
  }

  // See shard_order_problem (shard_connection.h).
  void check_shard_order() const {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string problem = shard_order_problem(*shards[i], i, shards.size());
      if (!problem.empty()) throw ConfigError(problem);
    }
  }

  HelloParams hello_params() const {
    return {options.worker_index,       client_id,
            options.is_chief,           options.auth_token,
            options.prefer_unix_socket, options.shared_memory_bytes,
            options.dead_peer_timeout,  tls,
            options.tls_server_name};
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
    std::vector<std::vector<bool>> from_shared;  // per batch and part: came through shared memory
    // Client::rollbacks() when the pull was asked for: a shard found rolled
    // back after it is read at the step it has (min_step predates that news).
    uint64_t rollbacks_at_call = 0;
    Unanswered* unanswered = nullptr;  // a blocking call's (call()); null: not counted
    // Part of a pull_with_rows: its steps are aligned with the tables' by
    // align_steps, which alone sees every read (a restarted shard is caught
    // up only when every read of the call finds it at the newest step).
    bool aligned_by_caller = false;
  };

  // Pulls the given batches (waiting for min_step). In sync mode all parts
  // must come from one global step: batches read at an older step than the
  // newest are read again at that step, so a worker never trains on a mix
  // (but for a shard that came back from a checkpoint behind the others).
  // In client_transfer.cc, next to push's round.
  kj::Promise<void> pull_round(PullState& st, std::vector<std::size_t> which, int64_t min_step,
                               int round);

  uint64_t rollbacks_now() const { return retry ? retry->rollbacks() : 0; }

  // A restarted shard is read at the step it has (catching_up) until a sync
  // read of every shard finds it at the newest step among them; from then on
  // it is read at one step with the others. `reads`: (shard, step) per request.
  void note_caught_up(const std::vector<std::pair<uint32_t, int64_t>>& reads) {
    std::vector<int64_t> lowest(shards.size(), std::numeric_limits<int64_t>::max());
    int64_t newest = std::numeric_limits<int64_t>::min();
    for (const auto& [shard, step] : reads) {
      lowest[shard] = std::min(lowest[shard], step);
      newest = std::max(newest, step);
    }
    for (int64_t s : lowest)
      if (s == std::numeric_limits<int64_t>::max()) return;  // a shard not read
    for (std::size_t i = 0; i < shards.size(); ++i)
      if (lowest[i] >= newest) shards[i]->catching_up = false;
  }

  // One pull_rows call, and its requests `which` sent waiting for min_step;
  // in sync mode read again until every shard's rows come from one step, as
  // pull_round does. In client_tables.cc.
  // Each reply's rows go straight to their first position in `out` (the
  // caller's buffer, ids.size() * dim floats); fill_repeats copies repeated
  // ids from there once every request is answered. steps[k]: request k's step.
  struct RowPull {
    std::shared_ptr<const RowPlan> plan;
    std::string table;
    uint32_t dim = 0;
    float* out = nullptr;
    std::vector<int64_t> steps;
    uint64_t rollbacks_at_call = 0;  // as PullState's
    Unanswered* unanswered = nullptr;  // as PullState's
    bool aligned_by_caller = false;    // as PullState's
    bool lookup = false;               // lookup_rows: psd creates no row
  };
  kj::Promise<void> pull_row_requests(std::shared_ptr<RowPull> st, std::vector<std::size_t> which,
                                      int64_t min_step, int round);

  // Sends one pushRows request `req` on `c` with request r's gradients
  // from `g`: written straight into the connection's shared memory when it
  // has some and they are large enough, else referenced from where they lie
  // without a copy (the stream holds them until written), else copied into
  // the message. Rows that lie in the caller's own buffer
  // (PushGradients::in_callers_buffer) cut the connection if the call is
  // given up before psd answers (cut_if_abandoned), as a dense push from
  // the caller's buffer does. In client_tables.cc.
  static kj::Promise<capnp::Response<wire::Shard::PushRowsResults>> send_row_grads(
      capnp::Request<wire::Shard::PushRowsParams, wire::Shard::PushRowsResults> req,
      ShardConnection& c, std::shared_ptr<PushGradients> g, const RowRequest& r);

  // pull_with_rows' last rounds (client_step.cc): in sync mode, tensors and
  // rows read before the newest step any of them was read at are read again
  // at it (but on shards restarted behind), as pull_round does for tensors.
  kj::Promise<void> align_steps(PullState& dense, std::vector<std::shared_ptr<RowPull>> tables,
                                int round);

  // Pushes the batches of `tensors` gradients (`grads` must stay valid until
  // the promise settles); done_step >= 0 reports that step to every shard.
  // Its requests are counted in `unanswered` (if given). In
  // client_transfer.cc, next to pull's round.
  kj::Promise<PushResult> push_round(std::vector<ShardBatch> batches,
                                     std::vector<std::span<const float>> grads, std::size_t tensors,
                                     int64_t step, int64_t done_step, Unanswered* unanswered);

  // How many gradients psd sums per step before it divides (sync mode's
  // replicas_to_aggregate; 1 otherwise): it bounds the values it accepts.
  // Known from initJob's or waitReady's reply, which a sync push needs first.
  uint32_t summed_per_step() {
    std::lock_guard lock(job_mutex);
    return gradients_summed_per_step(job);
  }

  void learn_job(wire::JobConfig::Reader job) {
    JobConfig c = job_from_wire(job);
    std::lock_guard lock(job_mutex);
    this->job = c;
    job_mode = c.mode;
  }

  ClientOptions options;
  std::atomic<uint64_t> next_request_id{random_u64() << 8 | 1};
  const uint64_t client_id = random_u64() | 1;  // never 0 (0: no id)
  std::mutex job_mutex;
  JobConfig job;
  std::atomic<SyncMode> job_mode{SyncMode::kAsync};
  std::mutex placement_mutex;
  Placement placement;
  std::map<std::string, TableSpec> tables;  // embedding tables declared (under placement_mutex)
  uint64_t max_batch_bytes = 64u << 20;
  uint64_t max_payload_bytes = 64u << 20;  // the most a request may carry to every shard
  int64_t recorded_step = -1;              // Client::recorded_step(), from the first hellos
  ClientLoop loop;
  // Loop-thread state.
  std::vector<kj::Own<ShardConnection>> shards;
  kj::Own<Reconnector> retry;
  kj::Own<kj::TaskSet> tasks;
};

}  // namespace ps
