// ps::SocketStream (common/net/socket_stream.h): reads through its buffer and
// around it, writes of many pieces, the end of stream when it comes with
// the last data, and connect_socket for TCP, host names and Unix sockets.
// One test program per area: its cases share the helpers at its top;
// splitting it would duplicate them.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <kj/async-unix.h>
#include <kj/debug.h>

#include "test/kj_test_loop.h"
#include "common/net/socket_stream.h"

namespace {

using ps::test::Loop;

struct Pair {
  kj::Own<kj::AsyncIoStream> a, b;
};

Pair socket_pair(Loop& l) {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  return {ps::wrap_socket(l.port, fds[0]), ps::wrap_socket(l.port, fds[1])};
}

std::vector<kj::byte> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<kj::byte> v(n);
  for (auto& b : v) b = static_cast<kj::byte>(rng());
  return v;
}

// A listening socket on 127.0.0.1 with a free port.
struct Listener {
  int fd = -1;
  int port = 0;
  explicit Listener(in_addr_t host = htonl(INADDR_LOOPBACK)) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = host;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    REQUIRE(::listen(fd, 4) == 0);
  }
  ~Listener() { ::close(fd); }
};

}  // namespace

TEST_CASE("messages of every size arrive whole and in order") {
  Loop l;
  auto [a, b] = socket_pair(l);
  // Small ones share the read buffer; 200 KiB and 1 MiB go around it.
  const std::vector<size_t> sizes = {8, 1, 100, 4096, 65535, 65536, 200000, 3, 1 << 20, 17};
  std::vector<std::vector<kj::byte>> sent;
  for (size_t i = 0; i < sizes.size(); ++i)
    sent.push_back(random_bytes(sizes[i], static_cast<unsigned>(i)));
  kj::Vector<kj::ArrayPtr<const kj::byte>> pieces;
  for (auto& s : sent) pieces.add(kj::arrayPtr(s.data(), s.size()));
  auto writing = a->write(pieces.asPtr());
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<kj::byte> got(sizes[i]);
    REQUIRE(l.wait(b->read(got.data(), got.size(), got.size())) == sizes[i]);
    REQUIRE(got == sent[i]);
  }
  l.wait(kj::mv(writing));
}

TEST_CASE("tryRead returns what is there once min bytes have come") {
  Loop l;
  auto [a, b] = socket_pair(l);
  auto data = random_bytes(300, 7);
  l.wait(a->write(data.data(), data.size()));
  std::vector<kj::byte> got(1000);
  const size_t n = l.wait(b->tryRead(got.data(), 10, got.size()));
  REQUIRE(n == 300);
  REQUIRE(std::memcmp(got.data(), data.data(), 300) == 0);
}

TEST_CASE("a write of more pieces than one sendmsg takes, larger than the socket buffer") {
  Loop l;
  auto [a, b] = socket_pair(l);
  std::vector<std::vector<kj::byte>> parts;
  kj::Vector<kj::ArrayPtr<const kj::byte>> pieces;
  size_t total = 0;
  for (unsigned i = 0; i < 300; ++i) {
    parts.push_back(random_bytes(10000 + i, i));
    total += parts.back().size();
  }
  for (auto& p : parts) pieces.add(kj::arrayPtr(p.data(), p.size()));
  auto writing = a->write(pieces.asPtr());
  std::vector<kj::byte> got(total);
  REQUIRE(l.wait(b->read(got.data(), got.size(), got.size())) == total);
  l.wait(kj::mv(writing));
  size_t at = 0;
  for (auto& p : parts) {
    REQUIRE(std::memcmp(got.data() + at, p.data(), p.size()) == 0);
    at += p.size();
  }
}

TEST_CASE("the end of stream is seen when it comes together with the last data") {
  Loop l;
  auto [a, b] = socket_pair(l);
  std::vector<kj::byte> got(64);
  // First a read that comes back short, so the stream learns the socket is
  // drained; then data and hang-up in one go.
  l.wait(a->write("hello", 5));
  REQUIRE(l.wait(b->tryRead(got.data(), 1, got.size())) == 5);
  auto last = random_bytes(40, 3);
  l.wait(a->write(last.data(), last.size()));
  a->shutdownWrite();
  REQUIRE(l.wait(b->tryRead(got.data(), 1, got.size())) == 40);
  REQUIRE(l.wait(b->tryRead(got.data(), 1, got.size())) == 0);  // not a hang
}

