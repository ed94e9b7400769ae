// The pieces psd's hostile-load defences are made of, without a process:
// the memory budget's accounting, the per-peer log limiter and the
// connection place rules (test/hostile_load_test.cc drives them in a real psd).
#include <catch2/catch.hpp>

#include "common/memory_budget.h"
#include "server/connection_places.h"
#include "server/log_limiter.h"

using namespace ps;
using namespace std::chrono_literals;
using Standing = ConnectionPlaces::Standing;

TEST_CASE("a memory budget refuses what would pass its limit and takes back what is given back") {
  MemoryBudget budget(1000);
  auto a = budget.try_reserve(MemoryUse::kTensors, 600);
  REQUIRE(a);
  CHECK_FALSE(budget.try_reserve(MemoryUse::kReceiving, 401));
  CHECK(budget.refusals() == 1);
  auto b = budget.try_reserve(MemoryUse::kReceiving, 400);
  REQUIRE(b);
  CHECK(budget.available() == 0);
  CHECK_FALSE(a.try_resize(601));
  CHECK(a.bytes() == 600);
  a.resize_anyway(700);  // counted past the limit
  CHECK(budget.used() == 1100);
  CHECK(budget.available() == 0);
  b.reset();
  CHECK(budget.used(MemoryUse::kReceiving) == 0);
  {
    auto moved = std::move(a);
    CHECK(budget.used(MemoryUse::kTensors) == 700);
  }
  CHECK(budget.used() == 0);
  CHECK(budget.take_freed() == 1100);
  CHECK(budget.take_freed() == 0);
  CHECK_THAT(budget.describe(), Catch::Contains("--max_memory_mb"));
  CHECK(MemoryBudget().limit() > 0);  // from /proc/meminfo
}

TEST_CASE(
    "the log limiter lets a few lines per peer address and kind through per interval, then "
    "counts") {
  LogLimiter limiter(10s, 2);
  const auto t0 = LogLimiter::Clock::now();
  uint64_t left_out = 99;
  CHECK(limiter.allow("10.0.0.1:5000", "refused", &left_out, t0));
  CHECK(left_out == 0);
  CHECK(limiter.allow("10.0.0.1:5001", "refused", &left_out, t0));  // another port, same peer
  CHECK_FALSE(limiter.allow("10.0.0.1:5002", "refused", &left_out, t0 + 1s));
  CHECK_FALSE(limiter.allow("10.0.0.1:5003", "refused", &left_out, t0 + 2s));
  CHECK(limiter.allow("10.0.0.2:5000", "refused", &left_out, t0 + 2s));   // another peer
  CHECK(limiter.allow("10.0.0.1:5000", "no hello", &left_out, t0 + 2s));  // another kind
  CHECK(limiter.allow("10.0.0.1:5004", "refused", &left_out, t0 + 11s));
  CHECK(left_out == 2);
  CHECK(LogLimiter::note(2) == " (2 similar lines about this peer left out)");
  CHECK(LogLimiter::host_of("[::1]:80") == "::1");
  CHECK(LogLimiter::host_of("unix") == "unix");
}

TEST_CASE(
    "connection places: a cap per address for non-members, places kept for the job's workers") {
  ConnectionPlaces places(8, 3);
  for (int i = 0; i < 3; ++i) {
    REQUIRE_FALSE(places.refuse_connection("10.0.0.1", false));
    places.opened("10.0.0.1", false);
  }
  auto why = places.refuse_connection("10.0.0.1", false);
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Contains("--max_connections_per_peer"));
  CHECK_FALSE(places.refuse_connection("10.0.0.2", false));
  CHECK_FALSE(places.refuse_connection("unix", true));  // Unix-socket peers are not capped
  // A worker's hello frees its address's count.
  places.said_hello("10.0.0.1", false, Standing::kMember);
  CHECK_FALSE(places.refuse_connection("10.0.0.1", false));
  // Reserved: a quarter of 8 before initJob; two per declared worker and the chief after.
  CHECK(places.reserved(0) == 2);
  CHECK(places.reserved(3) == 8);
  places.said_hello("10.0.0.1", false, Standing::kAnonymous);
  places.said_hello("10.0.0.1", false, Standing::kAnonymous);
  CHECK_FALSE(places.refuse_anonymous_hello(0));  // 2 of 6
  CHECK(places.refuse_anonymous_hello(3));        // none left once 3 workers are declared
  places.closed("10.0.0.1", false, Standing::kAnonymous);
  places.closed("10.0.0.1", false, Standing::kAnonymous);
  places.closed("10.0.0.1", false, Standing::kMember);
  CHECK(places.open() == 0);
  CHECK(places.anonymous_helloed() == 0);
}

TEST_CASE("connection places: connections before hello do not fill the places kept for the job") {
  ConnectionPlaces places(8, 4);  // 2 kept before initJob: 6 for the others
  for (int i = 0; i < 6; ++i) {
    CHECK_FALSE(places.make_room_before_hello("10.0.0." + std::to_string(i % 2), false, 0));
    places.opened("10.0.0." + std::to_string(i % 2), false);
  }
  CHECK(places.before_hello() == 6);
  // Full: the next one gets the place of the oldest that has not said hello.
  CHECK(places.make_room_before_hello("10.0.0.9", false, 0));
  places.closed("10.0.0.0", false, Standing::kBeforeHello);
  places.opened("10.0.0.9", false);
  CHECK(places.before_hello() == 6);
  // Anonymous connections count with them; members do not.
  places.said_hello("10.0.0.9", false, Standing::kMember);
  CHECK_FALSE(places.make_room_before_hello("10.0.0.9", false, 0));
  places.said_hello("10.0.0.1", false, Standing::kAnonymous);
  CHECK_FALSE(places.make_room_before_hello("10.0.0.9", false, 0));  // 4 before hello + 1 anonymous
  places.opened("10.0.0.7", false);
  CHECK(places.make_room_before_hello("10.0.0.8", false, 0));
  // Not for a newcomer whose address is at its cap: it is refused anyway.
  for (int i = 0; i < 4; ++i) places.opened("10.0.0.5", false);
  CHECK_FALSE(places.make_room_before_hello("10.0.0.5", false, 0));
  // Nothing is kept with fewer than 4 places: nothing to make room in.
  ConnectionPlaces small(2, 0);
  small.opened("10.0.0.1", false);
  small.opened("10.0.0.1", false);
  CHECK_FALSE(small.make_room_before_hello("10.0.0.2", false, 0));
}
