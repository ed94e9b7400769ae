// The compute side of psd: an Asio thread pool that applies updates, with a
// strand per tensor key so updates to one tensor stay ordered while
// different tensors run in parallel. Work is handed in from the KJ event loop
// and its completion comes back to that loop as a kj::Promise, so the loop
// never blocks on arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <kj/async.h>

namespace ps {

class ComputePool {
 public:
  // threads == 0 runs every task inline on the caller's thread.
  explicit ComputePool(unsigned threads, unsigned strands = 64);
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  // Runs fn() on the strand for `key`; the promise resolves on the calling
  // KJ thread when fn() has finished (rejects with fn's exception).
  kj::Promise<void> run(uint64_t key, std::function<void()> fn);

  // Calls fn(0) .. fn(parts - 1) on the calling thread and on up to
  // `helpers` pool threads (at most threads()) at once, returning (on the
  // caller) once every call has returned. The caller takes parts too, so a
  // pool busy with other work only means the caller does more of them; a
  // helper that starts after the last part was taken does nothing. fn must
  // not throw. For one large piece of work the caller waits for anyway (an
  // embedding table's pull or push, whose rows fall into independent parts).
  void run_parts(std::size_t parts, unsigned helpers, const std::function<void(std::size_t)>& fn);

  unsigned threads() const { return threads_; }
  void join();  // waits for queued work; later run() calls execute inline

 private:
  unsigned threads_;
  asio::thread_pool pool_;
  std::vector<asio::strand<asio::thread_pool::executor_type>> strands_;
  bool joined_ = false;
};

}  // namespace ps
