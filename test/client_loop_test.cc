// ps::ClientLoop (client/client_loop.h): work runs on the calling thread
// when the loop is free and is handed over when it is not; kept work is
// carried to its end by the helper thread; a thread with a KJ loop of its
// own is served too.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <kj/async-unix.h>
#include <kj/debug.h>

#include "client_loop.h"

using namespace std::chrono_literals;

TEST_CASE("run returns values, promises' values and errors") {
  ps::ClientLoop loop;
  REQUIRE(loop.run([] { return 7; }) == 7);
  REQUIRE(loop.run([&] { return loop.timer().afterDelay(1 * kj::MILLISECONDS).then([] { return 8; }); }) == 8);
  int touched = 0;
  loop.run([&] { touched = 1; });
  REQUIRE(touched == 1);
  REQUIRE_THROWS_AS(loop.run([]() -> kj::Promise<int> { return KJ_EXCEPTION(FAILED, "no"); }), kj::Exception);
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
          return loop.timer().afterDelay((i % 3) * kj::MICROSECONDS).then([&] { return ++on_loop; });
        });
        REQUIRE(got > 0);
        ++done;
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
  kj::Own<kj::TaskSet> tasks;
  struct Log : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  } log;
  loop.run([&] {
    tasks = kj::heap<kj::TaskSet>(log);
    tasks->add(loop.kept(loop.timer().afterDelay(30 * kj::MILLISECONDS).then([&] { fired = true; })));
  });
  REQUIRE_FALSE(fired);
  for (int i = 0; i < 200 && !fired; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(fired);
  loop.run([&] { tasks = nullptr; });
}

TEST_CASE("a thread running a KJ loop of its own is served by hand-over") {
  ps::ClientLoop loop;
  kj::UnixEventPort port;
  kj::EventLoop own(port);
  kj::WaitScope scope(own);
  REQUIRE(loop.run([] { return 42; }) == 42);
  REQUIRE(loop.run([&] { return loop.timer().afterDelay(1 * kj::MILLISECONDS).then([] { return 43; }); }) == 43);
}
