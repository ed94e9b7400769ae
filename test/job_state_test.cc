// ps::JobState (server/job_state.h): waits whose callers gave up (psd
// cancels a waiting pull, waitReady or barrier when its caller goes away)
// are swept from its lists, and count as no barrier's arrivals; the ones
// still wanted are kept and released.
#include <catch2/catch.hpp>

#include <kj/async.h>
#include <kj/timer.h>

#include "server/job_state.h"

// A JobState on an event loop of its own, its timer moved by hand.
struct JobOnALoop {
  kj::EventLoop loop;
  kj::WaitScope ws{loop};
  kj::TimerImpl timer{kj::origin<kj::TimePoint>()};
  ps::JobState job{timer};
};

TEST_CASE_METHOD(JobOnALoop, "waits whose callers gave up do not pile up; the others are kept") {
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

TEST_CASE_METHOD(JobOnALoop,
                 "a configured job takes a new stop step ahead of its global step, nothing else") {
  ps::JobConfig c{.total_replicas = 2, .train_steps = 20};
  job.restore(true, c, 20, true);  // restored from a checkpoint at its stop step
  CHECK(job.stop_reached());
  // Until this run's chief configures it, its stop step may still move.
  CHECK(job.awaiting_chief());
  ps::JobConfig refused = c;
  refused.total_replicas = 3;
  CHECK_THROWS(job.configure(refused));
  CHECK(job.awaiting_chief());

  // The same job again, named with the checkpoint's start step: unchanged.
  ps::JobConfig same = c;
  same.start_step = 20;
  job.configure(same);
  CHECK(job.config().train_steps == 20);
  CHECK_FALSE(job.awaiting_chief());

  // Extended: goes on.
  ps::JobConfig longer = c;
  longer.train_steps = 40;
  job.configure(longer);
  CHECK(job.config().train_steps == 40);
  CHECK_FALSE(job.stop_reached());
  CHECK(job.global_step() == 20);

  // A stop step behind the job, or another mode or worker count: refused, unchanged.
  ps::JobConfig behind = c;
  behind.train_steps = 10;
  CHECK_THROWS_WITH(job.configure(behind), Catch::Contains("at global step 20"));
  ps::JobConfig other = longer;
  other.total_replicas = 3;
  CHECK_THROWS_WITH(job.configure(other), Catch::Contains("only the stop step may change"));
  ps::JobConfig sync = longer;
  sync.mode = ps::SyncMode::kSync;
  sync.replicas_to_aggregate = 2;
  CHECK_THROWS(job.configure(sync));
  CHECK(job.config() == longer);

  // A finished job extended is no longer finished (psd would exit on it).
  job.finish();
  ps::JobConfig longest = c;
  longest.train_steps = 60;
  job.configure(longest);
  CHECK_FALSE(job.finished());
}

TEST_CASE_METHOD(JobOnALoop,
                 "a job started at the largest step stops there: its step never passes kMaxStep") {
  job.configure({.start_step = ps::kMaxStep - 1});
  CHECK_FALSE(job.stop_reached());
  job.advance_step();
  CHECK(job.global_step() == ps::kMaxStep);
  CHECK(job.stop_reached());  // no stop step was given: kMaxStep is one
  job.advance_step();
  CHECK(job.global_step() == ps::kMaxStep);
}

TEST_CASE_METHOD(
    JobOnALoop,
    "a barrier that skips lost workers ends once every worker still in the job has come") {
  ps::JobConfig config;
  config.total_replicas = 4;
  job.configure(config);
  for (int w = 0; w < 4; ++w) job.connect(w, w == 0, "127.0.0.1:1");
  const auto minute = 60 * kj::SECONDS;

  // Worker 3 died before the barrier: the three others are enough.
  job.disconnect(3, false);
  auto a0 = job.barrier("end", 4, minute, 0, true);
  auto a1 = job.barrier("end", 4, minute, 1, true);
  CHECK_FALSE(a0.poll(ws));
  CHECK(job.barrier("end", 4, minute, 2, true).wait(ws) == 3);
  CHECK(a0.wait(ws) == 3);
  CHECK(a1.wait(ws) == 3);

  // Worker 2 lost while 0 and 1 wait: the barrier ends then.
  auto b0 = job.barrier("end2", 4, minute, 0, true);
  auto b1 = job.barrier("end2", 4, minute, 1, true);
  CHECK_FALSE(b0.poll(ws));
  job.disconnect(2, false);
  REQUIRE(b0.poll(ws));
  CHECK(b0.wait(ws) == 2);
  CHECK(b1.wait(ws) == 2);

  // A lost worker that is waiting at the barrier counts once, as a caller.
  job.connect(2, false, "127.0.0.1:1");
  auto c2 = job.barrier("end3", 4, minute, 2, true);
  job.disconnect(2, false);  // its connection closes; its call has not been cancelled yet
  auto c0 = job.barrier("end3", 4, minute, 0, true);
  CHECK_FALSE(c0.poll(ws));
  CHECK(job.barrier("end3", 4, minute, 1, true).wait(ws) == 3);
  CHECK(c0.wait(ws) == 3);
  CHECK(c2.wait(ws) == 3);

  // Without skipping, lost workers are waited for; a caller asking the
  // other way is refused, and changes nothing.
  auto d0 = job.barrier("plain", 4, minute, 0);
  auto d1 = job.barrier("plain", 4, minute, 1);
  CHECK_THROWS_WITH(job.barrier("plain", 4, minute, 3, true),
                    Catch::Contains("wait for lost workers, this call asks to skip them"));
  CHECK_FALSE(d0.poll(ws));
  CHECK_FALSE(d1.poll(ws));
}

TEST_CASE_METHOD(JobOnALoop,
                 "a barrier that skips lost workers still waits for one that never connected") {
  ps::JobConfig config;
  config.total_replicas = 3;
  job.configure(config);
  job.connect(0, true, "127.0.0.1:1");
  job.connect(1, false, "127.0.0.1:1");  // worker 2 has not started yet
  auto a0 = job.barrier("end", 3, 60 * kj::SECONDS, 0, true);
  auto a1 = job.barrier("end", 3, 60 * kj::SECONDS, 1, true);
  CHECK_FALSE(a0.poll(ws));
  CHECK_FALSE(a1.poll(ws));
  timer.advanceTo(timer.now() + 61 * kj::SECONDS);
  CHECK_THROWS_WITH(a0.wait(ws), Catch::Contains("missing workers 2 (never connected)"));
}

TEST_CASE_METHOD(
    JobOnALoop,
    "a barrier skips only lost workers among the job's first `count`, and none without a job") {
  const auto minute = 60 * kj::SECONDS;
  // No job configured: a worker that came and went is not skipped.
  job.connect(0, true, "127.0.0.1:1");
  job.connect(7, false, "127.0.0.1:1");
  job.disconnect(7, false);
  auto a0 = job.barrier("meet", 2, minute, 0, true);
  CHECK_FALSE(a0.poll(ws));
  ps::JobConfig config;
  config.total_replicas = 4;
  job.configure(config);
  // A barrier of the chief and worker 1 in a job of 4: lost worker 3 is none of its callers.
  job.connect(3, false, "127.0.0.1:1");
  job.disconnect(3, false);
  auto b0 = job.barrier("pair", 2, minute, 0, true);
  CHECK_FALSE(b0.poll(ws));
  job.connect(1, false, "127.0.0.1:1");
  CHECK(job.barrier("pair", 2, minute, 1, true).wait(ws) == 2);
  CHECK(b0.wait(ws) == 2);
}
