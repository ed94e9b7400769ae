#include "shard_connection.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "socket_stream.h"
#include "wire_convert.h"

namespace ps {

kj::Exception disconnected(std::string message) {
  return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__, kj::str(message));
}

namespace {

kj::Promise<kj::Own<SocketStream>> connect_with_retry(kj::UnixEventPort& io, std::string address,
                                                           kj::TimePoint deadline, kj::Duration delay) {
  return kj::evalNow([&] { return connect_socket(io, address); })
      .catch_([&io, address, deadline, delay](kj::Exception&& e) -> kj::Promise<kj::Own<SocketStream>> {
        auto& timer = io.getTimer();
        if (timer.now() + delay > deadline) {
          return disconnected("cannot reach psd at " + address + ": " + e.getDescription().cStr());
        }
        spdlog::debug("psd at {} not reachable yet ({}); retrying", address, e.getDescription().cStr());
        return timer.afterDelay(delay).then([&io, address, deadline, delay] {
          return connect_with_retry(io, address, deadline, std::min(delay * 2, 500 * kj::MILLISECONDS));
        });
      });
}

}  // namespace

namespace {

kj::Promise<kj::Own<ShardConnection>> hello_on(kj::Own<SocketStream> stream, int index, std::string address,
                                               const HelloParams& hello) {
  auto conn = kj::heap<ShardConnection>();
  conn->index = index;
  conn->address = address;
  conn->stream = kj::mv(stream);
  capnp::ReaderOptions reader;
  reader.traversalLimitInWords = (1ull << 34) / sizeof(capnp::word);  // the client trusts its shards
  conn->messages = kj::heap<ClientMessageStream>(*conn->stream);
  conn->network = kj::heap<capnp::TwoPartyVatNetwork>(*conn->messages, capnp::rpc::twoparty::Side::CLIENT, reader);
  conn->rpc = kj::heap(capnp::makeRpcClient(*conn->network));
  capnp::word scratch[4];
  memset(scratch, 0, sizeof(scratch));
  capnp::MallocMessageBuilder message(scratch);
  auto vat = message.getRoot<capnp::rpc::twoparty::VatId>();
  vat.setSide(capnp::rpc::twoparty::Side::SERVER);
  conn->shard = conn->rpc->bootstrap(vat).castAs<wire::Shard>();

  auto req = conn->shard.helloRequest();
  req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
  req.setWorkerIndex(hello.worker_index);
  req.setIsChief(hello.is_chief);
  if (!hello.auth_token.empty()) {
    req.setAuthToken(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(hello.auth_token.data()), hello.auth_token.size()));
  }
  return req.send().then([conn = kj::mv(conn)](capnp::Response<wire::Shard::HelloResults>&& reply) mutable {
    auto info = reply.getInfo();
    conn->max_message_bytes = info.getMaxMessageBytes();
    conn->num_shards = info.getNumShards();
    conn->shard_index = info.getShardIndex();
    conn->job = job_from_wire(info.getJob());
    conn->hello_step = conn->last_step = info.getGlobalStep();
    spdlog::debug("connected to {} ({}, shard {}/{})", conn->address, info.getServerVersion().cStr(),
                  info.getShardIndex(), info.getNumShards());
    return kj::mv(conn);
  });
}

// Connect and hello, again with backoff while the peer is not there or
// hangs up during hello (a psd shutting down, or still starting): a refusal
// (bad token, wrong version, too many connections) ends it at once.
kj::Promise<kj::Own<ShardConnection>> connect_and_hello(kj::UnixEventPort& io, int index, std::string address,
                                                        kj::TimePoint deadline, kj::Duration delay,
                                                        HelloParams hello) {
  return connect_with_retry(io, address, deadline, delay)
      .then([index, address, hello](kj::Own<SocketStream> stream) {
        return hello_on(kj::mv(stream), index, address, hello);
      })
      .catch_([&io, index, address, deadline, delay, hello](kj::Exception&& e) -> kj::Promise<kj::Own<ShardConnection>> {
        auto& timer = io.getTimer();
        if (e.getType() != kj::Exception::Type::DISCONNECTED || timer.now() + delay > deadline) return kj::mv(e);
        return timer.afterDelay(delay).then([&io, index, address, deadline, delay, hello] {
          return connect_and_hello(io, index, address, deadline, std::min(delay * 2, 500 * kj::MILLISECONDS), hello);
        });
      });
}

}  // namespace

kj::Promise<kj::Own<ShardConnection>> connect_shard(kj::UnixEventPort& io, int index, std::string address,
                                                    std::chrono::milliseconds timeout, const HelloParams& hello) {
  auto deadline = io.getTimer().now() + timeout.count() * kj::MILLISECONDS;
  return connect_and_hello(io, index, address, deadline, 20 * kj::MILLISECONDS, hello);
}

}  // namespace ps