TEST_CASE("the end of stream after a quiet spell is seen") {
  Loop l;
  auto [a, b] = socket_pair(l);
  std::vector<kj::byte> got(64);
  l.wait(a->write("abc", 3));
  REQUIRE(l.wait(b->tryRead(got.data(), 1, got.size())) == 3);
  auto reading = b->tryRead(got.data(), 1, got.size());
  l.wait(l.port.getTimer().afterDelay(20 * kj::MILLISECONDS));
  a = nullptr;  // closes the socket
  REQUIRE(l.wait(kj::mv(reading)) == 0);
}

TEST_CASE("a hold on sent memory lasts until the write carrying it is done") {
  Loop l;
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  auto a = ps::wrap_socket(l.port, fds[0]);
  auto b = ps::wrap_socket(l.port, fds[1]);
  auto payload =
      std::make_shared<std::vector<kj::byte>>(random_bytes(3 << 20, 5));  // over the socket buffer
  std::weak_ptr<std::vector<kj::byte>> watch = payload;
  a->hold_until_sent(payload->data(), payload);
  a->hold_until_sent(payload->data(), payload);  // a second reply of the same memory
  auto* data = payload->data();
  payload.reset();
  // A write of other memory releases nothing.
  l.wait(a->write("header", 6));
  REQUIRE_FALSE(watch.expired());
  std::vector<kj::byte> got(6 + (3 << 20));
  kj::ArrayPtr<const kj::byte> pieces[] = {kj::arrayPtr(data, 3u << 20)};
  auto writing = a->write(kj::arrayPtr(pieces, 1));
  REQUIRE(l.wait(b->read(got.data(), got.size(), got.size())) == got.size());
  l.wait(kj::mv(writing));
  REQUIRE_FALSE(watch.expired());  // one hold left, for the second reply
  auto again = a->write(kj::arrayPtr(pieces, 1));
  REQUIRE(l.wait(b->read(got.data(), 3u << 20, 3u << 20)) == (3u << 20));
  l.wait(kj::mv(again));
  REQUIRE(watch.expired());
}

TEST_CASE("writing to a closed peer is an error, not SIGPIPE") {
  Loop l;
  auto [a, b] = socket_pair(l);
  b = nullptr;
  auto data = random_bytes(1 << 20, 9);
  REQUIRE_THROWS_AS(l.wait(a->write(data.data(), data.size())), kj::Exception);
}

TEST_CASE("connect_socket reaches numeric, named and Unix-socket addresses") {
  Loop l;
  SECTION("127.0.0.1") {
    Listener listener;
    auto stream = l.wait(ps::connect_socket(l.port, "127.0.0.1:" + std::to_string(listener.port)));
    int peer = ::accept(listener.fd, nullptr, nullptr);
    REQUIRE(peer >= 0);
    REQUIRE(::write(peer, "ok", 2) == 2);
    char got[2];
    REQUIRE(l.wait(stream->read(got, 2, 2)) == 2);
    REQUIRE(std::string(got, 2) == "ok");
    ::close(peer);
  }
  SECTION("localhost (resolved off the loop)") {
    Listener listener;
    auto stream = l.wait(ps::connect_socket(l.port, "localhost:" + std::to_string(listener.port)));
    int peer = ::accept(listener.fd, nullptr, nullptr);
    REQUIRE(peer >= 0);
    ::close(peer);
  }
  SECTION("unix:/path") {
    const std::string path =
        std::filesystem::temp_directory_path() / ("socket-stream-test-" + std::to_string(getpid()));
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::strcpy(un.sun_path, path.c_str());
    ::unlink(path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&un), sizeof(un)) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    auto stream = l.wait(ps::connect_socket(l.port, "unix:" + path));
    int peer = ::accept(fd, nullptr, nullptr);
    REQUIRE(peer >= 0);
    l.wait(stream->write("x", 1));
    char got = 0;
    REQUIRE(::read(peer, &got, 1) == 1);
    REQUIRE(got == 'x');
    ::close(peer);
    ::close(fd);
    ::unlink(path.c_str());
  }
}

