#include "shard_connection.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "wire_convert.h"

namespace ps {

kj::Exception disconnected(std::string message) {
  return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__, kj::str(message));
}

namespace {

kj::Promise<kj::Own<kj::AsyncIoStream>> connect_with_retry(kj::AsyncIoContext& io, std::string address,
                                                           kj::TimePoint deadline, kj::Duration delay) {
  return io.provider->getNetwork()
      .parseAddress(address)
      .then([](kj::Own<kj::NetworkAddress> addr) { return addr->connect().attach(kj::mv(addr)); })
      .catch_([&io, address, deadline, delay](kj::Exception&& e) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        auto& timer = io.provider->getTimer();
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

kj::Promise<kj::Own<ShardConnection>> connect_shard(kj::AsyncIoContext& io, int index, std::string address,
                                                    std::chrono::milliseconds timeout, int worker_index,
                                                    bool is_chief) {
  auto deadline = io.provider->getTimer().now() + timeout.count() * kj::MILLISECONDS;
  return connect_with_retry(io, address, deadline, 20 * kj::MILLISECONDS)
      .then([index, address, worker_index, is_chief](kj::Own<kj::AsyncIoStream> stream) {
        auto conn = kj::heap<ShardConnection>();
        conn->index = index;
        conn->address = address;
        conn->stream = kj::mv(stream);
        capnp::ReaderOptions reader;
        reader.traversalLimitInWords = (1ull << 34) / sizeof(capnp::word);  // the client trusts its shards
        conn->network = kj::heap<capnp::TwoPartyVatNetwork>(*conn->stream, capnp::rpc::twoparty::Side::CLIENT, reader);
        conn->rpc = kj::heap(capnp::makeRpcClient(*conn->network));
        capnp::word scratch[4];
        memset(scratch, 0, sizeof(scratch));
        capnp::MallocMessageBuilder message(scratch);
        auto vat = message.getRoot<capnp::rpc::twoparty::VatId>();
        vat.setSide(capnp::rpc::twoparty::Side::SERVER);
        conn->shard = conn->rpc->bootstrap(vat).castAs<wire::Shard>();

        auto req = conn->shard.helloRequest();
        req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
        req.setWorkerIndex(worker_index);
        req.setIsChief(is_chief);
        return req.send().then([conn = kj::mv(conn)](capnp::Response<wire::Shard::HelloResults>&& reply) mutable {
          auto info = reply.getInfo();
          conn->max_message_bytes = info.getMaxMessageBytes();
          conn->num_shards = info.getNumShards();
          conn->shard_index = info.getShardIndex();
          conn->job = job_from_wire(info.getJob());
          spdlog::debug("connected to {} ({}, shard {}/{})", conn->address, info.getServerVersion().cStr(),
                        info.getShardIndex(), info.getNumShards());
          return kj::mv(conn);
        });
      });
}

}  // namespace ps
