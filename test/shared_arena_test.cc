// libpsclient's shared memory blocks (client/shared_arena.h) and the region
// under them (common/net/shared_region.h), without a psd.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "ps/errors.h"
#include "common/net/shared_arena.h"

using namespace ps;

namespace {

std::shared_ptr<SharedArena> arena_of(uint64_t bytes) {
  return std::make_shared<SharedArena>(SharedRegion::create(bytes), 1);
}

}  // namespace

TEST_CASE("blocks are handed out first fit, aligned, and coalesce when released") {
  auto arena = arena_of(1024);
  auto a = arena->allocate(100);  // 128 with alignment
  auto b = arena->allocate(64);
  auto c = arena->allocate(700);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(*a == 0);
  CHECK(*b == 128);
  CHECK(*c == 192);
  CHECK(arena->bytes_in_use() == 128 + 64 + 704);
  CHECK_FALSE(arena->allocate(129));  // 128 left
  CHECK(arena->allocate(128));
  arena->release(*a);
  arena->release(*b);
  // The two freed neighbours make one block of 192.
  auto d = arena->allocate(192);
  REQUIRE(d);
  CHECK(*d == 0);
  CHECK_FALSE(arena->allocate(1));
  arena->release(*c);
  arena->release(*d);
  arena->release(1024 - 128);
  CHECK(arena->bytes_in_use() == 0);
  auto whole = arena->allocate(1024);
  REQUIRE(whole);
  CHECK(*whole == 0);
  CHECK_FALSE(arena->allocate(0));
}

TEST_CASE("a request's blocks come back once answered, and never if it gave up") {
  auto arena = arena_of(4096);
  {
    SharedBlocks blocks(arena);
    REQUIRE(blocks.take(1000));
    REQUIRE(blocks.take(1000));
    CHECK(arena->bytes_in_use() == 2048);
    blocks.answered();
  }
  CHECK(arena->bytes_in_use() == 0);
  {
    SharedBlocks blocks(arena);
    REQUIRE(blocks.take(1024));
  }  // given up: psd may still write there
  CHECK(arena->bytes_in_use() == 1024);
  CHECK(arena->bytes_lost() == 1024);
  SharedBlocks next(arena);
  auto offset = next.take(1024);
  REQUIRE(offset);
  CHECK(*offset == 1024);  // not the lost block
}

TEST_CASE("a region is a sealed memfd that a second mapping sees") {
  auto region = SharedRegion::create(1 << 20);
  CHECK(region->size() == 1 << 20);
  // Sealed: it cannot shrink under a peer's mapping.
  CHECK(ftruncate(region->fd(), 4096) != 0);
  const auto token = region->stamp_token();
  auto peer = SharedRegion::open_peer(getpid(), region->fd(), 1 << 20, token);
  std::memcpy(region->data() + 4096, "psd", 4);
  CHECK(std::memcmp(peer->data() + 4096, "psd", 4) == 0);
  CHECK(peer->contains(0, 1 << 20));
  CHECK_FALSE(peer->contains(1, 1 << 20));
  CHECK_FALSE(peer->contains(~uint64_t{0}, 2));  // no wrap-around
  CHECK_THROWS_WITH(SharedRegion::open_peer(getpid(), region->fd(), 1 << 19, token),
                    Catch::Contains("--max_shared_memory_mb"));
  // Only the region that holds the token sent with it (not a stranger's
  // behind a reused pid), and only with a whole token.
  SharedRegion::Token other = token;
  other[3] ^= std::byte{1};
  CHECK_THROWS_WITH(SharedRegion::open_peer(getpid(), region->fd(), 1 << 20, other),
                    Catch::Contains("does not hold the token"));
  CHECK_THROWS_WITH(
      SharedRegion::open_peer(getpid(), region->fd(), 1 << 20, std::span(token).first(8)),
      Catch::Contains("a token of 16 bytes"));
  // A new token each time.
  CHECK(region->stamp_token() != token);
}

TEST_CASE("psd refuses descriptors that are not sealed memory files") {
  const SharedRegion::Token kAnyToken{};  // refused before it is looked at
  SECTION("an unsealed memfd") {
    const int fd = memfd_create("plain", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 4096) == 0);
    CHECK_THROWS_WITH(SharedRegion::open_peer(getpid(), fd, 1 << 20, kAnyToken),
                      Catch::Contains("sealed"));
    close(fd);
  }
  SECTION("a pipe") {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    CHECK_THROWS_AS(SharedRegion::open_peer(getpid(), fds[1], 1 << 20, kAnyToken), RequestError);
    close(fds[0]);
    close(fds[1]);
  }
  SECTION("a descriptor that is not open") {
    CHECK_THROWS_WITH(SharedRegion::open_peer(getpid(), 1 << 20, 1 << 20, kAnyToken),
                      Catch::Contains("cannot open"));
  }
}