TEST_CASE("connect_socket failures are exceptions naming the cause") {
  Loop l;
  int port;
  {
    Listener closed;  // a port nobody listens on once this closes
    port = closed.port;
  }
  try {
    l.wait(ps::connect_socket(l.port, "127.0.0.1:" + std::to_string(port)));
    FAIL("connected to a closed port");
  } catch (const kj::Exception& e) {
    REQUIRE(e.getType() == kj::Exception::Type::DISCONNECTED);
  }
  REQUIRE_THROWS_AS(l.wait(ps::connect_socket(l.port, "no-port-here")), kj::Exception);
  REQUIRE_THROWS_AS(l.wait(ps::connect_socket(l.port, "host.invalid:1234")), kj::Exception);
}

namespace {

// Both ends of a loopback TCP connection: {client fd, server fd}.
std::pair<int, int> tcp_connection() {
  Listener listener;
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(listener.port));
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  int server = ::accept(listener.fd, nullptr, nullptr);
  REQUIRE(server >= 0);
  return {client, server};
}

}  // namespace

TEST_CASE(
    "read_exact reads around the buffer into where(offset), then small reads go on as before") {
  Loop l;
  // The sender is a plain blocking socket on a thread, sending in pieces
  // with pauses, so the reader has to wait for more many times.
  const auto [sender, receiver_fd] = tcp_connection();
  auto receiver = ps::wrap_socket(l.port, receiver_fd);
  auto head = random_bytes(8, 11), big = random_bytes(3u << 20, 12), tail = random_bytes(10, 13);
  std::thread writer([&] {
    auto send_all = [&](const std::vector<kj::byte>& v) {
      for (size_t at = 0; at < v.size();) {
        const ssize_t n = ::write(sender, v.data() + at, std::min<size_t>(v.size() - at, 100000));
        if (n <= 0) return;
        at += static_cast<size_t>(n);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    };
    send_all(head);
    send_all(big);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    send_all(tail);
  });
  std::vector<kj::byte> got_head(8), got_big(big.size()), got_tail(10);
  l.wait(receiver->read(got_head.data(), 8));
  size_t asked = 0, last_offset = 0;
  bool ascending = true;
  l.wait(receiver->read_exact(big.size(), [&](size_t offset) {
    ascending = ascending && offset >= last_offset;
    last_offset = offset;
    ++asked;
    return got_big.data() + offset;
  }));
  CHECK(got_head == head);
  CHECK(got_big == big);
  CHECK(asked > 3);
  CHECK(ascending);
  // Waiting for a large remainder raises the socket's low-water mark; it
  // must be back at 1, or a small message would wait for bytes never sent.
  int lowat = 0;
  socklen_t len = sizeof(lowat);
  REQUIRE(::getsockopt(receiver_fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, &len) == 0);
  CHECK(lowat == 1);
  l.wait(receiver->read(got_tail.data(), 10));
  CHECK(got_tail == tail);
  writer.join();
  ::close(sender);
}

// Bytes still in the socket (not yet read by the stream), via FIONREAD.
int unread(int fd) {
  int n = -1;
  REQUIRE(::ioctl(fd, FIONREAD, &n) == 0);
  return n;
}

// The pieces one after another, as the peer sends them.
template <typename... Pieces>
std::vector<kj::byte> joined(const Pieces&... pieces) {
  std::vector<kj::byte> all;
  (all.insert(all.end(), pieces.begin(), pieces.end()), ...);
  return all;
}

// A Unix socket pair whose first end already holds `bytes` for the second
// to read: written whole before any read, so what the reader takes out is
// not refilled behind its back.
int filled_socket_pair(int fds[2], const std::vector<kj::byte>& bytes) {
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  const int room =
      1 << 20;  // the kernel caps it at net.core.wmem_max (doubled): plenty for these tests
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &room, sizeof(room));
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::write(fds[0], bytes.data() + at, bytes.size() - at);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  REQUIRE(at == bytes.size());
  return static_cast<int>(at);
}

