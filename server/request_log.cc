#include "server/request_log.h"

#include <algorithm>

namespace ps {

const RecentRequest* RequestLog::find(const Requester& who, uint64_t id) const {
  auto it = windows_.find(who);
  if (it == windows_.end()) return nullptr;
  // Newest first: a retry is almost always of one of the last few pushes.
  const auto& recent = it->second.recent;
  for (auto r = recent.rbegin(); r != recent.rend(); ++r) {
    if (r->id == id) return &*r;
  }
  return nullptr;
}

void RequestLog::record(const Requester& who, RecentRequest request) {
  auto it = windows_.find(who);
  if (it == windows_.end()) {
    if (who.by_client() && clients_ >= max_clients_) {
      // A linear scan, only when a new client's window would pass the bound.
      auto oldest = windows_.end();
      for (auto w = windows_.begin(); w != windows_.end(); ++w) {
        if (w->first.by_client() &&
            (oldest == windows_.end() || w->second.used < oldest->second.used))
          oldest = w;
      }
      windows_.erase(oldest);
      --clients_;
    }
    it = windows_.emplace(who, Window{}).first;
    if (who.by_client()) ++clients_;
  }
  Window& window = it->second;
  window.used = ++clock_;
  window.recent.push_back(std::move(request));
  while (window.recent.size() > per_window_) window.recent.pop_front();
}

void RequestLog::save(std::map<int, std::vector<RecentRequest>>& by_worker,
                      std::map<uint64_t, std::vector<RecentRequest>>& by_client) const {
  for (const auto& [who, window] : windows_) {
    auto& out = who.by_client() ? by_client[who.client] : by_worker[who.worker];
    out.assign(window.recent.begin(), window.recent.end());
  }
}

void RequestLog::load(const std::map<int, std::vector<RecentRequest>>& by_worker,
                      const std::map<uint64_t, std::vector<RecentRequest>>& by_client) {
  windows_.clear();
  clients_ = 0;
  clock_ = 0;
  for (const auto& [worker, list] : by_worker) {
    for (const auto& r : list) record(requester(worker, 0), r);
  }
  for (const auto& [client, list] : by_client) {
    for (const auto& r : list) record(requester(-1, client), r);
  }
}

}  // namespace ps
