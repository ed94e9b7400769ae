// The Cap'n Proto face of a shard: one ShardServiceImpl per connection, so
// each knows its peer (for logs) and, after hello, its worker index.
#pragma once

#include <string>

#include "ps.capnp.h"
#include "shard.h"

namespace ps {

class ShardServiceImpl final : public wire::Shard::Server {
 public:
  ShardServiceImpl(Shard& shard, std::string peer);
  ~ShardServiceImpl();

  kj::Promise<void> hello(HelloContext context) override;
  kj::Promise<void> create(CreateContext context) override;
  kj::Promise<void> pull(PullContext context) override;
  kj::Promise<void> push(PushContext context) override;
  kj::Promise<void> list(ListContext context) override;
  kj::Promise<void> stats(StatsContext context) override;

 private:
  // Runs a handler; a ps::Error becomes an RPC error carrying its message.
  template <typename F>
  kj::Promise<void> guarded(const char* what, F&& handler);

  Shard& shard_;
  std::string peer_;
  int worker_index_ = -1;
  bool said_hello_ = false;
};

}  // namespace ps
