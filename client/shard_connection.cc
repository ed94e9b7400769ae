#include "client/shard_connection.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/for_people.h"
#include "common/net/client_loop.h"
#include "common/net/host_id.h"
#include "common/net/host_port.h"
#include "common/net/socket_stream.h"
#include "common/wire_convert.h"

namespace ps {

kj::Exception disconnected(std::string message) {
  return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__, kj::str(message));
}

namespace {

kj::Promise<kj::Own<SocketStream>> connect_with_retry(kj::UnixEventPort& io, std::string address,
                                                      kj::TimePoint deadline, kj::Duration delay) {
  return kj::evalNow([&] { return connect_socket(io, address); })
      .catch_(
          [&io, address, deadline, delay](kj::Exception&& e) -> kj::Promise<kj::Own<SocketStream>> {
            const kj::TimePoint now = clock_now();
            if (now + delay > deadline) {
              return disconnected("cannot reach psd at " + address + ": " +
                                  for_people(e.getDescription().cStr()));
            }
            spdlog::debug("psd at {} not reachable yet ({}); retrying", address,
                          e.getDescription().cStr());
            return io.getTimer().atTime(now + delay).then([&io, address, deadline, delay] {
              return connect_with_retry(io, address, deadline,
                                        std::min(delay * 2, 500 * kj::MILLISECONDS));
            });
          });
}

}  // namespace

namespace {

// What the connection speaks over: a TLS session on a TCP socket when the
// client has TLS (hello.tls), else the socket itself.
kj::Promise<kj::Own<SocketStream>> secured(kj::Own<SocketStream> socket, const std::string& via,
                                           const HelloParams& hello) {
  if (!hello.tls || via.rfind("unix:", 0) == 0) return kj::mv(socket);
  std::string name = hello.tls_server_name;
  if (name.empty()) {
    const auto parts = split_host_port(via);
    name = parts ? parts->host : via;
  }
  return hello.tls->connect(kj::mv(socket), name, via);
}

// The Cap'n Proto plumbing over a connected stream; nothing said yet.
kj::Own<ShardConnection> open_connection(kj::Own<SocketStream> stream, int index,
                                         std::string address, std::string via,
                                         const HelloParams& hello) {
  stream->detect_dead_peer(hello.dead_peer);
  auto conn = kj::heap<ShardConnection>();
  conn->index = index;
  conn->address = std::move(address);
  conn->via = std::move(via);
  capnp::ReaderOptions reader;
  reader.traversalLimitInWords =
      (1ull << 34) / sizeof(capnp::word);  // the client trusts its shards
  // The message stream owns the socket; the call layer reaches it only as
  // messages->connection() (common/net/connection_control.h).
  SocketStream& socket = *stream;
  conn->messages = kj::heap<ClientMessageStream>(socket).attach(kj::mv(stream));
  conn->network = kj::heap<capnp::TwoPartyVatNetwork>(*conn->messages,
                                                      capnp::rpc::twoparty::Side::CLIENT, reader);
  conn->rpc = kj::heap(capnp::makeRpcClient(*conn->network));
  capnp::word scratch[4];
  memset(scratch, 0, sizeof(scratch));
  capnp::MallocMessageBuilder message(scratch);
  auto vat = message.getRoot<capnp::rpc::twoparty::VatId>();
  vat.setSide(capnp::rpc::twoparty::Side::SERVER);
  conn->shard = conn->rpc->bootstrap(vat).castAs<wire::Shard>();
  return conn;
}

capnp::Request<wire::Shard::HelloParams, wire::Shard::HelloResults> hello_request(
    ShardConnection& conn, const HelloParams& hello, bool probe) {
  auto req = conn.shard.helloRequest();
  req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
  req.setWorkerIndex(probe ? -1 : hello.worker_index);
  req.setClientId(hello.client_id);
  req.setIsChief(!probe && hello.is_chief);
  req.setProbe(probe);
  if (!hello.auth_token.empty()) {
    req.setAuthToken(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(hello.auth_token.data()),
                                  hello.auth_token.size()));
  }
  return req;
}

