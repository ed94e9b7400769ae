// Plain-socket HTTP for psd's monitoring tests: the requests are sent as raw
// bytes (so tests can send malformed ones too) and the answer is split into
// status, headers and body. Loopback only.
#pragma once

#include <cstddef>
#include <map>
#include <string>

namespace ps::test {

struct HttpAnswer {
  int status = 0;                              // 0: no answer (connection closed or timed out)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string raw;
};

// Sends `request` to 127.0.0.1:port (from a second thread, so a server that
// stops reading cannot block us) and reads until the server closes or, once
// the head and Content-Length bytes arrived, returns.
HttpAnswer http_exchange(int port, const std::string& request, int timeout_ms = 5000);

HttpAnswer http_get(int port, const std::string& path, const std::string& method = "GET");

// How many times `text` occurs in `log` (lines of a kind in psd's log).
std::size_t count_of(const std::string& log, const std::string& text);

// A TCP connection to 127.0.0.1:port: its descriptor, or -1 when refused.
int tcp_connect(int port);

// Reads the port psd wrote to --http_port_file.
int read_port_file(const std::string& path);

}  // namespace ps::test
