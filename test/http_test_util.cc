#include "test/http_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace ps::test {
namespace {

void parse_answer(HttpAnswer& a) {
  auto head_end = a.raw.find("\r\n\r\n");
  if (head_end == std::string::npos || a.raw.rfind("HTTP/1.", 0) != 0) return;
  a.status = std::stoi(a.raw.substr(9, 3));
  std::size_t line = a.raw.find("\r\n") + 2;
  while (line < head_end) {
    std::size_t next = a.raw.find("\r\n", line);
    std::string h = a.raw.substr(line, next - line);
    auto colon = h.find(':');
    if (colon != std::string::npos) {
      std::string name = h.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      std::string value = h.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      a.headers[name] = value;
    }
    line = next + 2;
  }
  a.body = a.raw.substr(head_end + 4);
}

// A HEAD answer has a Content-Length but no body.
bool complete(const std::string& raw, bool head_only) {
  auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  if (head_only) return true;
  HttpAnswer a;
  a.raw = raw;
  parse_answer(a);
  auto it = a.headers.find("content-length");
  return it != a.headers.end() && a.body.size() >= std::stoull(it->second);
}

}  // namespace

std::size_t count_of(const std::string& log, const std::string& text) {
  std::size_t n = 0;
  for (auto at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
  return n;
}

int tcp_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

HttpAnswer http_exchange(int port, const std::string& request, int timeout_ms) {
  const int fd = tcp_connect(port);
  if (fd < 0) throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
  std::thread sender([fd, &request] {
    std::size_t sent = 0;
    while (sent < request.size()) {
      ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server closed: expected for oversized requests
      sent += static_cast<std::size_t>(n);
    }
  });
  HttpAnswer a;
  const bool head_only = request.rfind("HEAD ", 0) == 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[65536];
  while (!complete(a.raw, head_only)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    a.raw.append(buf, static_cast<std::size_t>(n));
  }
  ::shutdown(fd, SHUT_RDWR);  // unblocks the sender if the server stopped reading
  sender.join();
  ::close(fd);
  parse_answer(a);
  return a;
}

HttpAnswer http_get(int port, const std::string& path, const std::string& method) {
  return http_exchange(port, method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

int read_port_file(const std::string& path) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("no port in " + path);
}

}  // namespace ps::test