// Gives psd a shared memory region for this connection; a region psd
// cannot map leaves the connection as it was (values over the socket).
kj::Promise<kj::Own<ShardConnection>> share_memory(kj::Own<ShardConnection> conn, uint64_t bytes) {
  std::shared_ptr<SharedRegion> region;
  try {
    region = SharedRegion::create(bytes);
  } catch (const std::exception& e) {
    spdlog::info("shard {}: no shared memory ({}); tensors go over {}", conn->index, e.what(),
                 conn->via);
    return kj::mv(conn);
  }
  const SharedRegion::Token token = region->stamp_token();
  auto req = conn->shard.attachMemoryRequest();
  req.setFd(region->fd());
  req.setBytes(region->size());
  req.setToken(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(token.data()), token.size()));
  ShardConnection* c = conn.get();
  return req.send()
      .then(
          [c, region](capnp::Response<wire::Shard::AttachMemoryResults>&& reply) mutable {
            c->arena = std::make_shared<SharedArena>(std::move(region), reply.getRegion());
            // Reached through TCP first, the switch to the socket says it (hello_preferring_unix).
            const auto level = c->via == c->address ? spdlog::level::info : spdlog::level::debug;
            spdlog::log(level, "shard {}: {} MiB of memory shared with psd at {}", c->index,
                        c->arena->region().size() >> 20, c->via);
          },
          [c](kj::Exception&& e) {
            if (e.getType() == kj::Exception::Type::DISCONNECTED)
              kj::throwFatalException(kj::mv(e));
            spdlog::info("shard {}: psd did not take shared memory ({}); tensors go over {}",
                         c->index, e.getDescription().cStr(), c->via);
          })
      .then([conn = kj::mv(conn)]() mutable { return kj::mv(conn); });
}

// What makes a hello's answer one this client cannot go on with (empty:
// nothing): another protocol version (psd refuses one itself; a peer that
// does not would be read wrong), or steps no psd has.
std::string hello_problem(wire::ShardInfo::Reader info) {
  if (info.getProtocolVersion() != wire::K_PROTOCOL_VERSION) {
    return "speaks protocol version " + std::to_string(info.getProtocolVersion()) +
           ", this client " + std::to_string(wire::K_PROTOCOL_VERSION);
  }
  if (!step_in_range(info.getGlobalStep()))
    return "said global step " + std::to_string(info.getGlobalStep()) + ", outside [0, 2^62]";
  if (info.getWorkerStep() != -1 && !step_in_range(info.getWorkerStep())) {
    return "said this worker's step was " + std::to_string(info.getWorkerStep()) +
           ", outside [0, 2^62]";
  }
  return "";
}

kj::Promise<kj::Own<ShardConnection>> say_hello(kj::Own<ShardConnection> conn,
                                                const HelloParams& hello) {
  auto req = hello_request(*conn, hello, false);
  return req.send().then([conn = kj::mv(conn), shared_bytes = hello.shared_memory_bytes](
                             capnp::Response<wire::Shard::HelloResults>&& reply) mutable
                         -> kj::Promise<kj::Own<ShardConnection>> {
    auto info = reply.getInfo();
    const std::string problem = hello_problem(info);
    if (!problem.empty()) {
      return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                           kj::str("psd at ", conn->address, " ", problem));
    }
    conn->max_message_bytes = info.getMaxMessageBytes();
    conn->worker_step = info.getWorkerStep();
    conn->allows_nonfinite = info.getAllowsNonfinite();
    conn->num_shards = info.getNumShards();
    conn->shard_index = info.getShardIndex();
    conn->job = job_from_wire(info.getJob());
    conn->hello_step = conn->last_step = info.getGlobalStep();
    conn->instance_id = info.getInstanceId();
    conn->empty_at_hello = info.getTensors() == 0 && info.getTables() == 0;
    conn->holds_model = !conn->empty_at_hello;
    spdlog::debug("connected to {} via {} ({}, shard {}/{})", conn->address, conn->via,
                  info.getServerVersion().cStr(), info.getShardIndex(), info.getNumShards());
    if (shared_bytes > 0 && info.getSharedMemory() && conn->via.rfind("unix:", 0) == 0) {
      return share_memory(kj::mv(conn), shared_bytes);
    }
    return kj::mv(conn);
  });
}

// A fresh connection to `via` (for the shard configured as `address`) that
// says hello.
kj::Promise<kj::Own<ShardConnection>> hello_via(kj::UnixEventPort& io, int index,
                                                std::string address, std::string via,
                                                const HelloParams& hello) {
  return kj::evalNow([&] { return connect_socket(io, via); })
      .then([via, hello](kj::Own<SocketStream> socket) {
        return secured(kj::mv(socket), via, hello);
      })
      .then(
          [index, address = std::move(address), via, hello](kj::Own<SocketStream> stream) mutable {
            return say_hello(
                open_connection(kj::mv(stream), index, std::move(address), std::move(via), hello),
                hello);
          });
}

// The outcome of asking psd where it is: a connection that said hello
// elsewhere, or none (say it on the TCP connection that asked).
struct Elsewhere {
  kj::Own<ShardConnection> conn;
};

// Over TCP to a psd on this host that also listens on a Unix socket: ask it
// where (a probe hello), then go on over the socket, which moves large
// tensors faster (docs/performance.md, "Measured results"). Anything amiss
// on that way (a socket this process cannot reach: another container, a
// stale path) leaves the TCP connection to say the real hello.
kj::Promise<kj::Own<ShardConnection>> hello_preferring_unix(kj::UnixEventPort& io,
                                                            kj::Own<ShardConnection> tcp,
                                                            const HelloParams& hello) {
  auto req = hello_request(*tcp, hello, true);
  return req.send()
      .then([&io, index = tcp->index, address = tcp->address,
             hello](capnp::Response<wire::Shard::HelloResults>&& reply) -> kj::Promise<Elsewhere> {
        auto info = reply.getInfo();
        auto found = [](kj::Own<ShardConnection> c) { return Elsewhere{kj::mv(c)}; };
        if (!info.hasHostId()) {
          // A psd from before probes took it for the real hello: this
          // connection has said hello (as a tool); a new one says it again.
          return hello_via(io, index, address, address, hello).then(found);
        }
        const std::string path = info.getUnixSocket();
        if (path.empty() || host_id().empty() || info.getHostId() != host_id().c_str())
          return Elsewhere{};
        const std::string via = "unix:" + path;
        return hello_via(io, index, address, via, hello)
            .then(found, [address, via](kj::Exception&& e) {
              spdlog::info("psd at {} is on this host but {} did not work ({}); staying on TCP",
                           address, via, e.getDescription().cStr());
              return Elsewhere{};
            });
      })
      .then([tcp = kj::mv(tcp),
             hello](Elsewhere other) mutable -> kj::Promise<kj::Own<ShardConnection>> {
        if (other.conn.get() == nullptr) return say_hello(kj::mv(tcp), hello);
        if (other.conn->via != other.conn->address) {
          const auto& arena = other.conn->arena;
          spdlog::info(
              "shard {}: psd at {} is on this host; using {}{}", other.conn->index,
              other.conn->address, other.conn->via,
              arena ? fmt::format(" and {} MiB of shared memory", arena->region().size() >> 20)
                    : "");
        }
        return kj::mv(other.conn);
      });
}

// What to check when something at `address` accepts and hangs up before hello.
std::string hung_up_hint(const std::string& address) {
  return "is " + address +
         " psd's RPC port (its --port or --ps_hosts entry, not its --http_port), and psd not "
         "shutting down?";
}

// Connect and hello, again with backoff while the peer is not there or
// hangs up during hello (a psd shutting down, or still starting): a refusal
// (bad token, wrong version, too many connections) ends it at once.
// `hung_up` is set once something at the address accepted a connection and
// closed it before answering hello: no psd is refusing there, something else
// (psd's --http_port, another program, a psd shutting down) is listening.
kj::Promise<kj::Own<ShardConnection>> connect_and_hello(kj::UnixEventPort& io, int index,
                                                        std::string address, kj::TimePoint deadline,
                                                        kj::Duration delay, HelloParams hello,
                                                        std::shared_ptr<bool> hung_up) {
  return connect_with_retry(io, address, deadline, delay)
      .then([&io, index, address, hello, hung_up](kj::Own<SocketStream> socket) {
        return secured(kj::mv(socket), address, hello)
            .then([&io, index, address, hello](kj::Own<SocketStream> stream) {
              auto conn = open_connection(kj::mv(stream), index, address, address, hello);
              // Under TLS the connection stays where its certificate was checked.
              if (!hello.prefer_unix_socket || hello.tls || address.rfind("unix:", 0) == 0)
                return say_hello(kj::mv(conn), hello);
              return hello_preferring_unix(io, kj::mv(conn), hello);
            })
            .catch_([address, hung_up](kj::Exception&& e) -> kj::Promise<kj::Own<ShardConnection>> {
              if (e.getType() != kj::Exception::Type::DISCONNECTED) return kj::mv(e);
              *hung_up = true;
              return disconnected(
                  fmt::format("{} accepted the connection but closed it before "
                              "answering hello ({}): {}",
                              address, e.getDescription().cStr(), hung_up_hint(address)));
            });
      })
      .catch_([&io, index, address, deadline, delay, hello,
               hung_up](kj::Exception&& e) -> kj::Promise<kj::Own<ShardConnection>> {
        const kj::TimePoint now = clock_now();
        if (e.getType() != kj::Exception::Type::DISCONNECTED || now + delay > deadline)
          return kj::mv(e);
        return io.getTimer()
            .atTime(now + delay)
            .then([&io, index, address, deadline, delay, hello, hung_up] {
              return connect_and_hello(io, index, address, deadline,
                                       std::min(delay * 2, 500 * kj::MILLISECONDS), hello, hung_up);
            });
      });
}

