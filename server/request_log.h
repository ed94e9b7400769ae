// The push and stepDone request ids a shard has recently applied, per
// worker, with the answer it gave: a request retried after a lost reply (or
// a psd restart; the log is saved with checkpoints) is answered again
// instead of applied, or counted, twice.
//
// Ids are chosen by the client (nonzero, unique per worker; libpsclient
// numbers its requests from a random base). The window is bounded: an id
// older than the last `per_worker` requests of that worker is no longer
// recognised, which is far beyond any retry the client makes.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "common/checkpoint/checkpoint_file.h"

namespace ps {

class RequestLog {
 public:
  explicit RequestLog(std::size_t per_worker = 512) : per_worker_(per_worker) {}

  // The recorded answer for (worker, id), or nullptr.
  const RecentRequest* find(int worker, uint64_t id) const;
  void record(int worker, RecentRequest request);

  std::map<int, std::vector<RecentRequest>> save() const;
  void load(const std::map<int, std::vector<RecentRequest>>& saved);

 private:
  std::size_t per_worker_;
  std::map<int, std::deque<RecentRequest>> recent_;
};

}  // namespace ps