// A head, a body and what comes next, all waiting in a socket, read through
// a stream that reads ahead 4 KiB (as while a landable pull is pending):
// the set-up of the land_next_read tests. Parts' seeds: seed, +1, +2.
struct LandingCase {
  LandingCase(Loop& l, size_t head_size, size_t body_size, size_t next_size, unsigned seed)
      : head(random_bytes(head_size, seed)),
        body(random_bytes(body_size, seed + 1)),
        next(random_bytes(next_size, seed + 2)) {
    filled_socket_pair(fds, joined(head, body, next));
    receiver = ps::wrap_socket(l.port, fds[1]);
    receiver->limit_read_ahead(4096);
  }
  ~LandingCase() { ::close(fds[0]); }
  std::vector<kj::byte> head, body, next;
  int fds[2];
  kj::Own<ps::SocketStream> receiver;
};

TEST_CASE("read_exact takes what follows in the same read; the stream hands it out next") {
  Loop l;
  auto head = random_bytes(8, 21), big = random_bytes(100000, 22), next = random_bytes(1000, 23);
  const auto all = joined(head, big, next);
  int fds[2];
  filled_socket_pair(fds, all);
  auto receiver = ps::wrap_socket(l.port, fds[1]);
  std::vector<kj::byte> got_head(8), got_big(big.size()), got_next(next.size());
  receiver->limit_read_ahead(8);  // the header alone: the rest stays in the socket
  l.wait(receiver->read(got_head.data(), 8));
  CHECK(unread(fds[1]) == static_cast<int>(big.size() + next.size()));
  receiver->limit_read_ahead(SIZE_MAX);
  l.wait(receiver->read_exact(big.size(), [&](size_t offset) { return got_big.data() + offset; }));
  // The next message came out of the socket with the last of `big`.
  CHECK(unread(fds[1]) == 0);
  l.wait(receiver->read(got_next.data(), next.size()));
  CHECK(got_head == head);
  CHECK(got_big == big);
  CHECK(got_next == next);
  ::close(fds[0]);
}

TEST_CASE("limit_read_ahead keeps the bytes after a small read in the socket") {
  Loop l;
  auto data = random_bytes(200000, 31);
  int fds[2];
  const int before = filled_socket_pair(fds, data);
  auto receiver = ps::wrap_socket(l.port, fds[1]);
  std::vector<kj::byte> got(data.size());
  // Unlimited, a small read takes 64 KiB out of the socket.
  l.wait(receiver->read(got.data(), 16));
  CHECK(unread(fds[1]) == before - 65536);
  // Limited, it takes what is left in the buffer and then no more than the limit.
  receiver->limit_read_ahead(4096);
  l.wait(receiver->read(got.data() + 16, 65536 - 16 + 100));  // 100 bytes past the buffer
  CHECK(unread(fds[1]) <= before - 65536 - 100);
  CHECK(unread(fds[1]) >= before - 65536 - 4096);
  l.wait(receiver->read(got.data() + 65636, data.size() - 65636));
  CHECK(got == data);
  ::close(fds[0]);
}

TEST_CASE("land_next_read puts the middle of one read straight into its destination") {
  Loop l;
  LandingCase c(l, 200, 100000, 1000, 41);
  auto& [head, body, next, fds, receiver] = c;
  std::vector<kj::byte> got_head(head.size()), dest(body.size()), got_next(next.size());
  receiver->land_next_read(head.size(), kj::arrayPtr(dest.data(), dest.size()));
  l.wait(receiver->read(got_head.data(), 8));
  // One read took the head, the body (into dest) and what follows.
  CHECK(unread(fds[1]) == 0);
  CHECK(dest == body);
  l.wait(receiver->read(got_head.data() + 8, head.size() - 8));
  std::fill(dest.begin() + 5000, dest.end(),
            kj::byte{0});  // bytes in place are not copied again...
  std::vector<kj::byte> expect = body;
  std::fill(expect.begin() + 5000, expect.end(), kj::byte{0});
  l.wait(receiver->read_exact(dest.size(), [&](size_t offset) { return dest.data() + offset; }));
  CHECK(dest == expect);  // ...so what was written there since stays
  l.wait(receiver->read(got_next.data(), next.size()));
  CHECK(got_head == head);
  CHECK(got_next == next);
}

