#include "client/unanswered.h"

#include <spdlog/spdlog.h>

#include "client/shard_connection.h"

namespace ps {
namespace {

constexpr kj::Duration kFirst = 5 * kj::SECONDS;
constexpr kj::Duration kEvery = 10 * kj::SECONDS;

thread_local bool quiet_wait_lines = false;

kj::Promise<void> watch_from(ClientLoop& loop, const Unanswered& calls, const std::string& context,
                             std::chrono::milliseconds limit, const std::vector<std::string>& hosts,
                             kj::TimePoint start, kj::TimePoint next_line, bool say) {
  const bool limited = limit.count() > 0;
  const kj::TimePoint deadline = start + limit.count() * kj::MILLISECONDS;
  if (!say) {
    if (!limited) return kj::NEVER_DONE;
    return loop.timer().atTime(deadline).then(
        [limit]() -> kj::Promise<void> { return call_timeout_error(limit); });
  }
  const bool gives_up = limited && deadline <= next_line;
  return loop.timer()
      .atTime(gives_up ? deadline : next_line)
      .then([&loop, &calls, &context, limit, &hosts, start, next_line,
             gives_up]() -> kj::Promise<void> {
        if (gives_up) {
          return call_timeout_error(limit);
        }
        // Rounded: the timer may fire a hair before or after each whole period.
        const int64_t waited = (clock_now() - start + kj::SECONDS / 2) / kj::SECONDS;
        spdlog::info("{}", still_waiting_line(context, waited, limit, calls.shards(), hosts));
        return watch_from(loop, calls, context, limit, hosts, start, next_line + kEvery, true);
      });
}

}  // namespace

std::vector<int> Unanswered::shards() const {
  std::vector<int> out;
  for (const auto& [index, count] : pending_) out.push_back(index);
  return out;
}

kj::Exception call_timeout_error(std::chrono::milliseconds limit) {
  return disconnected("no answer from psd within " + std::to_string(limit.count()) +
                      " ms (ClientOptions::call_timeout)");
}

std::string waiting_prefix(const std::string& context, int64_t waited,
                           std::chrono::milliseconds limit) {
  std::string line = context + "waiting " + std::to_string(waited) + " s ";
  if (limit.count() > 0) {
    line +=
        "of " + std::to_string((limit.count() + 500) / 1000) + " s (ClientOptions::call_timeout) ";
  } else {
    line += "(no limit: ClientOptions::call_timeout is 0) ";
  }
  return line;
}

std::string still_waiting_line(const std::string& context, int64_t waited,
                               std::chrono::milliseconds limit, const std::vector<int>& shards,
                               const std::vector<std::string>& hosts) {
  std::string line = waiting_prefix(context, waited, limit) + "for psd's answer";
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const auto index = static_cast<std::size_t>(shards[i]);
    line += (i == 0 ? " from shard " : ", shard ") + std::to_string(shards[i]);
    if (index < hosts.size()) line += " (" + hosts[index] + ")";
  }
  return line;
}

kj::Promise<void> watch_call(ClientLoop& loop, const Unanswered& calls, const std::string& context,
                             std::chrono::milliseconds limit, const std::vector<std::string>& hosts,
                             kj::TimePoint start, kj::Duration quiet, bool say) {
  return watch_from(loop, calls, context, limit, hosts, start, start + quiet + kFirst, say);
}

QuietWaitLines::QuietWaitLines() : before_(quiet_wait_lines) { quiet_wait_lines = true; }
QuietWaitLines::~QuietWaitLines() { quiet_wait_lines = before_; }
bool QuietWaitLines::active() { return quiet_wait_lines; }

}  // namespace ps
