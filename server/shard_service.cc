#include "shard_service.h"

#include <spdlog/spdlog.h>

#include "ps/errors.h"

namespace ps {

ShardServiceImpl::ShardServiceImpl(Shard& shard, std::string peer) : shard_(shard), peer_(std::move(peer)) {
  ++shard_.counters().connections;
}

ShardServiceImpl::~ShardServiceImpl() {
  --shard_.counters().connections;
  spdlog::debug("connection from {} closed", peer_);
}

template <typename F>
kj::Promise<void> ShardServiceImpl::guarded(const char* what, F&& handler) {
  auto reject = [this, what](const char* message) {
    ++shard_.counters().rejected;
    spdlog::info("refused {} from {}: {}", what, peer_, message);
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
  return guarded("hello", [&]() -> kj::Promise<void> {
    auto params = context.getParams();
    if (params.getProtocolVersion() != wire::K_PROTOCOL_VERSION) {
      throw RequestError("protocol version mismatch: client speaks " + std::to_string(params.getProtocolVersion()) +
                         ", this psd speaks " + std::to_string(wire::K_PROTOCOL_VERSION) +
                         "; use a libpsclient and psd from the same release");
    }
    worker_index_ = params.getWorkerIndex();
    said_hello_ = true;
    shard_.info(context.getResults().initInfo());
    spdlog::info("{} connected{}", peer_, worker_index_ >= 0 ? fmt::format(" as worker {}", worker_index_) : "");
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::create(CreateContext context) {
  return guarded("create", [&]() -> kj::Promise<void> {
    shard_.create(context.getParams(), context.getResults());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::pull(PullContext context) {
  return guarded("pull", [&] { return shard_.pull(context.getParams(), context.getResults()); });
}

kj::Promise<void> ShardServiceImpl::push(PushContext context) {
  return guarded("push", [&] { return shard_.push(context.getParams(), context.getResults()); });
}

kj::Promise<void> ShardServiceImpl::list(ListContext context) {
  return guarded("list", [&]() -> kj::Promise<void> {
    shard_.list(context.getResults());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ShardServiceImpl::stats(StatsContext context) {
  return guarded("stats", [&]() -> kj::Promise<void> {
    shard_.stats(context.getResults().initStats());
    return kj::READY_NOW;
  });
}

}  // namespace ps
