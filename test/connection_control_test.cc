// ps::ConnectionControl (common/net/connection_control.h), the one face of
// the socket that the layers above a message stream see: abort() through it
// (or through a Weak) fails a write under way with a DISCONNECTED error that
// says so, stops its bytes, and ends the reads of the stream above; a Weak
// that outlives its connection does nothing.
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <catch2/catch.hpp>
#include <kj/async-unix.h>
#include <kj/debug.h>

#include "common/net/client_message_stream.h"
#include "common/net/connection_control.h"
#include "common/net/socket_stream.h"
#include "test/kj_test_loop.h"

namespace {

using ps::test::Loop;

struct Pair {
  kj::Own<ps::SocketStream> a, b;
};

Pair socket_pair(Loop& l) {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  return {ps::wrap_socket(l.port, fds[0]), ps::wrap_socket(l.port, fds[1])};
}

// Reads from `s` until the end of the stream; the bytes read.
size_t read_to_end(Loop& l, kj::AsyncIoStream& s) {
  std::vector<kj::byte> buf(1 << 16);
  size_t total = 0;
  for (;;) {
    const size_t n = l.wait(s.tryRead(buf.data(), 1, buf.size()));
    if (n == 0) return total;
    total += n;
  }
}

}  // namespace

TEST_CASE("abort through a Weak fails the write under way, stops its bytes, and says why") {
  Loop l;
  auto [a, b] = socket_pair(l);
  ps::ConnectionControl& connection = *a;
  const ps::ConnectionControl::Weak cut = connection.weak();
  REQUIRE(cut.alive());

  // Far more than the socket buffers hold: the write waits for the reader.
  std::vector<kj::byte> payload(16u << 20, kj::byte(0x5a));
  auto writing = a->write(payload.data(), payload.size());
  std::vector<kj::byte> first(4096);
  REQUIRE(l.wait(b->read(first.data(), first.size(), first.size())) == first.size());
  CHECK(first[0] == 0x5a);

  REQUIRE(cut.abort());
  try {
    l.wait(kj::mv(writing));
    FAIL("the write went on after abort()");
  } catch (const kj::Exception& e) {
    CHECK(e.getType() == kj::Exception::Type::DISCONNECTED);
    CHECK(std::string(e.getDescription().cStr()).find("connection cut") != std::string::npos);
  }
  // The peer gets what was in the socket before the cut, then the end:
  // a truncated message, never the whole payload.
  const size_t rest = read_to_end(l, *b);
  CHECK(first.size() + rest < payload.size());

  // A later write fails the same way; cutting again changes nothing.
  REQUIRE(cut.abort());
  CHECK_THROWS_AS(l.wait(a->write(payload.data(), 8)), kj::Exception);
  CHECK(cut.alive());  // cut, but the object is still there
}

TEST_CASE("a Weak that outlives its connection does nothing") {
  Loop l;
  auto [a, b] = socket_pair(l);
  const ps::ConnectionControl::Weak cut = a->weak();
  const ps::ConnectionControl::Weak copy = cut;
  CHECK(copy.alive());
  a = nullptr;
  CHECK_FALSE(cut.alive());
  CHECK_FALSE(copy.alive());
  CHECK_FALSE(cut.abort());  // no crash, no effect
  CHECK_FALSE(ps::ConnectionControl::Weak().alive());
  CHECK_FALSE(ps::ConnectionControl::Weak().abort());
  // The peer sees the close as an end of stream.
  CHECK(read_to_end(l, *b) == 0);
}

TEST_CASE("a message stream's connection() is its socket: abort there ends a pending read") {
  Loop l;
  auto [a, b] = socket_pair(l);
  ps::ClientMessageStream messages(*a);
  CHECK(&messages.connection() == static_cast<ps::ConnectionControl*>(a.get()));

  auto reading = messages.tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr);
  // Nothing has come: the read is still waiting.
  l.wait(l.port.getTimer().afterDelay(20 * kj::MILLISECONDS));
  messages.connection().abort();
  bool ended = false;
  try {
    ended = l.wait(kj::mv(reading)) == nullptr;  // the end of the stream
  } catch (const kj::Exception& e) {
    ended = e.getType() == kj::Exception::Type::DISCONNECTED;
  }
  CHECK(ended);
  CHECK(read_to_end(l, *b) == 0);  // and the peer sees the end
}
