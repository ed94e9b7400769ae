// JobState: the waits it holds, as lines for people (psd's log, the status
// page, stats' waits): barriers, pulls held for a step or for the slowest
// worker, and psd's exit once the job is done. Each line says what is
// awaited, from whom, for how long, and what bounds or ends the wait.
#include <algorithm>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "server/job_state.h"

namespace ps {

std::string JobState::missing_workers(const std::vector<int>& present) const {
  std::vector<int> here = present;
  std::sort(here.begin(), here.end());
  std::string out;
  uint32_t unnamed = 0;
  for (uint32_t i = 0; i < config_.total_replicas; ++i) {
    const int w = static_cast<int>(i);
    if (std::binary_search(here.begin(), here.end(), w)) continue;
    if (out.size() >= kMaxWaitLine) {
      ++unnamed;
      continue;
    }
    auto it = workers_.find(w);
    const char* why = it == workers_.end() || it->second.given_up ? "never connected"
                      : it->second.connections == 0               ? "disconnected"
                      : it->second.hung                           ? "silent"
                                                                  : "connected, not there yet";
    out += (out.empty() ? "" : ", ") + std::to_string(w) + " (" + why + ")";
  }
  if (unnamed > 0) out += " and " + std::to_string(unnamed) + " more";
  return out;
}

std::vector<std::string> JobState::barrier_waits(kj::Duration older_than) {
  std::vector<std::string> out;
  const kj::TimePoint now = timer_.now();
  std::size_t unsaid = 0;
  for (auto& [name, b] : barriers_) {
    drop_abandoned(b);
    if (b.waiting.empty() || now - b.since < older_than) continue;
    if (out.size() >= kMaxBarrierLines) {
      ++unsaid;
      continue;
    }
    std::vector<int> here;
    std::string has;
    for (int w : b.who) {
      if (w < 0) continue;
      here.push_back(w);
      if (has.size() < kMaxWaitLine) has += (has.empty() ? "" : ", ") + std::to_string(w);
    }
    if (has.size() >= kMaxWaitLine) has += ", ...";
    const std::string missing = missing_workers(here);
    out.push_back(
        fmt::format("barrier '{}' waits for {} callers, has {} (workers {}){}; {} s of {} s", name,
                    b.count, b.waiting.size(), has.empty() ? "none" : has,
                    missing.empty() ? "" : "; missing workers " + missing,
                    (now - b.since) / kj::SECONDS, b.timeout / kj::SECONDS));
  }
  if (unsaid > 0) out.push_back(fmt::format("and {} more barriers wait", unsaid));
  return out;
}

std::string JobState::held_pulls(std::multimap<int64_t, HeldPull>& waiters, kj::Duration older_than,
                                 int64_t& first) {
  const kj::TimePoint now = timer_.now();
  std::set<std::pair<int, int64_t>> said;
  std::string out;
  uint32_t unnamed = 0;
  for (auto& [step, held] : waiters) {
    if (!held.fulfiller->isWaiting() || now - held.since < older_than) continue;
    if (!said.insert({held.worker, step}).second) continue;
    if (said.size() == 1) first = step;
    if (out.size() >= kMaxWaitLine) {
      ++unnamed;
      continue;
    }
    out += fmt::format("{}{} (for step {}, {} s)", out.empty() ? "" : ", ",
                       held.worker >= 0 ? std::to_string(held.worker) : "(no index)", step,
                       (now - held.since) / kj::SECONDS);
  }
  if (unnamed > 0) out += fmt::format(" and {} more", unnamed);
  return out;
}

std::vector<std::string> JobState::staleness_waits(kj::Duration older_than) {
  int64_t first = 0;
  const std::string pulls = held_pulls(staleness_waiters_, older_than, first);
  if (pulls.empty()) return {};
  const int64_t slowest = slowest_live_step();
  std::string slow;
  for (const auto& [i, w] : workers_) {
    if (w.connections == 0 || w.step != slowest) continue;
    if (slow.size() >= kMaxWaitLine) {
      slow += ", ...";
      break;
    }
    slow += (slow.empty() ? "" : ", ") + std::to_string(i);
  }
  const auto bound = static_cast<int64_t>(config_.max_staleness);
  return {fmt::format(
      "bounded staleness: pulls of workers {} wait for the slowest, workers {} (at step {}): "
      "max_staleness is {} (the chief's JobConfig::max_staleness, trainers' --max_staleness); "
      "the first goes on when the slowest reach step {} or disconnect",
      pulls, slow.empty() ? "none connected" : slow, slowest, bound, first - bound)};
}

std::vector<std::string> JobState::unstarted_step_waits(kj::Duration older_than) {
  int64_t first = 0;
  const std::string pulls = held_pulls(step_waiters_, older_than, first);
  if (pulls.empty()) return {};
  const std::string missing = missing_workers({});
  return {fmt::format(
      "sync pulls of workers {} wait for step {}, which has no gradient yet: workers {} have not "
      "pushed for it; a pull gives up at its client's ClientOptions::call_timeout",
      pulls, global_step_, missing.empty() ? "?" : missing)};
}

std::vector<std::string> JobState::exit_waits(kj::Duration older_than) const {
  if (!finished_ || !on_done_ || timer_.now() - finished_since_ < older_than) return {};
  std::string here;
  for (const auto& [i, w] : workers_) {
    if (w.connections == 0) continue;
    if (here.size() >= kMaxWaitLine) {
      here += ", ...";
      break;
    }
    here += fmt::format("{}{} ({})", here.empty() ? "" : ", ", i, w.peer.empty() ? "?" : w.peer);
  }
  if (here.empty()) return {};
  return {fmt::format(
      "job finished {} s ago (at global step {}); psd exits once workers {} disconnect: end them "
      "(--exit_when_done; with --exit_when_done false psd serves on instead)",
      (timer_.now() - finished_since_) / kj::SECONDS, global_step_, here)};
}

}  // namespace ps
