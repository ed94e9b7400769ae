// The shards a blocking call has asked and not yet heard from, and the line
// that names them while the call waits: a pull or push with no answer for
// 5 s says so, and again every 10 s, naming the call, those shards with
// their addresses, the time waited and the limit (ClientOptions::call_timeout):
//
//   pull: waiting 5 s of 300 s (ClientOptions::call_timeout) for psd's answer from shard 1
//   (10.0.0.2:2222)
//
// A pull in sync mode rightly waits for its step there: the line says the
// call waits, not that anything is wrong (psd's log says what it waits for).
// Loop thread only (client_loop.h).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <kj/async.h>

#include "common/net/client_loop.h"

namespace ps {

class Unanswered {
 public:
  // One request to shard `index`, counted from construction until
  // answered() or destruction (a call given up), whichever comes first.
  class Mark {
   public:
    Mark(Unanswered& calls, int index) : calls_(calls), index_(index) { ++calls_.pending_[index_]; }
    ~Mark() { answered(); }
    Mark(const Mark&) = delete;
    Mark& operator=(const Mark&) = delete;
    void answered() {
      if (done_) return;
      done_ = true;
      if (--calls_.pending_[index_] == 0) calls_.pending_.erase(index_);
    }

   private:
    Unanswered& calls_;
    const int index_;
    bool done_ = false;
  };

  // Shards with a request not yet answered, in index order.
  std::vector<int> shards() const;

 private:
  std::map<int, int> pending_;
};

// What a call given up at ClientOptions::call_timeout (`limit`) fails
// with: DISCONNECTED, "no answer from psd within N ms (ClientOptions::call_timeout)".
kj::Exception call_timeout_error(std::chrono::milliseconds limit);

// "pull: waiting 5 s of 300 s (ClientOptions::call_timeout) ": how every
// blocking call's wait line begins, `waited` seconds into a call limited to
// `limit` (0: none).
std::string waiting_prefix(const std::string& context, int64_t waited,
                           std::chrono::milliseconds limit);

// The wait line (above) for `context` ("pull: "), `waited` seconds into a
// call limited to `limit` (0: none), waiting on `shards` of `hosts`
// (ClientOptions::ps_hosts).
std::string still_waiting_line(const std::string& context, int64_t waited,
                               std::chrono::milliseconds limit, const std::vector<int>& shards,
                               const std::vector<std::string>& hosts);

// One timer chain per blocking call: logs still_waiting_line 5 s after
// `start`, then every 10 s, and fails with call_timeout's error ("no answer
// from psd within N ms (ClientOptions::call_timeout)", DISCONNECTED) once
// `limit` (0: none) has passed; never resolves otherwise (join it with the
// call: it ends when the call does). `calls`, `context` and `hosts` must
// outlive it.
// `quiet`: a hold psd may rightly make (waitReady's, a barrier's timeout),
// during which no line is said.
// `say`: false for a call made under QuietWaitLines (its limit only).
kj::Promise<void> watch_call(ClientLoop& loop, const Unanswered& calls, const std::string& context,
                             std::chrono::milliseconds limit, const std::vector<std::string>& hosts,
                             kj::TimePoint start, kj::Duration quiet = 0 * kj::SECONDS,
                             bool say = true);

// While one lives, the blocking calls of its thread say no wait lines: a
// WaitWatcher's own probes (the call it watches says them).
class QuietWaitLines {
 public:
  QuietWaitLines();
  ~QuietWaitLines();
  QuietWaitLines(const QuietWaitLines&) = delete;
  QuietWaitLines& operator=(const QuietWaitLines&) = delete;
  static bool active();

 private:
  bool before_;
};

}  // namespace ps
