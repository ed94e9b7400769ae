#include "server/request_log.h"

namespace ps {

const RecentRequest* RequestLog::find(int worker, uint64_t id) const {
  auto it = recent_.find(worker);
  if (it == recent_.end()) return nullptr;
  // Newest first: a retry is almost always of one of the last few pushes.
  for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) {
    if (r->id == id) return &*r;
  }
  return nullptr;
}

void RequestLog::record(int worker, RecentRequest request) {
  auto& window = recent_[worker];
  window.push_back(std::move(request));
  while (window.size() > per_worker_) window.pop_front();
}

std::map<int, std::vector<RecentRequest>> RequestLog::save() const {
  std::map<int, std::vector<RecentRequest>> out;
  for (const auto& [worker, window] : recent_) out[worker].assign(window.begin(), window.end());
  return out;
}

void RequestLog::load(const std::map<int, std::vector<RecentRequest>>& saved) {
  recent_.clear();
  for (const auto& [worker, list] : saved) {
    for (const auto& r : list) record(worker, r);
  }
}

}  // namespace ps