TEST_CASE("a wrong land_next_read guess still hands out every byte in stream order") {
  Loop l;
  LandingCase c(l, 200, 70000, 3000, 51);
  auto& [head, body, next, fds, receiver] = c;
  std::vector<kj::byte> got_head(head.size()), dest(body.size()), got_next(next.size());
  size_t guess = 0;
  bool into_dest = true;
  SECTION("the head is longer than guessed") { guess = 120; }
  SECTION("the head is shorter than guessed") { guess = 333; }
  SECTION("the guessed destination is not where the body goes") {
    guess = head.size();
    into_dest = false;
  }
  SECTION("a destination larger than what follows") {
    guess = head.size();
    dest.resize(body.size() + next.size() + 5000);
  }
  receiver->land_next_read(guess, kj::arrayPtr(dest.data(), dest.size()));
  l.wait(receiver->read(got_head.data(), head.size()));
  std::vector<kj::byte> other(body.size());
  kj::byte* target = into_dest ? dest.data() : other.data();
  l.wait(receiver->read_exact(body.size(), [&](size_t offset) { return target + offset; }));
  l.wait(receiver->read(got_next.data(), next.size()));
  CHECK(got_head == head);
  CHECK(std::vector<kj::byte>(target, target + body.size()) == body);
  CHECK(got_next == next);
}

TEST_CASE("release moves bytes parked in a destination out of it") {
  Loop l;
  auto head = random_bytes(64, 61), body = random_bytes(50000, 62);
  const auto all = joined(head, body);
  int fds[2];
  filled_socket_pair(fds, all);
  auto receiver = ps::wrap_socket(l.port, fds[1]);
  std::vector<kj::byte> got_head(head.size()), dest(body.size()), got_body(body.size());
  receiver->land_next_read(head.size(), kj::arrayPtr(dest.data(), dest.size()));
  l.wait(receiver->read(got_head.data(), head.size()));
  CHECK(dest == body);
  receiver->release(kj::arrayPtr(
      dest.data(), dest.size()));  // its owner gave up: the memory is no longer the stream's
  std::fill(dest.begin(), dest.end(), kj::byte{0});
  l.wait(receiver->read(got_body.data(), body.size()));
  CHECK(got_head == head);
  CHECK(got_body == body);
  ::close(fds[0]);
}

TEST_CASE("a landing set while the socket is empty is used by the read that finds data") {
  Loop l;
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  auto receiver = ps::wrap_socket(l.port, fds[1]);
  auto head = random_bytes(100, 71), body = random_bytes(20000, 72);
  std::vector<kj::byte> got_head(head.size()), dest(body.size());
  receiver->land_next_read(head.size(), kj::arrayPtr(dest.data(), dest.size()));
  auto reading = receiver->read(got_head.data(), head.size());
  l.ws.poll();  // finds the socket empty and waits
  const auto all = joined(head, body);
  REQUIRE(::write(fds[0], all.data(), all.size()) == static_cast<ssize_t>(all.size()));
  l.wait(kj::mv(reading));
  CHECK(got_head == head);
  CHECK(dest == body);
  l.wait(receiver->read_exact(dest.size(), [&](size_t offset) { return dest.data() + offset; }));
  CHECK(dest == body);
  ::close(fds[0]);
}

TEST_CASE("read_exact fails when the stream ends first") {
  Loop l;
  const auto [client, server] = tcp_connection();
  auto a = ps::wrap_socket(l.port, client);
  auto b = ps::wrap_socket(l.port, server);
  auto data = random_bytes(100000, 14);
  l.wait(a->write(data.data(), data.size()));
  a->shutdownWrite();
  std::vector<kj::byte> got(200000);
  CHECK_THROWS(
      l.wait(b->read_exact(got.size(), [&](size_t offset) { return got.data() + offset; })));
  CHECK(std::memcmp(got.data(), data.data(), data.size()) == 0);
}

namespace {

sockaddr_storage address(const char* text) {
  sockaddr_storage s{};
  if (std::strchr(text, ':') != nullptr) {
    auto& a = reinterpret_cast<sockaddr_in6&>(s);
    a.sin6_family = AF_INET6;
    REQUIRE(::inet_pton(AF_INET6, text, &a.sin6_addr) == 1);
  } else {
    auto& a = reinterpret_cast<sockaddr_in&>(s);
    a.sin_family = AF_INET;
    REQUIRE(::inet_pton(AF_INET, text, &a.sin_addr) == 1);
  }
  return s;
}

int send_buffer(int fd) {
  int size = 0;
  socklen_t len = sizeof(size);
  REQUIRE(::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &len) == 0);
  return size;
}

