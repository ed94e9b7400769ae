// One file for the one Cap'n Proto interface psd serves: every method goes
// through the same guard, hello check and logging helpers at its top.
#include "server/shard_service.h"

#include <cstring>

#include <spdlog/spdlog.h>

#include "server/checkpointer.h"
#include "server/embedding/row_buffers.h"
#include "server/shard_wire.h"
#include "common/tensor_name.h"
#include "ps/errors.h"
#include "common/wire_convert.h"

namespace ps {
namespace {

// A pull's reply in its call's results.
class ContextPullReply final : public WirePullReply {
 public:
  using Context = capnp::CallContext<wire::Shard::PullParams, wire::Shard::PullResults>;
  ContextPullReply(Context context, uint64_t tag, ConnectionControl* connection)
      : WirePullReply(tag, connection), context_(kj::mv(context)) {}

 private:
  wire::Shard::PullResults::Builder results(capnp::MessageSize size) override {
    return context_.getResults(size);
  }
  Context context_;
};

}  // namespace

ShardServiceImpl::ShardServiceImpl(Shard& shard, std::string peer, std::string refusal,
                                   ConnectionControl* connection, pid_t peer_pid,
                                   ConnectionRules rules)
    : shard_(shard),
      shard_alive_(shard.lifetime()),
      connection_(connection),
      refusal_(std::move(refusal)),
      rules_(std::move(rules)) {
  caller_.peer = std::move(peer);
  caller_.peer_pid = peer_pid;
  if (refusal_.empty()) ++shard_.counters().connections;
  if (connection != nullptr && refusal_.empty() && rules_.hello_deadline > 0 * kj::SECONDS) {
    hello_deadline_ =
        shard_.job()
            .timer()
            .afterDelay(rules_.hello_deadline)
            .then([this] {
              if (said_hello_) return;
              std::string note;
              if (may_log("no hello", &note)) {
                spdlog::info(
                    "closing the connection from {}: no hello within {:g} s{}", caller_.peer,
                    static_cast<double>(rules_.hello_deadline / kj::MILLISECONDS) / 1000, note);
              }
              connection_->abort();
            })
            .eagerlyEvaluate(nullptr);
  }
}

bool ShardServiceImpl::may_log(const char* kind, std::string* note) {
  uint64_t suppressed = 0;
  if (rules_.log != nullptr && !rules_.log->allow(caller_.peer, kind, &suppressed)) return false;
  *note = LogLimiter::note(suppressed);
  return true;
}

void ShardServiceImpl::note_refused(const char* what, const char* message) {
  ++shard_.counters().rejected;
  std::string note;
  if (may_log("refused", &note))
    spdlog::info("refused {} from {}: {}{}", what, caller_.peer, message, note);
  if (rules_.max_refused_in_a_row > 0 && ++refused_in_a_row_ == rules_.max_refused_in_a_row &&
      connection_ != nullptr) {
    if (may_log("cut off", &note)) {
      spdlog::warn("closing the connection from {}: {} calls refused in a row{}", caller_.peer,
                   refused_in_a_row_, note);
    }
    connection_->abort();
  }
}

ShardServiceImpl::~ShardServiceImpl() {
  if (shard_alive_.expired()) return;  // psd is exiting: its Shard is gone
  if (refusal_.empty()) --shard_.counters().connections;
  if (said_hello_) {
    if (caller_.worker_index >= 0)
      spdlog::info("worker {} ({}) disconnected", caller_.worker_index, caller_.peer);
    shard_.goodbye(caller_);
  }
}

void ShardServiceImpl::require_hello(const char* what) const {
  if (!said_hello_) throw RequestError(std::string(what) + ": say hello first");
}

template <typename F>
kj::Promise<void> ShardServiceImpl::guarded(RequestKind kind, F&& handler) {
  ++shard_.counters().requests[static_cast<std::size_t>(kind)];
  const char* what = request_kind_name(kind);
  auto reject = [this, what](const char* message) {
    note_refused(what, message);
    return kj::Promise<void>(
        kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(message)));
  };
  try {
    if (!refusal_.empty()) throw RequestError(refusal_);
    // Nothing but hello before a successful hello: with --auth_token_file
    // that is what keeps an unauthenticated peer out.
    if (!said_hello_ && kind != RequestKind::kHello && kind != RequestKind::kProbe) {
      throw RequestError(std::string(what) + ": say hello first");
    }
    if (caller_.is_chief && (kind == RequestKind::kPush || kind == RequestKind::kPushRows ||
                             kind == RequestKind::kStepDone || kind == RequestKind::kBarrier ||
                             kind == RequestKind::kReport || kind == RequestKind::kFinish)) {
      shard_.job().chief_is_training();
    }
    return handler().then(
        [this]() -> kj::Promise<void> {
          refused_in_a_row_ = 0;
          return kj::READY_NOW;
        },
        [reject](kj::Exception&& e) -> kj::Promise<void> {
          return reject(e.getDescription().cStr());
        });
  } catch (const Error& e) {
    return reject(e.what());
  } catch (const kj::Exception& e) {
    // Malformed messages surface here (e.g. a pointer out of bounds).
    return reject(e.getDescription().cStr());
  }
}

