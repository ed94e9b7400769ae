#include "server/shard_service.h"

#include <cstring>

#include <spdlog/spdlog.h>

#include "server/checkpointer.h"
#include "ps/errors.h"
#include "common/wire_convert.h"

namespace ps {

ShardServiceImpl::ShardServiceImpl(Shard& shard, std::string peer, std::string refusal, SocketStream* stream,
                                   pid_t peer_pid)
    : shard_(shard), refusal_(std::move(refusal)) {
  caller_.peer = std::move(peer);
  caller_.stream = stream;
  caller_.peer_pid = peer_pid;
  if (refusal_.empty()) ++shard_.counters().connections;
  if (stream != nullptr && refusal_.empty()) {
    hello_deadline_ = shard_.job().timer().afterDelay(kHelloDeadline).then([this] {
      if (said_hello_) return;
      spdlog::info("closing the connection from {}: no hello within {} s", caller_.peer, kHelloDeadline / kj::SECONDS);
      caller_.stream->abort();
    }).eagerlyEvaluate(nullptr);
  }
}

ShardServiceImpl::~ShardServiceImpl() {
  if (refusal_.empty()) --shard_.counters().connections;
  if (said_hello_) {
    if (caller_.worker_index >= 0) spdlog::info("worker {} ({}) disconnected", caller_.worker_index, caller_.peer);
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
    ++shard_.counters().rejected;
    spdlog::info("refused {} from {}: {}", what, caller_.peer, message);
    return kj::Promise<void>(kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(message)));
  };
  try {
    if (!refusal_.empty()) throw RequestError(refusal_);
    // Nothing but hello before a successful hello: with --auth_token_file
    // that is what keeps an unauthenticated peer out.
    if (!said_hello_ && kind != RequestKind::kHello && kind != RequestKind::kProbe) {
      throw RequestError(std::string(what) + ": say hello first");
    }
    return handler().catch_([reject](kj::Exception&& e) -> kj::Promise<void> {
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
      throw RequestError("protocol version mismatch: client speaks " + std::to_string(params.getProtocolVersion()) +
                         ", this psd speaks " + std::to_string(wire::K_PROTOCOL_VERSION) +
                         "; use a libpsclient and psd from the same release");
    }
    if (said_hello_) throw RequestError("hello: this connection already said hello");
    check_token(params.getAuthToken());
    if (probe) {
      shard_.info(context.getResults().initInfo());
      spdlog::debug("{} asked where this psd is (probe)", caller_.peer);
      return kj::READY_NOW;
    }
    Caller caller = caller_;
    caller.worker_index = params.getWorkerIndex();
    caller.is_chief = params.getIsChief();
    shard_.hello(caller);  // throws for a bad index or a second chief
    caller_ = caller;
    said_hello_ = true;
    auto info = context.getResults().initInfo();
    shard_.info(info);
    info.setWorkerStep(shard_.job().recorded_step(caller_.worker_index));
    spdlog::info("{} connected{}{}", caller_.peer,
                 caller_.worker_index >= 0 ? fmt::format(" as worker {}", caller_.worker_index) : "",
                 caller_.is_chief ? " (chief)" : "");
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::create(CreateContext context) {
  return guarded(RequestKind::kCreate, [&]() -> kj::Promise<void> {
    const uint64_t limit = shard_.options().max_tensors_per_client;
    uint64_t fresh = 0;
    if (limit > 0) {
      for (auto spec : context.getParams().getSpecs()) fresh += shard_.store().find(spec.getName()) == nullptr;
      if (tensors_created_ + fresh > limit) {
        throw RequestError("create: this connection may create at most " + std::to_string(limit) + " tensors (psd " +
                           "--max_tensors_per_client); it created " + std::to_string(tensors_created_) + " and asked for " +
                           std::to_string(fresh) + " more");
      }
    }
    shard_.create(context.getParams(), context.getResults());
    if (!context.getParams().getValidateOnly()) tensors_created_ += fresh;
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
  return guarded(RequestKind::kPull, [&] { return shard_.pull(caller_, context.getParams(), [&](capnp::MessageSize size) { return context.getResults(size); }); });
}

kj::Promise<void> ShardServiceImpl::push(PushContext context) {
  return guarded(RequestKind::kPush, [&] {
    require_hello("push");
    return shard_.push(caller_, context.getParams(), context.getResults());
  });
}

kj::Promise<void> ShardServiceImpl::list(ListContext context) {
  return guarded(RequestKind::kList, [&]() -> kj::Promise<void> {
    shard_.list(context.getResults());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::stats(StatsContext context) {
  return guarded(RequestKind::kStats, [&]() -> kj::Promise<void> {
    shard_.stats(context.getResults().initStats());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::initJob(InitJobContext context) {
  return guarded(RequestKind::kInitJob, [&]() -> kj::Promise<void> {
    require_hello("initJob");
    shard_.init_job(context.getParams().getConfig());
    shard_.info(context.getResults().initInfo());
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
    return shard_.job().barrier(p.getName(), p.getCount(), ms * kj::MILLISECONDS, caller_.worker_index).then([context](uint32_t n) mutable {
      context.getResults().setArrived(n);
    });
  });
}

kj::Promise<void> ShardServiceImpl::finish(FinishContext) {
  return guarded(RequestKind::kFinish, [&]() -> kj::Promise<void> {
    require_hello("finish");
    shard_.job().finish();
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::report(ReportContext context) {
  return guarded(RequestKind::kReport, [&]() -> kj::Promise<void> {
    require_hello("report");
    shard_.report(caller_, context.getParams());
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
    spdlog::warn("refused hello from {}: {} auth token", caller_.peer, token.size() == 0 ? "no" : "wrong");
    throw RequestError("hello: authentication failed (psd was started with --auth_token_file; set "
                       "ClientOptions::auth_token or auth_token_file, or a trainer's --auth_token_file)");
  }
}

kj::Promise<void> ShardServiceImpl::checkpoint(CheckpointContext context) {
  context.allowCancellation();  // see pull()
  return guarded(RequestKind::kCheckpoint, [&]() -> kj::Promise<void> {
    Checkpointer* c = shard_.checkpointer();
    if (!c) throw RequestError("checkpoint: this psd has no --checkpoint_dir");
    return c->checkpoint(context.getParams().getStep()).then([context](Checkpointer::Written w) mutable {
      context.getResults().setPath(w.path);
      context.getResults().setStep(w.step);
    });
  });
}

kj::Promise<void> ShardServiceImpl::attachMemory(AttachMemoryContext context) {
  return guarded(RequestKind::kAttachMemory, [&]() -> kj::Promise<void> {
    const uint64_t limit = shard_.options().max_shared_memory_bytes;
    if (limit == 0) throw RequestError("attachMemory: this psd shares no memory (--max_shared_memory_mb 0)");
    if (caller_.peer_pid <= 0) throw RequestError("attachMemory: only over psd's Unix socket (a client on psd's host)");
    if (caller_.shared) throw RequestError("attachMemory: this connection already has a shared memory region");
    auto params = context.getParams();
    const auto token = params.getToken();
    std::shared_ptr<SharedRegion> region = SharedRegion::open_peer(
        caller_.peer_pid, params.getFd(), limit, std::as_bytes(std::span(token.begin(), token.size())));
    if (region->size() != params.getBytes()) {
      throw RequestError("attachMemory: the region has " + std::to_string(region->size()) + " bytes, not " +
                         std::to_string(params.getBytes()));
    }
    caller_.shared = std::move(region);
    caller_.shared_id = 1;
    context.getResults().setRegion(caller_.shared_id);
    spdlog::debug("{} shares {} MiB of memory with psd", caller_.peer, caller_.shared->size() >> 20);
    return kj::READY_NOW;
  });
}

}  // namespace ps
