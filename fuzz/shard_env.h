// What a ps::Shard needs in a fuzz target, made once per process: an event
// loop (its timer, and a wait scope for what it defers) and a compute pool with no threads, so
// every update runs inline and each input's outcome is deterministic. Never freed: LeakSanitizer
// sees them reachable.
//
//   ps::Shard shard(options, ps::fuzz::pool(), ps::fuzz::timer());
#pragma once

#include <kj/async-io.h>

#include "server/compute_pool.h"

namespace ps::fuzz {

inline kj::AsyncIoContext& io() {
  static kj::AsyncIoContext* io = new kj::AsyncIoContext(kj::setupAsyncIo());
  return *io;
}

inline kj::Timer& timer() { return io().provider->getTimer(); }

inline ComputePool& pool() {
  static ComputePool* p = new ComputePool(0);
  return *p;
}

}  // namespace ps::fuzz
