// The Cap'n Proto face of a shard: one ShardServiceImpl per connection, so
// each knows its peer (for logs) and, after hello, its worker index.
#pragma once

#include <functional>
#include <string>

#include "common/net/connection_control.h"
#include "schema/ps.capnp.h"
#include "server/log_limiter.h"
#include "server/shard.h"

namespace ps {

// What the server that runs a connection decides for it (server.cc).
struct ConnectionRules {
  // A connection that has not said hello this long after it was accepted is
  // closed: each holds one of --max_connections' places, and a peer that
  // says nothing (or has no token) must not be able to keep them all.
  kj::Duration hello_deadline = 10 * kj::SECONDS;
  // A peer whose calls are refused this many times in a row is cut off
  // (0: never): a flood of bad calls costs psd work and log, and serves no one.
  uint32_t max_refused_in_a_row = 100;
  LogLimiter* log = nullptr;  // rate-limits the lines about this peer; null: every line
  // Before a hello is accepted (its token checked): throws RequestError to
  // refuse it, nothing changed. After it was accepted: on_hello.
  std::function<void(const Caller&)> admit_hello;
  std::function<void(const Caller&)> on_hello;
};

class ShardServiceImpl final : public wire::Shard::Server {
 public:
  // A non-empty `refusal` answers every call with that message (a
  // connection past --max_connections).
  // `connection`: the socket's, when there is one: pull replies then send
  // large tensors straight from their memory, held until written
  // (ConnectionControl::hold_until_sent).
  // `peer_pid`: the peer process on psd's Unix socket (0: a TCP peer), for attachMemory.
  ShardServiceImpl(Shard& shard, std::string peer, std::string refusal = "",
                   ConnectionControl* connection = nullptr, pid_t peer_pid = 0,
                   ConnectionRules rules = {});
  ~ShardServiceImpl();

  kj::Promise<void> hello(HelloContext context) override;
  kj::Promise<void> create(CreateContext context) override;
  kj::Promise<void> pull(PullContext context) override;
  kj::Promise<void> push(PushContext context) override;
  kj::Promise<void> list(ListContext context) override;
  kj::Promise<void> stats(StatsContext context) override;
  kj::Promise<void> initJob(InitJobContext context) override;
  kj::Promise<void> setReady(SetReadyContext context) override;
  kj::Promise<void> waitReady(WaitReadyContext context) override;
  kj::Promise<void> stepDone(StepDoneContext context) override;
  kj::Promise<void> barrier(BarrierContext context) override;
  kj::Promise<void> finish(FinishContext context) override;
  kj::Promise<void> report(ReportContext context) override;
  kj::Promise<void> checkpoint(CheckpointContext context) override;
  kj::Promise<void> attachMemory(AttachMemoryContext context) override;
  // Embedding tables: requests turned into plain values (server/table_requests.h).
  kj::Promise<void> createTables(CreateTablesContext context) override;
  kj::Promise<void> pullRows(PullRowsContext context) override;
  kj::Promise<void> pushRows(PushRowsContext context) override;
  kj::Promise<void> listTables(ListTablesContext context) override;
  kj::Promise<void> restoreRows(RestoreRowsContext context) override;

 private:
  // Runs a handler; a ps::Error becomes an RPC error carrying its message.
  template <typename F>
  kj::Promise<void> guarded(RequestKind kind, F&& handler);

  void require_hello(const char* what) const;
  // Logs a refused call (rate-limited) and cuts the peer off after a run of them.
  void note_refused(const char* what, const char* message);
  // Whether a line of `kind` about this peer may be logged now; `note` gets the count left out.
  bool may_log(const char* kind, std::string* note);

  // Checks the hello's token (constant time); throws RequestError.
  void check_token(capnp::Data::Reader token) const;
  // A row request's slice of this connection's shared memory, as floats:
  // throws RequestError (naming `what`) unless it lies inside the region and
  // is whole float32s at a float32 boundary.
  float* shared_rows(wire::SharedSlice::Reader slice, const char* what) const;

  Shard& shard_;
  std::weak_ptr<void> shard_alive_;  // Shard::lifetime()
  ConnectionControl* connection_;    // null: replies are always copied
  Caller caller_;
  bool said_hello_ = false;
  kj::Promise<void> hello_deadline_ = nullptr;
  std::string refusal_;
  uint64_t tensors_created_ = 0;  // by this connection (--max_tensors_per_client)
  ConnectionRules rules_;
  uint32_t refused_in_a_row_ = 0;
};

}  // namespace ps