// Says every few seconds what a connection still waits for: a worker
// started before its psd would otherwise sit in silence for the whole
// connect timeout. Never resolves; the caller drops it once connected.
kj::Promise<void> say_still_waiting(kj::Timer& timer, int index, std::string address,
                                    kj::TimePoint start, std::chrono::milliseconds timeout,
                                    const char* timeout_name, std::shared_ptr<bool> hung_up) {
  constexpr kj::Duration kEvery = 5 * kj::SECONDS;
  return timer.afterDelay(kEvery).then(
      [&timer, index, address, start, timeout, timeout_name, hung_up]() {
        // Rounded: the timer counts from the loop's last look at the clock, a
        // little before `start`, so it fires a hair under each whole period.
        const int64_t waited = (clock_now() - start + kj::SECONDS / 2) / kj::SECONDS;
        spdlog::info("waiting for ps {} (shard {}): {} s of {} s ({}); {}", address, index, waited,
                     timeout.count() / 1000, timeout_name,
                     *hung_up ? "it accepts connections but closes them before answering hello: " +
                                    hung_up_hint(address)
                              : std::string("is psd running there?"));
        return say_still_waiting(timer, index, address, start, timeout, timeout_name, hung_up);
      });
}

}  // namespace

std::string shard_order_problem(const ShardConnection& c, std::size_t index, std::size_t count) {
  if (c.num_shards <= 1 && c.shard_index == 0) return "";
  if (c.num_shards == count && c.shard_index == index) return "";
  return "ps hosts out of order: psd at " + c.address + " is shard " +
         std::to_string(c.shard_index) + " of " + std::to_string(c.num_shards) +
         " (its --shard_index/--num_shards or --task_index), but ps_hosts lists " +
         std::to_string(count) + " hosts with it at position " + std::to_string(index) +
         "; every worker must list the ps hosts in the order the psds were given them";
}

kj::Promise<kj::Own<ShardConnection>> connect_shard(kj::UnixEventPort& io, int index,
                                                    std::string address,
                                                    std::chrono::milliseconds timeout,
                                                    const HelloParams& hello,
                                                    const char* timeout_name) {
  auto deadline = clock_now() + timeout.count() * kj::MILLISECONDS;
  // The retries above end at the deadline; an attempt under way would not:
  // a peer that accepts and never answers hello (a stopped psd, something
  // else on the port), or a host that drops the connection request (gone
  // from the network: the kernel retries it for minutes). It gets
  // kHelloGrace more.
  const auto waited = (timeout.count() * kj::MILLISECONDS + kHelloGrace) / kj::MILLISECONDS;
  auto hung_up = std::make_shared<bool>(false);
  return connect_and_hello(io, index, address, deadline, 20 * kj::MILLISECONDS, hello, hung_up)
      .exclusiveJoin(
          io.getTimer()
              .atTime(deadline + kHelloGrace)
              .then([address, waited]() -> kj::Promise<kj::Own<ShardConnection>> {
                return disconnected(fmt::format(
                    "psd at {} did not answer hello within {:.1f} s (the connection was not "
                    "accepted, or psd said nothing)",
                    address, waited / 1000.0));
              }))
      .exclusiveJoin(
          say_still_waiting(io.getTimer(), index, address, clock_now(), timeout, timeout_name,
                            hung_up)
              .then([]() -> kj::Promise<kj::Own<ShardConnection>> { return kj::NEVER_DONE; }));
}

}  // namespace ps
