// ps::ClientLoop (common/net/client_loop.h): work runs on the calling thread
// when the loop is free and is handed over when it is not; kept work is
// carried to its end by the helper thread; a thread with a KJ loop of its
// own is served too.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <kj/async-unix.h>
#include <kj/debug.h>

#include "common/net/client_loop.h"

using namespace std::chrono_literals;

// A TaskSet for kept work, made and dropped on the loop.
struct KeptTasks {
  struct Log : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  } log;
  ps::ClientLoop& loop;
  kj::Own<kj::TaskSet> set;
  explicit KeptTasks(ps::ClientLoop& l) : loop(l) {
    loop.run([&] { set = kj::heap<kj::TaskSet>(log); });
  }
  ~KeptTasks() {
    loop.run([&] { set = nullptr; });
  }
};

TEST_CASE("run returns values, promises' values and errors") {
  ps::ClientLoop loop;
  REQUIRE(loop.run([] { return 7; }) == 7);
  REQUIRE(loop.run([&] {
    return loop.timer().afterDelay(1 * kj::MILLISECONDS).then([] { return 8; });
  }) == 8);
  int touched = 0;
  loop.run([&] { touched = 1; });
  REQUIRE(touched == 1);
  REQUIRE_THROWS_AS(loop.run([]() -> kj::Promise<int> { return KJ_EXCEPTION(FAILED, "no"); }),
                    kj::Exception);
}

TEST_CASE("an uncontended run stays on the calling thread") {
  ps::ClientLoop loop;
  const auto me = std::this_thread::get_id();
  REQUIRE(loop.run([] { return std::this_thread::get_id(); }) == me);
}

TEST_CASE("many threads at once: every piece of work runs exactly once") {
  ps::ClientLoop loop;
  std::atomic<int> done{0};
  int on_loop = 0;  // only touched on the loop: no lock needed
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        const int got = loop.run([&] {
          return loop.timer().afterDelay((i % 3) * kj::MICROSECONDS).then([&] {
            return ++on_loop;
          });
        });
        // Catch2's assertions are not thread-safe: checked on the main thread.
        if (got > 0) ++done;
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(done == 1200);
  REQUIRE(loop.run([&] { return on_loop; }) == 1200);
}

TEST_CASE("kept work finishes with no further calls (the helper runs it)") {
  ps::ClientLoop loop;
  std::atomic<bool> fired{false};
  KeptTasks tasks(loop);
  loop.run([&] {
    tasks.set->add(
        loop.kept(loop.timer().afterDelay(30 * kj::MILLISECONDS).then([&] { fired = true; })));
  });
  REQUIRE_FALSE(fired);
  for (int i = 0; i < 200 && !fired; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(fired);
}

TEST_CASE("a thread running a KJ loop of its own is served by hand-over") {
  ps::ClientLoop loop;
  kj::UnixEventPort port;
  kj::EventLoop own(port);
  kj::WaitScope scope(own);
  REQUIRE(loop.run([] { return 42; }) == 42);
  REQUIRE(loop.run([&] {
    return loop.timer().afterDelay(1 * kj::MILLISECONDS).then([] { return 43; });
  }) == 43);
}

// A future set by kept work wakes its waiter while the helper still holds
// the loop; if the waiter's next blocking call handed itself over, the
// helper would stay on the loop and every later call would be handed over
// too (two cross-thread wake-ups each). A blocking call after an async one
// must come back to the calling thread.
TEST_CASE("a call right after kept work ends runs on the calling thread") {
  ps::ClientLoop loop;
  KeptTasks tasks(loop);
  const auto me = std::this_thread::get_id();
  int here = 0;
  const int rounds = 200;
  for (int i = 0; i < rounds; ++i) {
    std::promise<void> done;
    auto future = done.get_future();
    loop.run([&] {
      // The helper is slow to let go of the loop (a busy machine): it
      // stays on it a moment after waking this thread.
      tasks.set->add(loop.kept(loop.timer().afterDelay(10 * kj::MICROSECONDS)).then([&] {
        done.set_value();
        std::this_thread::sleep_for(200us);
      }));
    });
    future.wait();
    // As a trainer does: several blocking calls after each async one.
    int local = 0;
    for (int j = 0; j < 5; ++j) local += loop.run([] { return std::this_thread::get_id(); }) == me;
    here += local == 5;
  }
  INFO(here << " of " << rounds << " rounds ran all their blocking calls on the calling thread");
  // Handed over, every round hands over (0 of 200); a loaded machine may
  // keep the helper off a core past the wait now and then.
  REQUIRE(here >= rounds / 2);
}

// Calls made while the helper carries kept work are handed over to it; once
// that work is done, the next calls must come back to the calling thread,
// not keep the helper on the loop for each other.
TEST_CASE("calls handed over while kept work runs come back once it ends") {
  ps::ClientLoop loop;
  KeptTasks tasks(loop);
  std::atomic<bool> fired{false};
  loop.run([&] {
    tasks.set->add(
        loop.kept(loop.timer().afterDelay(20 * kj::MILLISECONDS)).then([&] { fired = true; }));
  });
  const auto me = std::this_thread::get_id();
  int handed_over = 0, after = 0, after_here = 0;
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (after < 2000 && std::chrono::steady_clock::now() < end) {
    const bool was_fired = fired;
    const bool here = loop.run([] { return std::this_thread::get_id(); }) == me;
    handed_over += !here;
    if (was_fired) {
      ++after;
      after_here += here;
    }
  }
  INFO(handed_over << " calls handed over; after the kept work: " << after_here << " of " << after
                   << " here");
  CHECK(handed_over > 0);  // the helper held the loop for the timer
  REQUIRE(after == 2000);
  // Handing over at the helper's last moment made chains of hand-overs:
  // 1872-1880 of 2000 here; with the wait, one in a long preemption at most.
  REQUIRE(after_here >= after * 97 / 100);
}

// Work that throws as it starts, handed over (here: from a thread with a KJ
// loop of its own), fails its run() and counts as done: before, its keep()
// was never released, the helper stayed on the loop for good, and every
// later call of every thread was handed over to it.
TEST_CASE("work that throws on the hand-over path leaves no kept work behind") {
  ps::ClientLoop loop;
  std::thread own_loop([&] {
    kj::UnixEventPort port;
    kj::EventLoop own(port);
    kj::WaitScope scope(own);
    for (int i = 0; i < 3; ++i) {
      try {
        loop.run([]() -> int { throw std::runtime_error("refused as it starts"); });
      } catch (const kj::Exception&) {
      }
    }
  });
  own_loop.join();
  const auto me = std::this_thread::get_id();
  int here = 0;
  const auto end = std::chrono::steady_clock::now() + 2s;
  while (here < 50 && std::chrono::steady_clock::now() < end) {
    here += loop.run([] { return std::this_thread::get_id(); }) == me;
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(here == 50);
}
