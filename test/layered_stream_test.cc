// ps::layer_socket and ps::replay_first (common/net/layered_stream.h), over a
// socket pair with no TLS in between: the replayed bytes come first,
// read_exact never writes to a destination after it changed, holds are
// released once their piece is written, and abort cuts the socket.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>
#include <kj/debug.h>

#include "common/net/layered_stream.h"
#include "common/net/socket_stream.h"
#include "test/kj_test_loop.h"

namespace {

using ps::test::Loop;

// The layered end (a SocketStream over replay_first of `first` over one
// socket) and the other, plain end.
struct Layered {
  kj::Own<ps::SocketStream> layered;
  kj::Own<ps::SocketStream> peer;
};

Layered layered_pair(Loop& l, std::vector<kj::byte> first = {}) {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  auto socket = ps::wrap_socket(l.port, fds[0]);
  ps::SocketStream& under = *socket;
  auto replay =
      ps::replay_first(kj::heapArray<kj::byte>(first.data(), first.size()), kj::mv(socket));
  return {ps::layer_socket(kj::mv(replay), under), ps::wrap_socket(l.port, fds[1])};
}

}  // namespace

TEST_CASE("replay_first hands out the bytes read before, then the socket's") {
  Loop l;
  auto p = layered_pair(l, {1, 2, 3});
  const kj::byte rest[] = {4, 5, 6, 7};
  l.wait(p.peer->write(rest, sizeof(rest)));
  kj::byte got[7] = {};
  CHECK(l.wait(p.layered->tryRead(got, 7, 7)) == 7);
  CHECK(std::vector<kj::byte>(got, got + 7) == std::vector<kj::byte>{1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("read_exact asks where each piece goes after it arrived") {
  Loop l;
  auto p = layered_pair(l);
  std::vector<kj::byte> before(100, 0), after(100, 0);
  bool moved = false;
  auto read = p.layered->read_exact(
      100, [&](size_t offset) { return (moved ? after.data() : before.data()) + offset; });
  std::vector<kj::byte> first(40, 0xaa), second(60, 0xbb);
  l.wait(p.peer->write(first.data(), first.size()));
  // Let the first piece arrive, then move the destination.
  l.wait(l.port.getTimer().afterDelay(20 * kj::MILLISECONDS));
  moved = true;
  l.wait(p.peer->write(second.data(), second.size()));
  l.wait(kj::mv(read));
  CHECK(std::count(before.begin(), before.begin() + 40, 0xaa) == 40);
  CHECK(std::count(before.begin() + 40, before.end(), 0) == 60);  // untouched after the move
  CHECK(std::count(after.begin() + 40, after.end(), 0xbb) == 60);
}

TEST_CASE("a hold is released once the piece starting at its address is written") {
  Loop l;
  auto p = layered_pair(l);
  auto values = std::make_shared<std::vector<kj::byte>>(1000, 7);
  p.layered->hold_until_sent(values->data(), values);
  CHECK(values.use_count() == 2);
  const kj::ArrayPtr<const kj::byte> pieces[] = {kj::arrayPtr(values->data(), values->size())};
  l.wait(p.layered->write(kj::arrayPtr(pieces, 1)));
  CHECK(values.use_count() == 1);
  std::vector<kj::byte> got(1000);
  l.wait(p.peer->read(got.data(), got.size()));
  CHECK(got == *values);
}

TEST_CASE("abort cuts the socket under the layer: writes fail, reads end") {
  Loop l;
  auto p = layered_pair(l);
  p.layered->abort();
  const kj::byte one = 1;
  CHECK_THROWS_AS(l.wait(p.layered->write(&one, 1)), kj::Exception);
  kj::byte got = 0;
  CHECK(l.wait(p.peer->tryRead(&got, 1, 1)) == 0);
}
