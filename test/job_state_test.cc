// ps::JobState (server/job_state.h): waits whose callers gave up (psd
// cancels a waiting pull, waitReady or barrier when its caller goes away)
// are swept from its lists, and count as no barrier's arrivals; the ones
// still wanted are kept and released.
#include <catch2/catch.hpp>

#include <kj/async.h>
#include <kj/timer.h>

#include "server/job_state.h"

TEST_CASE("waits whose callers gave up do not pile up; the others are kept") {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  kj::TimerImpl timer(kj::origin<kj::TimePoint>());
  ps::JobState job(timer);

  auto kept_step = job.wait_for_step(1);
  auto kept_ready = job.wait_ready(10 * kj::SECONDS);
  // Each dropped at once, as a cancelled call drops it.
  for (int i = 0; i < 1000; ++i) {
    (void)job.wait_for_step(2 + i % 7);
    (void)job.wait_ready(10 * kj::SECONDS);
    (void)job.barrier("b", 2000, 10 * kj::SECONDS);
  }
  CHECK(job.held_waits() < 200);

  // Nor do they count as arrivals at their barrier: two callers still
  // waiting are what a barrier of two needs.
  auto first = job.barrier("b", 2, 10 * kj::SECONDS);
  CHECK_FALSE(first.poll(ws));
  CHECK(job.barrier("b", 2, 10 * kj::SECONDS).wait(ws) == 2);
  CHECK(first.wait(ws) == 2);

  job.advance_step();
  CHECK(kept_step.poll(ws));
  job.set_ready();
  REQUIRE(kept_ready.poll(ws));
  CHECK(kept_ready.wait(ws));
}
