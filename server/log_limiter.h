// Rate-limits psd's log lines about one peer: a flood of refused calls from
// one address writes a few lines per interval (the next one with a count of
// the lines left out), not one per call. Peers are told apart by host, not
// port, so reconnecting does not reset the count; each kind of line has its
// own count, so a flood of one kind does not hide the others. Event-loop
// thread only.
//
//   LogLimiter limiter(std::chrono::seconds(10));
//   uint64_t suppressed = 0;
//   if (limiter.allow(peer, "refused", &suppressed))
//     spdlog::info("refused ... from {}{}", peer, LogLimiter::note(suppressed));
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace ps {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  // `per_interval` lines per peer per `interval`; at most `max_peers` peers
  // remembered (past that the oldest entries are forgotten).
  explicit LogLimiter(Clock::duration interval = std::chrono::seconds(10),
                      unsigned per_interval = 5, std::size_t max_peers = 4096);

  // Whether a line of `kind` about `peer` ("host:port", "[v6]:port" or a
  // name) may be written now; if so, `*suppressed` is the number left out before it.
  bool allow(std::string_view peer, std::string_view kind, uint64_t* suppressed,
             Clock::time_point now = Clock::now());

  // " (N similar lines about this peer left out)", or "" for 0.
  static std::string note(uint64_t suppressed);

  // The host part of a peer name.
  static std::string_view host_of(std::string_view peer);

 private:
  struct Entry {
    Clock::time_point start;
    unsigned lines = 0;
    uint64_t suppressed = 0;
  };
  const Clock::duration interval_;
  const unsigned per_interval_;
  const std::size_t max_peers_;
  std::unordered_map<std::string, Entry> peers_;
};

}  // namespace ps
