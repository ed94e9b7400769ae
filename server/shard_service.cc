#include "shard_service.h"

#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "wire_convert.h"

namespace ps {

ShardServiceImpl::ShardServiceImpl(Shard& shard, std::string peer) : shard_(shard) {
  caller_.peer = std::move(peer);
  ++shard_.counters().connections;
}

ShardServiceImpl::~ShardServiceImpl() {
  --shard_.counters().connections;
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
  return guarded(RequestKind::kHello, [&]() -> kj::Promise<void> {
    auto params = context.getParams();
    if (params.getProtocolVersion() != wire::K_PROTOCOL_VERSION) {
      throw RequestError("protocol version mismatch: client speaks " + std::to_string(params.getProtocolVersion()) +
                         ", this psd speaks " + std::to_string(wire::K_PROTOCOL_VERSION) +
                         "; use a libpsclient and psd from the same release");
    }
    if (said_hello_) throw RequestError("hello: this connection already said hello");
    Caller caller = caller_;
    caller.worker_index = params.getWorkerIndex();
    caller.is_chief = params.getIsChief();
    shard_.hello(caller);  // throws for a bad index or a second chief
    caller_ = caller;
    said_hello_ = true;
    shard_.info(context.getResults().initInfo());
    spdlog::info("{} connected{}{}", caller_.peer,
                 caller_.worker_index >= 0 ? fmt::format(" as worker {}", caller_.worker_index) : "",
                 caller_.is_chief ? " (chief)" : "");
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::create(CreateContext context) {
  return guarded(RequestKind::kCreate, [&]() -> kj::Promise<void> {
    shard_.create(context.getParams(), context.getResults());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::pull(PullContext context) {
  return guarded(RequestKind::kPull, [&] { return shard_.pull(caller_, context.getParams(), context.getResults()); });
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
    shard_.job().set_ready();
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::waitReady(WaitReadyContext context) {
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
    auto [step, stop] = shard_.step_done(caller_, context.getParams().getStep());
    context.getResults().setGlobalStep(step);
    context.getResults().setStop(stop);
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::barrier(BarrierContext context) {
  return guarded(RequestKind::kBarrier, [&]() -> kj::Promise<void> {
    auto p = context.getParams();
    const uint32_t ms = std::min<uint32_t>(p.getTimeoutMs(), 3'600'000);
    return shard_.job().barrier(p.getName(), p.getCount(), ms * kj::MILLISECONDS).then([context](uint32_t n) mutable {
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

}  // namespace ps
