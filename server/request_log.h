// The push and stepDone request ids a shard has recently applied, per
// requester, with the answer it gave: a request retried after a lost reply
// (or a psd restart; the log is saved with checkpoints) is answered again
// instead of applied, or counted, twice.
//
// A requester is a worker (by index), or a client without a worker index
// (by the random client id its hello gave; those that gave none share one
// window). Ids are chosen by the client (nonzero, unique per requester;
// libpsclient numbers its requests from a random base). Each window is
// bounded: an id older than the requester's last `per_window` requests is no
// longer recognised, far beyond any retry the client makes. Clients without
// an index are many and may come and go: at most `max_clients` of their
// windows are kept, the least recently used dropped first.
//
//   RequestLog log;
//   const auto who = RequestLog::requester(caller.worker_index, caller.client_id);
//   if (const RecentRequest* seen = log.find(who, id)) { answer as *seen; }
//   else { apply; log.record(who, {id, step, statuses}); }
#pragma once

#include <compare>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "common/checkpoint/checkpoint_file.h"

namespace ps {

class RequestLog {
 public:
  explicit RequestLog(std::size_t per_window = 512, std::size_t max_clients = 1024)
      : per_window_(per_window), max_clients_(max_clients) {}

  struct Requester {
    int worker = -1;      // >= 0: a worker, whatever its client id
    uint64_t client = 0;  // a client without a worker index (0: none given)
    auto operator<=>(const Requester&) const = default;
    // A client without a worker index that gave an id: its window counts
    // towards max_clients.
    bool by_client() const { return worker < 0 && client != 0; }
  };
  static Requester requester(int worker_index, uint64_t client_id) {
    return worker_index >= 0 ? Requester{worker_index, 0} : Requester{-1, client_id};
  }

  // The recorded answer for (requester, id), or nullptr.
  const RecentRequest* find(const Requester& who, uint64_t id) const;
  void record(const Requester& who, RecentRequest request);

  // For checkpoints: workers' windows (and the window of clients with no
  // id, as worker -1) and those of clients by id, oldest request first.
  void save(std::map<int, std::vector<RecentRequest>>& by_worker,
            std::map<uint64_t, std::vector<RecentRequest>>& by_client) const;
  void load(const std::map<int, std::vector<RecentRequest>>& by_worker,
            const std::map<uint64_t, std::vector<RecentRequest>>& by_client);

  std::size_t client_windows() const { return clients_; }

 private:
  struct Window {
    std::deque<RecentRequest> recent;
    uint64_t used = 0;  // when last recorded into (a counter), for dropping the least recent
  };
  std::size_t per_window_;
  std::size_t max_clients_;
  std::size_t clients_ = 0;  // windows of clients by id
  uint64_t clock_ = 0;
  std::map<Requester, Window> windows_;
};

}  // namespace ps
