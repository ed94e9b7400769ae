#include "server/kj_log.h"

#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace ps {

void KjLogThroughSpdlog::logMessage(kj::LogSeverity severity, const char* file, int line,
                                    int /*contextDepth*/, kj::String&& text) {
  uint64_t suppressed = 0;
  if (!limiter_.allow(file, std::to_string(line), &suppressed)) return;
  // One line: the stack of addresses KJ appends says nothing to an operator.
  std::string_view said(text.cStr(), text.size());
  said = said.substr(0, said.find("\nstack:"));
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.remove_suffix(1);
  const auto level = severity == kj::LogSeverity::INFO      ? spdlog::level::info
                     : severity == kj::LogSeverity::WARNING ? spdlog::level::warn
                     : severity == kj::LogSeverity::DBG     ? spdlog::level::debug
                                                            : spdlog::level::err;
  spdlog::log(level, "{}:{}: {}{}", file, line, said, LogLimiter::note(suppressed));
}

}  // namespace ps
