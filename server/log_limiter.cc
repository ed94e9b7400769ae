#include "server/log_limiter.h"

namespace ps {

LogLimiter::LogLimiter(Clock::duration interval, unsigned per_interval, std::size_t max_peers)
    : interval_(interval), per_interval_(per_interval), max_peers_(max_peers) {}

std::string_view LogLimiter::host_of(std::string_view peer) {
  if (!peer.empty() && peer.front() == '[') {
    const auto close = peer.find(']');
    return close == std::string_view::npos ? peer : peer.substr(1, close - 1);
  }
  const auto colon = peer.rfind(':');
  return colon == std::string_view::npos ? peer : peer.substr(0, colon);
}

bool LogLimiter::allow(std::string_view peer, std::string_view kind, uint64_t* suppressed,
                       Clock::time_point now) {
  std::string host(host_of(peer));
  host.append(1, '\0').append(kind);
  auto it = peers_.find(host);
  if (it == peers_.end()) {
    if (peers_.size() >= max_peers_) {
      // Forget peers whose interval is over; if none, every one (a flood of
      // addresses costs a few extra lines, never unbounded memory).
      std::erase_if(peers_, [&](const auto& kv) { return now - kv.second.start >= interval_; });
      if (peers_.size() >= max_peers_) peers_.clear();
    }
    it = peers_.emplace(host, Entry{now, 0, 0}).first;
  }
  Entry& e = it->second;
  if (now - e.start >= interval_) {
    e.start = now;
    e.lines = 0;
  }
  if (e.lines >= per_interval_) {
    ++e.suppressed;
    return false;
  }
  ++e.lines;
  *suppressed = e.suppressed;
  e.suppressed = 0;
  return true;
}

std::string LogLimiter::note(uint64_t suppressed) {
  if (suppressed == 0) return "";
  return " (" + std::to_string(suppressed) + " similar lines about this peer left out)";
}

}  // namespace ps
