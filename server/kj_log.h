// KJ's own log lines (errors its libraries report but do not throw, such as
// kj-http's "exception after generating a partial response") sent through
// spdlog, a few per source line per interval: a peer that makes KJ log on
// every request cannot flood psd's log. Installed on the thread that runs the
// event loop, for as long as the object lives.
//
//   ps::KjLogThroughSpdlog kj_log;  // before kj::setupAsyncIo()'s loop runs
#pragma once

#include <kj/exception.h>

#include "server/log_limiter.h"

namespace ps {

class KjLogThroughSpdlog final : public kj::ExceptionCallback {
 public:
  void logMessage(kj::LogSeverity severity, const char* file, int line, int contextDepth,
                  kj::String&& text) override;

 private:
  LogLimiter limiter_;
};

}  // namespace ps
