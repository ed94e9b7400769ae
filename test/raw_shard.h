// A raw Cap'n Proto connection to psd that has said hello (as worker
// `worker`, the chief if asked, with `client_id`), for tests that send what
// libpsclient never would. Tests derive from it to add the calls they need.
#pragma once

#include <cstdint>
#include <string>

#include <capnp/ez-rpc.h>

#include "schema/ps.capnp.h"

namespace ps::test {

struct RawShard {
  explicit RawShard(const std::string& address, int worker = -1, bool chief = false,
                    uint64_t client_id = 0)
      : rpc(address), shard(rpc.getMain<wire::Shard>()) {
    auto req = shard.helloRequest();
    req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
    req.setWorkerIndex(worker);
    req.setIsChief(chief);
    req.setClientId(client_id);
    req.send().wait(ws());
  }
  kj::WaitScope& ws() { return rpc.getWaitScope(); }

  capnp::EzRpcClient rpc;
  wire::Shard::Client shard;
};

}  // namespace ps::test
