#include "server/connection_places.h"

#include <algorithm>

namespace ps {

ConnectionPlaces::ConnectionPlaces(uint32_t max_connections, uint32_t per_peer)
    : max_connections_(max_connections), per_peer_(per_peer) {}

uint32_t ConnectionPlaces::reserved(uint32_t declared_workers) const {
  const uint64_t for_job = declared_workers > 0 ? 2 * (uint64_t{declared_workers} + 1) : 0;
  return static_cast<uint32_t>(
      std::min<uint64_t>(std::max<uint64_t>(max_connections_ / 4, for_job), max_connections_));
}

std::optional<std::string> ConnectionPlaces::refuse_connection(const std::string& host,
                                                               bool local) const {
  if (open_ >= max_connections_) {
    return "psd is serving its maximum of " + std::to_string(max_connections_) +
           " connections (--max_connections); try again later";
  }
  if (at_peer_cap(host, local)) {
    return "psd is serving the maximum of " + std::to_string(per_peer_) + " connections from " +
           host +
           " that are not a worker's or the chief's (--max_connections_per_peer); try again "
           "later";
  }
  return std::nullopt;
}

bool ConnectionPlaces::at_peer_cap(const std::string& host, bool local) const {
  if (local || per_peer_ == 0) return false;
  auto it = not_members_.find(host);
  return it != not_members_.end() && it->second >= per_peer_;
}

bool ConnectionPlaces::make_room_before_hello(const std::string& host, bool local,
                                              uint32_t declared_workers) const {
  const uint32_t kept = reserved(declared_workers);
  return kept > 0 && before_hello_ > 0 && !at_peer_cap(host, local) &&
         before_hello_ + anonymous_helloed_ >= max_connections_ - kept;
}

std::optional<std::string> ConnectionPlaces::refuse_anonymous_hello(
    uint32_t declared_workers) const {
  const uint32_t room = max_connections_ - reserved(declared_workers);
  if (anonymous_helloed_ >= room) {
    return "hello: psd serves at most " + std::to_string(room) +
           " connections that are neither a worker's nor the " +
           "chief's (the other places of --max_connections are kept for the job's workers); try "
           "again later";
  }
  return std::nullopt;
}

void ConnectionPlaces::opened(const std::string& host, bool local) {
  ++open_;
  ++before_hello_;
  if (!local) ++not_members_[host];
}

void ConnectionPlaces::said_hello(const std::string& host, bool local, Standing now) {
  --before_hello_;
  if (now == Standing::kAnonymous) {
    ++anonymous_helloed_;
  } else if (now == Standing::kMember && !local) {
    auto it = not_members_.find(host);
    if (it != not_members_.end() && --it->second == 0) not_members_.erase(it);
  }
}

void ConnectionPlaces::closed(const std::string& host, bool local, Standing standing) {
  --open_;
  if (standing == Standing::kAnonymous) --anonymous_helloed_;
  if (standing == Standing::kBeforeHello) --before_hello_;
  if (standing != Standing::kMember && !local) {
    auto it = not_members_.find(host);
    if (it != not_members_.end() && --it->second == 0) not_members_.erase(it);
  }
}

}  // namespace ps
