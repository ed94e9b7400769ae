// A psd shard served over Cap'n Proto RPC: listens on TCP (and optionally a
// Unix-domain socket), serves each connection until it closes, and stops when
// the stop promise resolves. Usable standalone (psd's main) and in-process
// (a trainer started with --job_name=ps).
//
// Example:
//   auto io = kj::setupAsyncIo();
//   ps::ServerOptions opts;  opts.port = 2222;
//   ps::PsServer server(opts, io);
//   bool saved = server.run(io.unixEventPort.onSignal(SIGTERM).ignoreResult());
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <kj/async-io.h>

#include "common/net/tls.h"
#include "server/checkpointer.h"
#include "server/shard.h"

namespace ps {

struct ServerOptions {
  std::string bind = "127.0.0.1";
  int port = 2222;          // 0 picks a free port (see port_file)
  // Where bind and port came from, for the error when psd cannot listen:
  // empty, its flags (--bind, --port); else a cluster's ps host list entry.
  std::string listen_from;
  std::string unix_socket;  // also listen on this path when set
  std::string port_file;    // write the bound TCP port here once listening
  std::optional<uint16_t>
      http_port;               // serve /metrics, /healthz and the status page; 0 picks a free port
  std::string http_port_file;  // write the bound HTTP port here (before port_file is written)
  // Non-empty: every HTTP path but /healthz needs "Authorization: Bearer
  // <token>". Empty: shard.auth_token's (the RPC token) if any.
  std::string http_auth_token;
  unsigned threads = 2;  // compute pool size; 0 = apply on the event loop
  uint32_t max_connections = 1024;
  // Connections from one address that are not a worker's or the chief's
  // (before hello, or anonymous) served at once; 0: no cap
  // (server/connection_places.h).
  uint32_t max_connections_per_peer = 64;
  // Everything a peer can make psd hold counts against this
  // (common/memory_budget.h); 0: 3/4 of the machine's memory.
  uint64_t max_memory_bytes = 0;
  // A connection that has not said hello this long after it was accepted is closed.
  unsigned hello_deadline_ms = 10000;
  // A request larger than 128 KiB must arrive within this plus a second per
  // MiB, else its connection is closed (its memory would be held meanwhile).
  unsigned request_timeout_ms = 30000;
  // After its last work, poll the sockets up to this long before sleeping
  // (common/net/busy_poll.h): the next request of a busy worker is then seen
  // without a wake-up. Adaptive: idle spells longer than this turn it off
  // until requests come close together again. 0: sleep at once.
  unsigned busy_poll_us = 50;
  // A worker's host that vanishes (no FIN: power loss, a network cut) is
  // taken for gone this long after its last sign of life, as if its
  // connection had closed (common/net/socket_stream.h, detect_dead_peer).
  // 0: Linux's defaults (no keepalive: connected for good).
  unsigned dead_peer_secs = 30;
  // TLS on the TCP port and the HTTP port (--tls_cert, --tls_key,
  // --tls_client_ca; common/net/tls.h): cert empty, plain TCP. The Unix
  // socket stays plaintext. Read at construction (ConfigError).
  TlsServerFiles tls;
  bool exit_when_done = true;  // exit once the chief said finish and the workers left
  ShardOptions shard;
  CheckpointOptions checkpoint;  // restored at start, written periodically and on stop
};

// Runs a PsServer on this thread until SIGTERM or SIGINT (or the job is
// done): what psd and a trainer's in-process ps task both do. Throws
// ConfigError when it cannot listen. Returns false when the last checkpoint,
// written on the way out, failed (logged): the state since the one before is
// lost, which a supervisor must see in the exit status.
[[nodiscard]] bool serve_until_signal(const ServerOptions& options);

class PsServer {
 public:
  PsServer(ServerOptions options, kj::AsyncIoContext& io);
  ~PsServer();

  // Serves until `stop` resolves (or the job is done, with exit_when_done).
  // Throws ConfigError when it cannot listen. Returns false when the final
  // checkpoint (with a checkpoint directory) could not be written; logged.
  [[nodiscard]] bool run(kj::Promise<void> stop);

  Shard& shard();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps
