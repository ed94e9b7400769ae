// What psd's accept loops (RPC and HTTP) do when accept() fails: out of
// descriptors (each connection holds one; an idle HTTP visitor or a flood of
// connections can take the last) or of memory. That is a moment's shortage,
// not a reason to stop serving: the loop logs it (at most once a second,
// not once per retry) and accepts again kAcceptRetry later.
#pragma once

#include <string>

#include <kj/exception.h>
#include <kj/time.h>

namespace ps {

inline constexpr kj::Duration kAcceptRetry = 100 * kj::MILLISECONDS;

// `listener`: which one, for the log ("tcp", "unix", "http").
void log_accept_failure(const std::string& listener, const kj::Exception& e);

}  // namespace ps
