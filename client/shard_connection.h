// One client connection to one psd shard, living on the client's event-loop
// thread: connect with retry until a deadline, then hello.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>

#include "common/net/client_message_stream.h"
#include "schema/ps.capnp.h"
#include "common/net/shared_arena.h"
#include "common/net/tls.h"
#include "ps/job.h"

namespace ps {

struct ShardConnection {
  int index = 0;
  std::string address;  // as configured (ClientOptions::ps_hosts)
  std::string via;      // what this connection went to: address, or "unix:PATH" (psd on this host)
  // Pull replies land in the caller's buffers; owns the socket, which the
  // call layer sees only as messages->connection().
  kj::Own<ClientMessageStream> messages;
  kj::Own<capnp::TwoPartyVatNetwork> network;
  kj::Own<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpc;
  wire::Shard::Client shard{nullptr};
  uint64_t max_message_bytes = 0;
  bool allows_nonfinite = false;  // psd --allow_nonfinite (ShardInfo.allowsNonfinite)
  uint32_t num_shards = 0;
  uint32_t shard_index = 0;
  JobConfig job;             // as the shard knew it at hello
  int64_t worker_step = -1;  // ShardInfo.workerStep at hello
  // Reconnection (reconnector.h): which connection to this shard this is,
  // which psd process answered it, the global step the shard had at hello,
  // the newest step any reply on this connection carried, and whether the
  // shard may have lost what this client sent or saw before (it restarted:
  // another process, or one back at an older step than seen).
  uint64_t generation = 0;
  uint64_t instance_id =
      0;  // ShardInfo.instanceId: another one on reconnection means psd restarted
  int64_t hello_step = 0;
  bool empty_at_hello = true;  // ShardInfo: no tensors and no tables
  // This shard is known to hold the model: tensors or tables at hello, a create of
  // this client's answered, or psd saying it is ready. A restart that finds
  // it empty lost the model (Reconnector). Loop thread only.
  bool holds_model = false;
  int64_t last_step = 0;
  bool rolled_back = false;
  // Restarted and not yet read at the others' step: sync reads take it as
  // it is (kept across reconnections to the same psd).
  bool catching_up = false;
  // Memory shared with psd (a Unix-socket connection psd let attach one);
  // null: everything goes over the socket.
  std::shared_ptr<SharedArena> arena;
};

// Who this client is, said in every hello, and how its connections are made.
struct HelloParams {
  int worker_index = -1;
  uint64_t client_id = 0;  // random per Client: psd's request-id window for a client with no index
  bool is_chief = false;
  std::string auth_token;
  bool prefer_unix_socket = true;          // ClientOptions::prefer_unix_socket
  uint64_t shared_memory_bytes = 0;        // ClientOptions::shared_memory_bytes
  std::chrono::milliseconds dead_peer{0};  // ClientOptions::dead_peer_timeout
  // ClientOptions::tls_ca and the rest: TCP connections are TLS (null: plain).
  std::shared_ptr<TlsClient> tls;
  std::string tls_server_name;  // empty: the host part of each address
};

// Placement sends tensor parts by position in ps_hosts, so a worker that
// lists the psds in another order than they were started with would put
// the same tensor on another psd than its peers do, and train a model
// nobody else sees. A psd that knows its place (started with
// --shard_index/--num_shards, or --ps_hosts/--task_index) says it at
// hello; one started with neither (shard 0 of 1) cannot tell. Empty when
// `c` may be shard `index` of `count`, else why not.
std::string shard_order_problem(const ShardConnection& c, std::size_t index, std::size_t count);

// Connects to `address` ("host:port" or "unix:/path"), retrying with backoff
// until `timeout` has passed, then says hello. Rejects with a DISCONNECTED
// kj::Exception naming the address and the last error, at the latest
// kHelloGrace after `timeout` (a peer that accepts and never answers).
// While it waits it says so every 5 s, naming `timeout_name`, the setting
// the timeout came from.
constexpr kj::Duration kHelloGrace = 5 * kj::SECONDS;
kj::Promise<kj::Own<ShardConnection>> connect_shard(kj::UnixEventPort& io, int index,
                                                    std::string address,
                                                    std::chrono::milliseconds timeout,
                                                    const HelloParams& hello,
                                                    const char* timeout_name = "connect_timeout");

// A DISCONNECTED exception (a shard unreachable or gone) with this message.
kj::Exception disconnected(std::string message);

}  // namespace ps