// What SO_SNDBUF reads back after the stream asked for `bytes`: Linux
// halves the request's bookkeeping share away, caps the half at
// net.core.wmem_max and doubles it again.
int granted_send_buffer(int bytes) {
  long wmem_max = 0;
  std::ifstream("/proc/sys/net/core/wmem_max") >> wmem_max;
  REQUIRE(wmem_max > 0);
  return static_cast<int>(2 * std::min<long>(bytes / 2, wmem_max));
}

// An IPv4 address of this host other than loopback, if it has one.
std::optional<in_addr_t> own_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<in_addr_t> found;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr_t a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    if ((ntohl(a) >> 24) != 127) found = a;
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace

TEST_CASE("which TCP connections stay on this host") {
  CHECK(ps::same_host_connection(address("127.0.0.1"), address("127.0.0.1")));
  CHECK(ps::same_host_connection(address("10.1.2.3"), address("127.4.5.6")));
  // A loopback peer is this host whatever the local address reads (the
  // odd pairs exercise the loopback test on its own, not the equality).
  CHECK(ps::same_host_connection(address("fd00::1"), address("::1")));
  CHECK(ps::same_host_connection(address("::ffff:10.0.0.1"), address("::ffff:127.0.0.1")));
  CHECK(ps::same_host_connection(address("10.1.2.3"),
                                 address("10.1.2.3")));  // the host's own address
  CHECK(ps::same_host_connection(address("fd00::7"), address("fd00::7")));
  CHECK_FALSE(ps::same_host_connection(address("10.1.2.3"), address("10.1.2.4")));
  CHECK_FALSE(ps::same_host_connection(address("fd00::7"), address("fd00::8")));
  CHECK_FALSE(ps::same_host_connection(address("::ffff:10.1.2.3"), address("::ffff:10.1.2.4")));
  CHECK_FALSE(ps::same_host_connection(address("10.1.2.3"),
                                       address("::ffff:10.1.2.3")));  // families differ
  sockaddr_storage unix_socket{};
  unix_socket.ss_family = AF_UNIX;
  CHECK_FALSE(ps::same_host_connection(unix_socket, unix_socket));
}

TEST_CASE("a TCP connection within this host gets the fixed send buffer at both ends") {
  const int bytes = ps::same_host_send_buffer_bytes();
  CHECK(bytes >= (256 << 10));
  CHECK(bytes <= (1 << 20));
  const int granted = granted_send_buffer(bytes);
  Loop l;
  auto check_connection_to = [&](in_addr_t host) {
    Listener listener(host);
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &host, text, sizeof(text));
    INFO("connection to " << text);
    auto client =
        l.wait(ps::connect_socket(l.port, std::string(text) + ":" + std::to_string(listener.port)));
    const int accepted = ::accept(listener.fd, nullptr, nullptr);
    REQUIRE(accepted >= 0);
    // Before psd wraps it, an accepted socket has the kernel's default
    // (autotuned) buffer, not the fixed one.
    CHECK(send_buffer(accepted) != granted);
    auto server = ps::wrap_socket(l.port, accepted);
    CHECK(send_buffer(KJ_ASSERT_NONNULL(client->getFd())) == granted);
    CHECK(send_buffer(accepted) == granted);
  };
  SECTION("over loopback") { check_connection_to(htonl(INADDR_LOOPBACK)); }
  SECTION("to the host's own address") {
    const auto own = own_address();
    if (!own) {
      WARN("SKIPPED: this host has no IPv4 address besides loopback");
      return;
    }
    check_connection_to(*own);
  }
  SECTION("over IPv6 loopback") {
    const int listen_fd = ::socket(AF_INET6, SOCK_STREAM, 0);
    REQUIRE(listen_fd >= 0);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_loopback;
    if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(listen_fd);
      WARN("SKIPPED: no IPv6 loopback here");
      return;
    }
    socklen_t len = sizeof(addr);
    REQUIRE(::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    REQUIRE(::listen(listen_fd, 1) == 0);
    auto client =
        l.wait(ps::connect_socket(l.port, "[::1]:" + std::to_string(ntohs(addr.sin6_port))));
    const int accepted = ::accept(listen_fd, nullptr, nullptr);
    ::close(listen_fd);
    REQUIRE(accepted >= 0);
    auto server = ps::wrap_socket(l.port, accepted);
    CHECK(send_buffer(KJ_ASSERT_NONNULL(client->getFd())) == granted);
    CHECK(send_buffer(accepted) == granted);
  }
}

