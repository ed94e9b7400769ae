// "host:port" as psd, libpsclient and the trainers write addresses: split at
// the last colon, "[v6addr]:port" losing its brackets. Validation with
// user-facing messages is ClusterSpec's (client/trainer/cluster_spec.cc).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ps {

struct HostPort {
  std::string host;
  std::string port;  // may be empty ("host:")
};

// nullopt when there is no colon at all.
inline std::optional<HostPort> split_host_port(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return HostPort{std::string(host), std::string(address.substr(colon + 1))};
}

}  // namespace ps
