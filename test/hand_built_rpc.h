// Cap'n Proto RPC messages built by hand (rpc.capnp) on psd's Shard bootstrap
// capability, for tests and benchmarks that play a hostile peer over a raw
// socket: what a real client would never send, framed as psd reads it.
//
//   send(fd, ps::test::bootstrap_message());
//   send(fd, ps::test::call_message<ps::wire::Shard::HelloParams>(1, ps::test::kHello,
//                                                                  [](auto p) { ... }));
#pragma once

#include <cstdint>
#include <vector>

#include <capnp/message.h>
#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>

#include "schema/ps.capnp.h"

namespace ps::test {

// Method ids of ps.capnp's Shard interface used by the hostile peers.
constexpr uint16_t kHello = 0, kList = 4, kStats = 5, kCheckpoint = 13;

// The message as the bytes of its stream framing.
inline std::vector<char> flat(capnp::MessageBuilder& m) {
  auto words = capnp::messageToFlatArray(m);
  auto bytes = words.asChars();
  return std::vector<char>(bytes.begin(), bytes.end());
}

// Asks for the bootstrap capability as question 0.
inline std::vector<char> bootstrap_message() {
  capnp::MallocMessageBuilder m;
  m.initRoot<capnp::rpc::Message>().initBootstrap().setQuestionId(0);
  return flat(m);
}

// A call of `method` on the bootstrap capability, question `id` (> 0);
// `fill` writes the parameters.
template <typename Params, typename Fill>
std::vector<char> call_message(uint32_t id, uint16_t method, Fill&& fill) {
  capnp::MallocMessageBuilder m;
  auto call = m.initRoot<capnp::rpc::Message>().initCall();
  call.setQuestionId(id);
  call.initTarget().initPromisedAnswer().setQuestionId(0);
  call.setInterfaceId(capnp::typeId<wire::Shard>());
  call.setMethodId(method);
  fill(call.initParams().getContent().initAs<Params>());
  return flat(m);
}

}  // namespace ps::test
