// Who may hold psd's --max_connections places. A peer that can reach psd
// must not be able to keep the job's own workers out, so:
//  - places are kept for the job: anonymous connections (those that said
//    hello as neither a worker nor the chief: tools, probes) may hold at most
//    --max_connections minus the reserved places, where reserved is a quarter
//    of --max_connections or, once initJob declared the job's workers
//    (totalReplicas), two per worker and two for the chief, whichever is more;
//    connections before hello share the places not kept with anonymous
//    ones: once those are full, a new connection has the place of the oldest
//    connection that has not said hello;
//  - one peer address may hold at most --max_connections_per_peer
//    connections that are not (yet) a worker's or the chief's: connections
//    before hello and anonymous ones. A worker's connection stops counting
//    once its hello names it, so all the workers of a local cluster (every one
//    from 127.0.0.1) fit whatever the cap; Unix-socket peers are not capped.
// Without --auth_token_file anyone may say hello as a worker: the rules keep
// anonymous floods out, the token keeps out impostors.
//
// Event-loop thread only.
//
//   ConnectionPlaces places(1024, 64);
//   if (auto why = places.refuse_connection(host, false)) { ...refuse with *why... }
//   places.opened(host);  ...  places.said_hello(host, false, Standing::kMember); ...
//   places.closed(host, false, Standing::kMember);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace ps {

class ConnectionPlaces {
 public:
  // per_peer 0: no cap per address.
  ConnectionPlaces(uint32_t max_connections, uint32_t per_peer);

  // Why a new connection from `host` may not be served (nullopt: it may).
  // `local`: a Unix-socket peer (no cap per address).
  std::optional<std::string> refuse_connection(const std::string& host, bool local) const;
  // Whether a new connection from `host` should have the place of the
  // oldest connection that has not said hello: connections before hello and
  // anonymous ones fill every place not kept for the job, so a newcomer (a
  // worker, maybe) would otherwise take a kept place or find none. Peers
  // that never say hello (no token, say) then cannot keep the workers out.
  // False where no place is kept (fewer than 4 places) or the newcomer's
  // address is at its cap anyway.
  bool make_room_before_hello(const std::string& host, bool local, uint32_t declared_workers) const;
  // Why a hello as neither a worker nor the chief may not be served, given
  // the job's declared workers (0: not known yet).
  std::optional<std::string> refuse_anonymous_hello(uint32_t declared_workers) const;

  // Where a connection stands: counted per address until a hello names a
  // worker or the chief (a member of the job).
  enum class Standing { kBeforeHello, kAnonymous, kMember };
  void opened(const std::string& host, bool local);
  void said_hello(const std::string& host, bool local, Standing now);
  void closed(const std::string& host, bool local, Standing standing);

  uint32_t open() const { return open_; }
  uint32_t before_hello() const { return before_hello_; }
  uint32_t anonymous_helloed() const { return anonymous_helloed_; }
  uint32_t reserved(uint32_t declared_workers) const;

 private:
  const uint32_t max_connections_;
  const uint32_t per_peer_;
  uint32_t open_ = 0;
  uint32_t anonymous_helloed_ = 0;
  uint32_t before_hello_ = 0;
  bool at_peer_cap(const std::string& host, bool local) const;
  std::unordered_map<std::string, uint32_t> not_members_;  // per host: before hello, or anonymous
};

}  // namespace ps
