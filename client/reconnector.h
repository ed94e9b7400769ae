// Reconnection for libpsclient: a call to a shard that fails because the
// connection broke (DISCONNECTED: psd killed, restarted, network cut) is
// retried on a new connection.
//
// All calls that saw the same broken connection share one reconnection,
// which retries with backoff (connect_shard: 20 ms doubling to 500 ms) until
// ClientOptions::reconnect_timeout; past it the calls fail with
// ConnectionError. A call is retried at most a few times.
//
// What a retry means, per call:
//  - push: sent again with the same request id; a shard that already applied
//    it answers without applying it again (server/request_log.h). A shard
//    that restarted from a checkpoint older than the push did not apply it
//    (or lost it with the restart) and applies it once.
//  - pull, list, stats, create, initJob, setReady, waitReady, finish,
//    checkpoint: idempotent, simply sent again.
//  - stepDone: sent again with the same request id, counted once, as a
//    push (a psd restarted from a checkpoint without it counts it then).
//  - barrier: sent again; an arrival is lost with a restarted psd's memory.
//    Acceptable for what it drives (a start-up rendezvous).
// When the shard came back at an older global step than this client had
// seen (restored from a checkpoint), or is another psd process than before
// (ShardInfo.instanceId: restarted, so what this client sent after its last
// checkpoint may be lost, even where the step is the one last seen), the
// connection is marked rolled_back and catching_up (the latter kept across
// reconnections to the same psd, cleared once a sync read finds it at the
// others' step), and rollbacks() goes up: a retried pull
// reads the step the shard has instead of waiting for one it may never
// reach, TrainingSession goes on from there, and a retried sync push for a
// step the shard has not reached is reported stale (see client_transfer.cc).
//
// Lives on the client's event loop (client_loop.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <capnp/capability.h>
#include <kj/async-io.h>

#include "client/shard_connection.h"

namespace ps {

template <typename T>
struct AsPromise {
  using type = T;
};
template <typename T>
struct AsPromise<capnp::RemotePromise<T>> {
  using type = kj::Promise<capnp::Response<T>>;
};

class Reconnector {
 public:
  Reconnector(kj::UnixEventPort& io, std::vector<kj::Own<ShardConnection>>& shards,
              HelloParams hello, std::chrono::milliseconds timeout);
  ~Reconnector();

  // Runs fn(connection, attempt) on shard `index` (attempt 0 first), again
  // on a new connection when it fails with DISCONNECTED.
  template <typename Fn>
  auto call(int index, Fn fn, int attempt = 0) ->
      typename AsPromise<decltype(fn(kj::instance<ShardConnection&>(), 0))>::type {
    using P = typename AsPromise<decltype(fn(kj::instance<ShardConnection&>(), 0))>::type;
    ShardConnection& c = *shards_[index];
    const uint64_t generation = c.generation;
    P p = kj::evalNow([&]() -> P { return fn(c, attempt); });
    if (timeout_.count() <= 0) return p;
    return p.catch_(
        [this, index, fn = kj::mv(fn), generation, attempt](kj::Exception&& e) mutable -> P {
          if (e.getType() != kj::Exception::Type::DISCONNECTED || attempt >= kMaxAttempts)
            return kj::mv(e);
          return reconnect(index, generation, e)
              .then([this, index, fn = kj::mv(fn), attempt]() mutable {
                return call(index, kj::mv(fn), attempt + 1);
              });
        });
  }

  // As call(), for a request psd recognises by its id when it is retried
  // (push, pushRows, stepDone). psd remembers a worker's last 512 ids
  // (server/request_log.h); a retry of an id it has forgotten would be
  // applied again. So at most kMaxIdentifiedInFlight such calls are under
  // way to one shard, half psd's window; the rest wait their turn, in order.
  template <typename Fn>
  auto call_identified(int index, Fn fn) ->
      typename AsPromise<decltype(fn(kj::instance<ShardConnection&>(), 0))>::type {
    return turn(index).then([this, index, fn = kj::mv(fn)](kj::Own<Turn> turn) mutable {
      // The turn is handed on however the call ends (a cancelled one too).
      return call(index, kj::mv(fn)).attach(kj::mv(turn));
    });
  }
  static constexpr unsigned kMaxIdentifiedInFlight = 256;

  // Times a shard was found to have gone back to an older step.
  uint64_t rollbacks() const { return rollbacks_.load(); }

 private:
  static constexpr int kMaxAttempts = 4;

  // A turn among kMaxIdentifiedInFlight to shard `index`, handed on to the
  // next call waiting (or given back) when the Turn is destroyed: also when
  // it was handed to a call cancelled before it could start.
  class Turn {
   public:
    Turn(Reconnector& r, int index) : r_(r), index_(index) {}
    ~Turn() { r_.hand_on_turn(index_); }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    Reconnector& r_;
    int index_;
  };
  kj::Promise<kj::Own<Turn>> turn(int index);
  void hand_on_turn(int index);
  struct Turns {
    unsigned taken = 0;
    std::deque<kj::Own<kj::PromiseFulfiller<kj::Own<Turn>>>> waiting;
  };

  kj::Promise<void> reconnect(int index, uint64_t generation, const kj::Exception& cause);

  struct Pending {
    uint64_t generation = 0;
    bool done = true;
    kj::Maybe<kj::ForkedPromise<void>> fork;
  };

  kj::UnixEventPort& io_;
  std::vector<kj::Own<ShardConnection>>& shards_;
  HelloParams hello_;
  std::chrono::milliseconds timeout_;
  std::vector<Pending> pending_;
  std::vector<Turns> turns_;
  std::vector<kj::Own<ShardConnection>> retired_;  // broken connections, dropped later
  std::atomic<uint64_t> rollbacks_{0};
};

}  // namespace ps
