// One psd shard's request handling: validates every request in full before
// touching state, then applies it. Runs on the KJ event-loop thread; the
// arithmetic of large updates goes to the ComputePool.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include <kj/async.h>

#include "compute_pool.h"
#include "ps.capnp.h"
#include "tensor_store.h"

namespace ps {

struct ShardOptions {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  bool allow_nonfinite = false;            // accept NaN/Inf gradients (refused by default)
  uint64_t inline_bytes = 256u << 10;      // smaller updates and reads run on the event loop
  uint64_t max_message_bytes = 80u << 20;  // advertised to clients; enforced by the RPC reader
  StoreLimits limits;
};

// Counters read by stats() and the metrics endpoint; updated on any thread.
struct ShardCounters {
  std::atomic<uint64_t> pushes{0};
  std::atomic<uint64_t> pulls{0};
  std::atomic<uint64_t> creates{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> stale{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint32_t> connections{0};
};

class Shard {
 public:
  Shard(ShardOptions options, ComputePool& pool);

  // Each throws RequestError (nothing changed) for bad input.
  void create(wire::Shard::CreateParams::Reader params, wire::Shard::CreateResults::Builder results);
  kj::Promise<void> pull(wire::Shard::PullParams::Reader params, wire::Shard::PullResults::Builder results);
  kj::Promise<void> push(wire::Shard::PushParams::Reader params, wire::Shard::PushResults::Builder results);
  void list(wire::Shard::ListResults::Builder results) const;
  void stats(wire::ShardStats::Builder out) const;
  void info(wire::ShardInfo::Builder out) const;

  int64_t global_step() const { return global_step_; }
  const ShardOptions& options() const { return options_; }
  TensorStore& store() { return store_; }
  ShardCounters& counters() { return counters_; }

 private:
  kj::Promise<void> wait_for_step(int64_t step);

  ShardOptions options_;
  ComputePool& pool_;
  TensorStore store_;
  ShardCounters counters_;
  int64_t global_step_ = 0;
  std::multimap<int64_t, kj::Own<kj::PromiseFulfiller<void>>> step_waiters_;
};

}  // namespace ps
