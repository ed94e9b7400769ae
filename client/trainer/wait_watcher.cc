#include "client/trainer/wait_watcher.h"

#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "client/unanswered.h"
#include "ps/errors.h"

namespace ps {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

WaitWatcher::WaitWatcher(Client& client, int worker_index, std::chrono::milliseconds every)
    : client_(client), worker_(worker_index), every_(every), thread_([this] { run(); }) {}

WaitWatcher::~WaitWatcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void WaitWatcher::begin(const char* what, std::chrono::milliseconds limit) {
  since_ns_.store(now_ns(), std::memory_order_relaxed);
  limit_ms_.store(limit.count(), std::memory_order_relaxed);
  what_.store(what, std::memory_order_release);
}

void WaitWatcher::end() { what_.store(nullptr, std::memory_order_release); }

void WaitWatcher::run() {
  const QuietWaitLines quiet;  // its stats() probes: the call it watches says its own lines
  int64_t said_for =
      0;  // the call (its start) last logged, so each long wait is said every `every_`
  int64_t said_at = 0;
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) {
    const char* what = what_.load(std::memory_order_acquire);
    const int64_t since = since_ns_.load(std::memory_order_relaxed);
    const int64_t limit_ms = limit_ms_.load(std::memory_order_relaxed);
    const int64_t now = now_ns();
    const int64_t every = std::chrono::nanoseconds(every_).count();
    if (what == nullptr || now - since < every) continue;
    if (said_for == since && now - said_at < every) continue;
    said_for = since;
    said_at = now;
    lock.unlock();
    std::set<std::string> lines;
    try {
      for (const ShardStats& s : client_.stats()) lines.insert(s.waits.begin(), s.waits.end());
    } catch (const std::exception& e) {
      lines.insert(std::string("(could not ask psd what it waits for: ") + e.what() + ")");
    }
    const int64_t secs = (now - since) / 1'000'000'000;
    const std::string waited =
        limit_ms > 0 ? fmt::format("waiting {} s of {} s", secs, (limit_ms + 999) / 1000)
                     : fmt::format("waiting {} s (no limit)", secs);
    if (lines.empty()) {
      spdlog::info("worker {}: {}: {}", worker_, what, waited);
    } else {
      for (const std::string& l : lines)
        spdlog::info("worker {}: {}: {}; psd: {}", worker_, what, waited, l);
    }
    lock.lock();
  }
}

}  // namespace ps
