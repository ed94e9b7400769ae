// Says what a worker waits for when a call blocks longer than a few
// seconds: a thread that, while a call is marked under way, asks the shards
// what the job waits for (ShardStats::waits) and logs it every few seconds.
// The calling thread only stores two atomics per call.
//
//   WaitWatcher watch(client, worker_index);
//   watch.begin("sync step 3", limit);  client.pull(...);  watch.end();
//
// Each line says how long the call may wait at most ("waiting 10 s of 60 s",
// or "(no limit)" for a limit of 0).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "ps/client.h"

namespace ps {

class WaitWatcher {
 public:
  WaitWatcher(Client& client, int worker_index,
              std::chrono::milliseconds every = std::chrono::seconds(5));
  ~WaitWatcher();
  WaitWatcher(const WaitWatcher&) = delete;
  WaitWatcher& operator=(const WaitWatcher&) = delete;

  // `what` must outlive the call (a string literal, or a member); `limit`:
  // the longest the call may wait (0: no limit). One call at a time: a
  // second begin() replaces the first.
  void begin(const char* what, std::chrono::milliseconds limit);
  void end();

  // begin() now and end() when the scope ends (a throw included); a null
  // watcher: nothing.
  class Scope {
   public:
    Scope(WaitWatcher* watch, const char* what, std::chrono::milliseconds limit) : watch_(watch) {
      if (watch_) watch_->begin(what, limit);
    }
    ~Scope() {
      if (watch_) watch_->end();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WaitWatcher* watch_;
  };

 private:
  void run();

  Client& client_;
  const int worker_;
  const std::chrono::milliseconds every_;
  std::atomic<const char*> what_{nullptr};
  std::atomic<int64_t> since_ns_{0};
  std::atomic<int64_t> limit_ms_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ps