kj::Promise<void> ShardServiceImpl::hello(HelloContext context) {
  // A malformed request fails in guarded(), which reports it.
  bool probe = false;
  (void)kj::runCatchingExceptions([&] { probe = context.getParams().getProbe(); });
  return guarded(probe ? RequestKind::kProbe : RequestKind::kHello, [&]() -> kj::Promise<void> {
    auto params = context.getParams();
    if (params.getProtocolVersion() != wire::K_PROTOCOL_VERSION) {
      throw RequestError("protocol version mismatch: client speaks " +
                         std::to_string(params.getProtocolVersion()) + ", this psd speaks " +
                         std::to_string(wire::K_PROTOCOL_VERSION) +
                         "; use a libpsclient and psd from the same release");
    }
    if (said_hello_) throw RequestError("hello: this connection already said hello");
    check_token(params.getAuthToken());
    if (probe) {
      info_to_wire(shard_, context.getResults().initInfo());
      spdlog::debug("{} asked where this psd is (probe)", caller_.peer);
      return kj::READY_NOW;
    }
    Caller caller = caller_;
    caller.worker_index = params.getWorkerIndex();
    caller.client_id = params.getClientId();
    caller.is_chief = params.getIsChief();
    shard_.job().check_worker(
        caller.worker_index);  // a bad index is refused before the place rules
    if (rules_.admit_hello) {
      try {
        rules_.admit_hello(caller);
      } catch (const RequestError&) {
        // No place for it: closed once the refusal has gone out, so that it
        // does not keep a place until the hello deadline.
        if (connection_ != nullptr) {
          hello_deadline_ = shard_.job()
                                .timer()
                                .afterDelay(200 * kj::MILLISECONDS)
                                .then([this] { connection_->abort(); })
                                .eagerlyEvaluate(nullptr);
        }
        throw;
      }
    }
    shard_.hello(caller);  // throws for a bad index or a second chief
    caller_ = caller;
    said_hello_ = true;
    if (rules_.on_hello) rules_.on_hello(caller_);
    auto info = context.getResults().initInfo();
    info_to_wire(shard_, info);
    info.setWorkerStep(shard_.job().recorded_step(caller_.worker_index));
    // Workers and the chief always; anonymous peers (who may be many) a few per interval.
    std::string note;
    if (caller_.worker_index >= 0 || caller_.is_chief || may_log("connected", &note)) {
      spdlog::info(
          "{} connected{}{}{}", caller_.peer,
          caller_.worker_index >= 0 ? fmt::format(" as worker {}", caller_.worker_index) : "",
          caller_.is_chief ? " (chief)" : "", note);
    }
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::create(CreateContext context) {
  return guarded(RequestKind::kCreate, [&]() -> kj::Promise<void> {
    const uint64_t limit = shard_.options().max_tensors_per_client;
    uint64_t fresh = 0;
    if (limit > 0) {
      for (auto spec : context.getParams().getSpecs()) {
        fresh += shard_.store().find(std::string(spec.getName().begin(), spec.getName().size())) ==
                 nullptr;
      }
      if (tensors_created_ + fresh > limit) {
        throw RequestError("create: this connection may create at most " + std::to_string(limit) +
                           " tensors (psd " + "--max_tensors_per_client); it created " +
                           std::to_string(tensors_created_) + " and asked for " +
                           std::to_string(fresh) + " more");
      }
    }
    const CreateRequest request = create_from_wire(context.getParams());
    CreateReply reply;
    shard_.check_sync_additions(caller_, request);
    shard_.create(request, reply);
    create_to_wire(request, reply, context.getResults());
    if (!request.validate_only) tensors_created_ += fresh;
    return kj::READY_NOW;
  });
}

// Calls that wait (a pull for a later step, waitReady, barrier, a
// checkpoint at a later step) end when their caller gives up or goes away:
// Cap'n Proto 0.9 otherwise keeps the call running, and with it this
// connection's service object, so psd would count a dead worker as
// connected until the wait ended by itself (a step that may never come, or
// up to an hour). Their waits and reads can stop at any point (ComputePool
// drops a task not yet started, waits for one running; a checkpoint already
// handed to the writer thread is still written). Pushes are never
// cancelled: one cut short between its tensors' updates would be half
// applied, and its retry answered as done.
kj::Promise<void> ShardServiceImpl::pull(PullContext context) {
  context.allowCancellation();
  return guarded(RequestKind::kPull, [&] {
    auto params = context.getParams();
    auto reply = kj::heap<ContextPullReply>(context, params.getTag(), connection_);
    return shard_.pull(caller_, pull_from_wire(params), *reply).attach(kj::mv(reply));
  });
}

kj::Promise<void> ShardServiceImpl::push(PushContext context) {
  return guarded(RequestKind::kPush, [&] {
    require_hello("push");
    auto reply = kj::heap<PushReply>();
    kj::Promise<void> applied = shard_.push(caller_, push_from_wire(context.getParams()), *reply);
    PushReply& r = *reply;
    return applied.then([context, &r]() mutable { push_to_wire(r, context.getResults()); })
        .attach(kj::mv(reply));
  });
}

kj::Promise<void> ShardServiceImpl::list(ListContext context) {
  return guarded(RequestKind::kList, [&]() -> kj::Promise<void> {
    auto all = shard_.list();
    auto out = context.getResults().initTensors(static_cast<unsigned>(all.size()));
    for (unsigned i = 0; i < all.size(); ++i) to_wire_meta(*all[i], false, out[i]);
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::stats(StatsContext context) {
  return guarded(RequestKind::kStats, [&]() -> kj::Promise<void> {
    stats_to_wire(shard_, context.getResults().initStats());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::initJob(InitJobContext context) {
  return guarded(RequestKind::kInitJob, [&]() -> kj::Promise<void> {
    require_hello("initJob");
    shard_.init_job(job_from_wire(context.getParams().getConfig()));
    info_to_wire(shard_, context.getResults().initInfo());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::setReady(SetReadyContext) {
  return guarded(RequestKind::kSetReady, [&]() -> kj::Promise<void> {
    require_hello("setReady");
    if (!caller_.is_chief) throw RequestError("setReady: only the chief marks the model ready");
    shard_.set_ready();
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::waitReady(WaitReadyContext context) {
  context.allowCancellation();  // see pull()
  return guarded(RequestKind::kWaitReady, [&]() -> kj::Promise<void> {
    const uint32_t ms = std::min<uint32_t>(context.getParams().getTimeoutMs(), 3'600'000);
    return shard_.job().wait_ready(ms * kj::MILLISECONDS).then([this, context](bool ready) mutable {
      auto r = context.getResults();
      r.setReady(ready);
      r.setStep(shard_.job().global_step());
      job_to_wire(shard_.job().config(), r.initJob());
    });
  });
}

kj::Promise<void> ShardServiceImpl::stepDone(StepDoneContext context) {
  return guarded(RequestKind::kStepDone, [&]() -> kj::Promise<void> {
    require_hello("stepDone");
    auto params = context.getParams();
    auto [step, stop] = shard_.step_done_request(caller_, params.getStep(), params.getRequestId());
    context.getResults().setGlobalStep(step);
    context.getResults().setStop(stop);
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::barrier(BarrierContext context) {
  context.allowCancellation();  // see pull()
  return guarded(RequestKind::kBarrier, [&]() -> kj::Promise<void> {
    auto p = context.getParams();
    const uint32_t ms = std::min<uint32_t>(p.getTimeoutMs(), 3'600'000);
    return shard_.job()
        .barrier(name_from_wire(p.getName(), "barrier"), p.getCount(), ms * kj::MILLISECONDS,
                 caller_.worker_index, p.getSkipLostWorkers())
        .then([context](uint32_t n) mutable { context.getResults().setArrived(n); });
  });
}

kj::Promise<void> ShardServiceImpl::finish(FinishContext) {
  return guarded(RequestKind::kFinish, [&]() -> kj::Promise<void> {
    require_hello("finish");
    // Ending the job makes every shard exit: only the job's chief decides
    // that (an operator stops one psd with SIGTERM).
    if (!caller_.is_chief) {
      const std::string as = caller_.worker_index >= 0
                                 ? "worker " + std::to_string(caller_.worker_index)
                                 : std::string("no worker");
      throw RequestError("finish: only the chief ends the job (this connection said hello as " +
                         as + ", not as the chief)");
    }
    shard_.job().finish();
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::report(ReportContext context) {
  return guarded(RequestKind::kReport, [&]() -> kj::Promise<void> {
    require_hello("report");
    auto params = context.getParams();
    // NaN loss kept: a diverging loss is worth seeing.
    shard_.report(caller_, WorkerReport{.step = params.getStep(),
                                        .loss = params.getLoss(),
                                        .accuracy = params.getAccuracy(),
                                        .samples_per_sec = params.getSamplesPerSec(),
                                        .learning_rate = params.getLearningRate()});
    return kj::READY_NOW;
  });
}

void ShardServiceImpl::check_token(capnp::Data::Reader token) const {
  const std::string& want = shard_.options().auth_token;
  if (want.empty()) return;
  // Constant time in the contents: every byte of the expected token is
  // compared whatever the offered one holds.
  unsigned char diff = token.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const unsigned char got = i < token.size() ? token[i] : 0;
    diff |= static_cast<unsigned char>(got ^ static_cast<unsigned char>(want[i]));
  }
  if (diff != 0) {
    std::string note;
    if (const_cast<ShardServiceImpl*>(this)->may_log("token", &note)) {
      spdlog::warn("refused hello from {}: {} auth token{}", caller_.peer,
                   token.size() == 0 ? "no" : "wrong", note);
    }
    throw RequestError(
        token.size() == 0
            ? "hello: authentication failed: no token given (psd was started with "
              "--auth_token_file; set ClientOptions::auth_token or auth_token_file, or a "
              "trainer's --auth_token_file)"
            : "hello: authentication failed: the token given does not match psd's (give the "
              "file psd's --auth_token_file names)");
  }
}

kj::Promise<void> ShardServiceImpl::checkpoint(CheckpointContext context) {
  context.allowCancellation();  // see pull()
  return guarded(RequestKind::kCheckpoint, [&]() -> kj::Promise<void> {
    Checkpointer* c = shard_.checkpointer();
    if (!c) throw RequestError("checkpoint: this psd has no --checkpoint_dir");
    return c->checkpoint(context.getParams().getStep())
        .then([context](Checkpointer::Written w) mutable {
          context.getResults().setPath(w.path);
          context.getResults().setStep(w.step);
        });
  });
}

kj::Promise<void> ShardServiceImpl::attachMemory(AttachMemoryContext context) {
  return guarded(RequestKind::kAttachMemory, [&]() -> kj::Promise<void> {
    const uint64_t limit = shard_.options().max_shared_memory_bytes;
    if (limit == 0)
      throw RequestError("attachMemory: this psd shares no memory (--max_shared_memory_mb 0)");
    if (caller_.peer_pid <= 0)
      throw RequestError("attachMemory: only over psd's Unix socket (a client on psd's host)");
    if (caller_.shared)
      throw RequestError("attachMemory: this connection already has a shared memory region");
    auto params = context.getParams();
    const auto token = params.getToken();
    std::shared_ptr<SharedRegion> region =
        SharedRegion::open_peer(caller_.peer_pid, params.getFd(), limit,
                                std::as_bytes(std::span(token.begin(), token.size())));
    if (region->size() != params.getBytes()) {
      throw RequestError("attachMemory: the region has " + std::to_string(region->size()) +
                         " bytes, not " + std::to_string(params.getBytes()));
    }
    caller_.shared = std::move(region);
    caller_.shared_id = 1;
    context.getResults().setRegion(caller_.shared_id);
    spdlog::debug("{} shares {} MiB of memory with psd", caller_.peer,
                  caller_.shared->size() >> 20);
    return kj::READY_NOW;
  });
}

// --- Embedding tables: Cap'n Proto in, plain values to the shard, Cap'n Proto out ---

namespace {

void table_to_wire(const TableReport& r, wire::TableMeta::Builder out) {
  out.setName(r.spec.name);
  out.setDim(r.spec.dim);
  out.setRows(r.spec.rows);
  out.setDynamic(r.spec.dynamic);
  out.setRowsHere(r.rows_here);
  out.setBytes(r.bytes);
  out.setVersion(r.version);
  out.setCreated(r.created);
  out.setEvictions(r.evictions);
  out.setIdsFiltered(r.ids_filtered);
  out.setRowsExpired(r.rows_expired);
  out.setOptimizer(static_cast<wire::RowOptimizerKind>(r.spec.optimizer.kind));
}

}  // namespace

kj::Promise<void> ShardServiceImpl::createTables(CreateTablesContext context) {
  return guarded(RequestKind::kCreateTables, [&]() -> kj::Promise<void> {
    auto params = context.getParams();
    std::vector<ShardTableSpec> specs;
    for (auto t : params.getTables()) specs.push_back(from_wire(t));
    shard_.check_sync_additions(caller_, specs);
    auto made = shard_.create_tables(specs, params.getValidateOnly());
    auto out = context.getResults().initTables(static_cast<unsigned>(made.size()));
    for (unsigned i = 0; i < made.size(); ++i) table_to_wire(made[i], out[i]);
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::pullRows(PullRowsContext context) {
  context.allowCancellation();  // see pull()
  return guarded(RequestKind::kPullRows, [&]() -> kj::Promise<void> {
    auto params = context.getParams();
    PullRowsRequest request{std::string_view(params.getTable().cStr(), params.getTable().size()),
                            ids_in_place(params.getIds(), "pullRows"), params.getMinStep(),
                            params.getLookup()};
    // The rows are gathered into a reused buffer (never zero-filled) and sent
    // from there as a segment of their own: no copy into the reply. Or,
    // where the caller names a slice of its shared memory, gathered there.
    struct Gathered {
      std::shared_ptr<float> rows;
      std::size_t floats = 0;
      int64_t step = 0;
      float* shared = nullptr;  // the caller's slice (checked), or null
      uint64_t shared_bytes = 0;
      std::shared_ptr<SharedRegion> region;  // kept mapped until the rows are written
    };
    auto gathered = std::make_shared<Gathered>();
    if (params.hasInto() && params.getInto().getBytes() != 0) {
      gathered->shared = shared_rows(params.getInto(), "pullRows");
      gathered->shared_bytes = params.getInto().getBytes();
      gathered->region = caller_.shared;
    }
    auto filled = shard_.pull_rows(
        caller_, request, [this, gathered](std::size_t floats, int64_t step) -> float* {
          gathered->floats = floats;
          gathered->step = step;
          if (gathered->shared != nullptr) {
            if (gathered->shared_bytes != floats * sizeof(float)) {
              throw RequestError("pullRows: the shared slice holds " +
                                 std::to_string(gathered->shared_bytes) + " bytes, the rows " +
                                 std::to_string(floats * sizeof(float)));
            }
            shard_.counters().shared_bytes += gathered->shared_bytes;
            return gathered->shared;
          }
          gathered->rows = RowBuffers::process().take(floats);
          return gathered->rows.get();
        });
    return filled.then([this, context, gathered]() mutable {
      auto results = context.getResults(capnp::MessageSize{16, 0});
      results.setStep(gathered->step);
      if (gathered->shared != nullptr) {
        results.setInShared(true);
        return;
      }
      auto bytes = kj::arrayPtr(reinterpret_cast<const kj::byte*>(gathered->rows.get()),
                                gathered->floats * sizeof(float));
      if (connection_ != nullptr && bytes.size() % sizeof(capnp::word) == 0 &&
          bytes.size() >= 4096) {
        // Large enough that a segment of its own costs less than a copy.
        results.adoptRows(capnp::Orphanage::getForMessageContaining(
                              static_cast<wire::Shard::PullRowsResults::Builder>(results))
                              .referenceExternalData(bytes));
        connection_->hold_until_sent(bytes.begin(), std::move(gathered->rows));
      } else {
        results.setRows(bytes);
      }
    });
  });
}

kj::Promise<void> ShardServiceImpl::pushRows(PushRowsContext context) {
  return guarded(RequestKind::kPushRows, [&]() -> kj::Promise<void> {
    auto params = context.getParams();
    auto grads = params.getGrads();
    if (grads.size() % sizeof(float) != 0)
      throw RequestError("pushRows: gradients are not a whole number of float32s");
    std::span<const float> values = as_floats(grads);
    // Gradients in the caller's shared memory: Shard::push_rows copies them
    // out as it checks them (PushRowsRequest::grads_shared).
    uint64_t shared_bytes = 0;
    if (params.hasSharedGrads() && params.getSharedGrads().getBytes() != 0) {
      if (grads.size() != 0)
        throw RequestError("pushRows: gradients both in the message and in a shared slice");
      shared_bytes = params.getSharedGrads().getBytes();
      values = std::span<const float>(shared_rows(params.getSharedGrads(), "pushRows"),
                                      shared_bytes / sizeof(float));
    }
    PushRowsRequest request{std::string_view(params.getTable().cStr(), params.getTable().size()),
                            ids_in_place(params.getIds(), "pushRows"),
                            values,
                            params.getStep(),
                            params.getRequestId(),
                            params.getDoneStep(),
                            shared_bytes != 0,
                            params.getIdsDistinct(),
                            params.getParts()};
    PushRowsReply reply = shard_.push_rows(caller_, request);
    shard_.counters().shared_bytes += shared_bytes;
    auto results = context.getResults();
    results.setStatus(static_cast<wire::PushStatus>(reply.status));
    results.setStep(reply.step);
    results.setStop(reply.stop);
    return kj::READY_NOW;
  });
}

float* ShardServiceImpl::shared_rows(wire::SharedSlice::Reader slice, const char* what) const {
  const SharedSliceRef ref{slice.getRegion(), slice.getOffset(), slice.getBytes()};
  if (ref.offset % sizeof(float) != 0 || ref.bytes % sizeof(float) != 0) {
    throw RequestError(std::string(what) + ": shared slice of " + std::to_string(ref.bytes) +
                       " bytes at " + std::to_string(ref.offset) +
                       " is not whole float32s at a float32 boundary");
  }
  // Checked to lie inside the caller's region (region id, offset and size).
  return reinterpret_cast<float*>(const_cast<std::byte*>(shard_.shared_slice(caller_, ref, what)));
}

kj::Promise<void> ShardServiceImpl::listTables(ListTablesContext context) {
  return guarded(RequestKind::kListTables, [&]() -> kj::Promise<void> {
    auto tables = shard_.list_tables();
    auto out = context.getResults().initTables(static_cast<unsigned>(tables.size()));
    for (unsigned i = 0; i < tables.size(); ++i) table_to_wire(tables[i], out[i]);
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::restoreRows(RestoreRowsContext context) {
  return guarded(RequestKind::kRestoreRows, [&]() -> kj::Promise<void> {
    require_hello("restoreRows");
    auto params = context.getParams();
    auto whole = [](capnp::Data::Reader d) {
      if (d.size() % sizeof(float) != 0)
        throw RequestError("restoreRows: values are not a whole number of float32s");
      return as_floats(d);
    };
    std::vector<std::span<const float>> slots;
    for (auto s : params.getSlots()) slots.push_back(whole(s));
    const std::vector<uint32_t> ages = ages_from_wire(params.getAges());
    shard_.restore_rows(std::string_view(params.getTable().cStr(), params.getTable().size()),
                        ids_in_place(params.getIds(), "restoreRows"), whole(params.getValues()),
                        slots, params.getVersion(), ages);
    return kj::READY_NOW;
  });
}

}  // namespace ps