// Run by the case below in a process of its own (the value is read once):
// the buffer the environment asked for, EXPECTED_SEND_BUFFER bytes.
TEST_CASE("send buffer from the environment", "[.send_buffer_env]") {
  const char* expected_text = std::getenv("EXPECTED_SEND_BUFFER");
  REQUIRE(expected_text != nullptr);
  const int expected = std::stoi(expected_text);
  CHECK(ps::same_host_send_buffer_bytes() == expected);
  Loop l;
  Listener listener;
  auto client = l.wait(ps::connect_socket(l.port, "127.0.0.1:" + std::to_string(listener.port)));
  const int accepted = ::accept(listener.fd, nullptr, nullptr);
  REQUIRE(accepted >= 0);
  const int untouched = send_buffer(accepted);  // the kernel's own, before wrap_socket
  auto server = ps::wrap_socket(l.port, accepted);
  const int want = expected > 0 ? granted_send_buffer(expected) : untouched;
  CHECK(send_buffer(KJ_ASSERT_NONNULL(client->getFd())) == want);
  CHECK(send_buffer(accepted) == want);
}

TEST_CASE(
    "PS_SAME_HOST_SEND_BUFFER_KB sets the same-host send buffer; 0 leaves autotuning; junk is "
    "ignored") {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  REQUIRE(n > 0);
  self[n] = '\0';
  const int fallback = ps::same_host_send_buffer_bytes();  // this process has no override
  const std::pair<const char*, int> cases[] = {{"512", 512 << 10},     {"0", 0},
                                               {"12x", fallback},      {"-4", fallback},
                                               {"99999999", fallback}, {"", fallback}};
  for (const auto& [value, expected] : cases) {
    INFO("PS_SAME_HOST_SEND_BUFFER_KB='" << value << "'");
    const std::string command = std::string("PS_SAME_HOST_SEND_BUFFER_KB='") + value +
                                "' EXPECTED_SEND_BUFFER=" + std::to_string(expected) + " '" + self +
                                "' '[.send_buffer_env]' > /dev/null 2>&1";
    CHECK(std::system(command.c_str()) == 0);
  }
}

