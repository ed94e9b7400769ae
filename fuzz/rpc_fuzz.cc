// libFuzzer target over one whole psd connection: a Cap'n Proto client in
// the same event loop makes calls chosen by the input to psd's Shard
// service, over a socket pair, through what psd puts on every connection
// (SocketStream, BufferedMessageStream, the two-party RPC system,
// ShardServiceImpl), and reads the replies psd writes (tensors sent from
// their own memory, held until written). shard_fuzz feeds the handlers
// directly; this adds the service layer (hello gating, error mapping) and
// psd's write path under call sequences a real client would not make.
//
// The input: a byte that says whether to say hello first (as a worker or a
// tool, chief or not), then up to 16 calls, each a method number and the
// bytes of a Cap'n Proto message whose root becomes the call's parameters.
// A call that would wait (waitReady, barrier, a pull for a later step) is
// given a few turns of the loop and then cancelled. The shard starts with
// two embedding tables (a fixed "emb", a dynamic "dyn" at a row limit) for
// the table methods (createTables to restoreRows) to reach. Checks, besides
// the sanitizers': the connection still answers a list() at the end, unless
// the input broke it, and the shard holds no NaN or Inf and no bad name
// (shard_invariants.h).
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <capnp/serialize.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <kj/async-io.h>
#include <spdlog/spdlog.h>

#include "common/net/buffered_message_stream.h"
#include "schema/ps.capnp.h"
#include "server/shard.h"
#include "fuzz/shard_env.h"
#include "fuzz/shard_invariants.h"
#include "server/shard_service.h"
#include "common/net/socket_stream.h"

namespace {

constexpr int kMaxCalls = 16;
constexpr int kTurnsPerCall = 8;

void turn(int times) {
  for (int i = 0; i < times; ++i) kj::evalLater([] {}).wait(ps::fuzz::io().waitScope);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  auto& io = ps::fuzz::io();
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) != 0) return 0;

  ps::ShardOptions options;
  options.limits.max_tensor_bytes = 1 << 20;
  options.limits.max_total_bytes = 8 << 20;
  options.limits.max_tensors = 64;
  ps::Shard shard(options, ps::fuzz::pool(), ps::fuzz::timer());
  shard.create_tables({{{.name = "emb",
                         .dim = 4,
                         .rows = 16,
                         .optimizer = ps::RowOptimizerConfig::adagrad(0.5f),
                         .init = ps::InitConfig::uniform(-1, 1, 7)}},
                       {{.name = "dyn",
                         .dim = 2,
                         .dynamic = true,
                         .placement = ps::TablePlacement::kHash,
                         .optimizer = ps::RowOptimizerConfig::lazy_adam(0.5f),
                         .row_limit = 8,
                         .on_limit = ps::OnRowLimit::kRefuse}}},
                      false);
  {
    // psd's side, as server.cc builds a connection.
    auto server_socket = ps::wrap_socket(io.unixEventPort, fds[0]);
    ps::BufferedMessageStream server_messages(*server_socket);
    capnp::ReaderOptions reader;
    reader.traversalLimitInWords = 64 * 1024;
    capnp::TwoPartyVatNetwork server_network(server_messages, capnp::rpc::twoparty::Side::SERVER,
                                             reader);
    auto server = capnp::makeRpcServer(
        server_network, kj::heap<ps::ShardServiceImpl>(shard, "fuzz", "", server_socket.get()));

    auto client_stream =
        io.lowLevelProvider->wrapSocketFd(fds[1], kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
    capnp::TwoPartyClient client(*client_stream);
    auto cap = client.bootstrap().castAs<ps::wire::Shard>();

    const uint8_t hello = in.ConsumeIntegral<uint8_t>();
    if (hello & 1) {
      auto req = cap.helloRequest();
      req.setProtocolVersion(ps::wire::K_PROTOCOL_VERSION);
      req.setWorkerIndex((hello & 2) ? static_cast<int32_t>((hello >> 4) & 3) : -1);
      req.setIsChief(hello & 4);
      auto done = req.send().ignoreResult().then([] {}, [](kj::Exception&&) {});
      done.wait(io.waitScope);
    }

    bool broken = false;
    for (int k = 0; k < kMaxCalls && in.remaining_bytes() > 0 && !broken; ++k) {
      const uint16_t method = in.ConsumeIntegralInRange<uint16_t>(0, 19);  // hello .. restoreRows
      auto bytes = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 1024));
      std::vector<uint64_t> words((bytes.size() + 7) / 8);  // capnp::word is not movable
      if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
      capnp::ReaderOptions limits;
      limits.traversalLimitInWords = 4096;
      auto req = cap.typelessRequest(capnp::typeId<ps::wire::Shard>(), method, nullptr);
      auto copied = kj::runCatchingExceptions([&] {
        capnp::FlatArrayMessageReader params(
            kj::arrayPtr(reinterpret_cast<const capnp::word*>(words.data()), words.size()), limits);
        req.set(params.getRoot<capnp::AnyPointer>());
      });
      if (copied != nullptr) continue;  // not a message: nothing to send
      auto reply =
          req.send().ignoreResult().then([] { return true; },
                                         [](kj::Exception&& e) {
                                           // A refused call is an answer; a lost connection is not.
                                           return e.getType() != kj::Exception::Type::DISCONNECTED;
                                         });
      for (int t = 0; t < kTurnsPerCall && !reply.poll(io.waitScope); ++t) turn(1);
      if (reply.poll(io.waitScope)) broken = !reply.wait(io.waitScope);
    }

    // Unless the input broke the connection, psd still answers on it (a
    // list, or a refusal for a connection that never said hello).
    if (!broken) {
      auto list = cap.listRequest().send().ignoreResult().then([] {}, [](kj::Exception&&) {});
      int t = 0;
      for (; t < 256 && !list.poll(io.waitScope); ++t) turn(1);
      if (t == 256) __builtin_trap();
    }
  }
  // The server side's teardown, which Cap'n Proto may finish turns later
  // (a cancelled call still holding the service): the service goes before
  // the shard it serves, or its destructor would reach a shard that is gone.
  int t = 0;
  for (; t < 1024 && shard.counters().connections.load() > 0; ++t) turn(1);
  if (t == 1024) __builtin_trap();
  ps::fuzz::check_shard_invariants(shard);
  return 0;
}
