#include "server/accept_retry.h"

#include <chrono>

#include <spdlog/spdlog.h>

namespace ps {

void log_accept_failure(const std::string& listener, const kj::Exception& e) {
  // On the event loop thread only: no lock.
  static std::chrono::steady_clock::time_point last{};
  static uint64_t quiet = 0;  // failures not logged since the last line
  const auto now = std::chrono::steady_clock::now();
  if (now - last < std::chrono::seconds(1)) {
    ++quiet;
    return;
  }
  spdlog::warn("accepting a {} connection failed: {}; accepting again in {} ms{}", listener,
               e.getDescription().cStr(), kAcceptRetry / kj::MILLISECONDS,
               quiet > 0 ? fmt::format(" ({} more failures since the last report)", quiet) : "");
  last = now;
  quiet = 0;
}

}  // namespace ps