// Run by the case below in a process of its own (the send buffer is read
// once): the low-water mark a read waiting for 1 MiB sets on a loopback
// connection, EXPECTED_LOW_WATER bytes.
TEST_CASE("low-water mark under the environment's send buffer", "[.low_water_env]") {
  const char* expected_text = std::getenv("EXPECTED_LOW_WATER");
  REQUIRE(expected_text != nullptr);
  const int expected = std::stoi(expected_text);
  Loop l;
  Listener listener;
  auto client = l.wait(ps::connect_socket(l.port, "127.0.0.1:" + std::to_string(listener.port)));
  const int accepted = ::accept(listener.fd, nullptr, nullptr);
  REQUIRE(accepted >= 0);
  std::vector<kj::byte> sent(1 << 20), got(sent.size());
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<kj::byte>(i * 7 + 1);
  constexpr size_t kFirst = 4096;
  REQUIRE(::write(accepted, sent.data(), kFirst) == static_cast<ssize_t>(kFirst));
  auto reading =
      client->read_exact(sent.size(), [&](size_t offset) { return got.data() + offset; });
  l.ws.poll();  // takes the first bytes, then waits for the rest
  int lowat = 0;
  socklen_t len = sizeof(lowat);
  REQUIRE(::getsockopt(KJ_ASSERT_NONNULL(client->getFd()), SOL_SOCKET, SO_RCVLOWAT, &lowat, &len) ==
          0);
  CHECK(lowat == expected);
  std::thread writer([&] {
    for (size_t at = kFirst; at < sent.size();) {
      const ssize_t n = ::write(accepted, sent.data() + at, sent.size() - at);
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  });
  l.wait(kj::mv(reading));
  writer.join();
  CHECK(got == sent);
  ::close(accepted);
}

// A read waiting for much more raises the socket's low-water mark so as not
// to wake per packet, but on a same-host connection never to where the
// peer's fixed send buffer could be all in flight short of it: that waits
// for the delayed acknowledgement (common/net/socket_stream.cc, low_water_cap).
TEST_CASE(
    "PS_SAME_HOST_SEND_BUFFER_KB holds the low-water mark of large reads to half the buffer") {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  REQUIRE(n > 0);
  self[n] = '\0';
  // Buffers of 256 KiB and up: half, at most 256 KiB; smaller ones: none
  // (1, the kernel's default); not fixed (0): 256 KiB, as to another host.
  auto expected_for = [](int kb) {
    if (kb == 0) return 256 << 10;
    const int granted = granted_send_buffer(kb << 10);
    return granted < (256 << 10) ? 1 : std::min(granted / 2, 256 << 10);
  };
  CHECK(expected_for(256) == (128 << 10));
  CHECK(expected_for(200) == 1);
  for (const int kb : {1024, 512, 384, 256, 200, 128, 0}) {
    INFO("PS_SAME_HOST_SEND_BUFFER_KB=" << kb);
    const std::string command = "PS_SAME_HOST_SEND_BUFFER_KB=" + std::to_string(kb) +
                                " EXPECTED_LOW_WATER=" + std::to_string(expected_for(kb)) + " '" +
                                self + "' '[.low_water_env]' > /dev/null 2>&1";
    CHECK(std::system(command.c_str()) == 0);
  }
}

namespace {
int int_option(int fd, int level, int option) {
  int value = -1;
  socklen_t len = sizeof(value);
  REQUIRE(::getsockopt(fd, level, option, &value, &len) == 0);
  return value;
}
}  // namespace

TEST_CASE(
    "detect_dead_peer: keepalive probes and a user timeout on TCP, on both ends; nothing on Unix "
    "sockets") {
  Loop l;
  Listener listener;
  auto client = l.wait(ps::connect_socket(l.port, "127.0.0.1:" + std::to_string(listener.port)));
  const int accepted = ::accept(listener.fd, nullptr, nullptr);
  REQUIRE(accepted >= 0);
  auto server = ps::wrap_socket(l.port, accepted);
  const int client_fd = KJ_ASSERT_NONNULL(client->getFd());
  CHECK(int_option(client_fd, SOL_SOCKET, SO_KEEPALIVE) == 0);  // the kernel's default, until asked
  client->detect_dead_peer(std::chrono::seconds(30));
  server->detect_dead_peer(std::chrono::milliseconds(2500));
  // 30 s: idle 15 s, then 3 probes 5 s apart; data unacknowledged for 30 s ends it too.
  CHECK(int_option(client_fd, SOL_SOCKET, SO_KEEPALIVE) == 1);
  CHECK(int_option(client_fd, IPPROTO_TCP, TCP_KEEPIDLE) == 15);
  CHECK(int_option(client_fd, IPPROTO_TCP, TCP_KEEPINTVL) == 5);
  CHECK(int_option(client_fd, IPPROTO_TCP, TCP_KEEPCNT) == 3);
  CHECK(int_option(client_fd, IPPROTO_TCP, TCP_USER_TIMEOUT) == 30000);
  // Rounded up to whole seconds for the probes (the kernel counts in
  // seconds), exact for the user timeout.
  CHECK(int_option(accepted, SOL_SOCKET, SO_KEEPALIVE) == 1);
  CHECK(int_option(accepted, IPPROTO_TCP, TCP_KEEPIDLE) == 1);
  CHECK(int_option(accepted, IPPROTO_TCP, TCP_KEEPINTVL) == 1);
  CHECK(int_option(accepted, IPPROTO_TCP, TCP_USER_TIMEOUT) == 2500);

  SECTION("0 leaves the kernel's defaults") {
    auto other = l.wait(ps::connect_socket(l.port, "127.0.0.1:" + std::to_string(listener.port)));
    other->detect_dead_peer(std::chrono::milliseconds(0));
    CHECK(int_option(KJ_ASSERT_NONNULL(other->getFd()), SOL_SOCKET, SO_KEEPALIVE) == 0);
  }
  SECTION("Unix sockets are left alone, without an error") {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    auto unix_end = ps::wrap_socket(l.port, fds[0]);
    ::close(fds[1]);
    CHECK_NOTHROW(unix_end->detect_dead_peer(std::chrono::seconds(30)));
    CHECK(int_option(fds[0], SOL_SOCKET, SO_KEEPALIVE) == 0);
  }
}
