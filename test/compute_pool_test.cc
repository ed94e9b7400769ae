// ps::ComputePool (server/compute_pool.h).
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "server/compute_pool.h"
#include "test/kj_test_loop.h"

namespace {

// Records the thread that destroys it.
struct Witness {
  explicit Witness(std::thread::id* on) : destroyed_on(on) {}
  Witness(const Witness&) = delete;
  ~Witness() { *destroyed_on = std::this_thread::get_id(); }
  std::thread::id* destroyed_on;
};

}  // namespace

TEST_CASE("what a task captures is destroyed on the KJ thread, not the pool's") {
  // A task often captures state of the event loop (a fulfiller, a request's
  // shared state); a pool thread dropping the last reference races the loop.
  ps::test::Loop loop;
  ps::ComputePool pool(1);
  std::thread::id destroyed_on;
  std::thread::id ran_on;
  {
    auto witness = std::make_shared<Witness>(&destroyed_on);
    auto p = pool.run(7, [witness, &ran_on] { ran_on = std::this_thread::get_id(); });
    witness = nullptr;  // the task holds the last reference
    loop.wait(kj::mv(p));
  }
  pool.join();  // the pool thread is done with everything it held
  REQUIRE(ran_on != std::this_thread::get_id());
  REQUIRE(destroyed_on == std::this_thread::get_id());
}

TEST_CASE("a task dropped before it starts is destroyed on the KJ thread") {
  ps::test::Loop loop;
  ps::ComputePool pool(1);
  std::thread::id destroyed_on;
  {
    // Block the strand so the second task is still queued when dropped.
    std::atomic<bool> go{false};
    auto blocker = pool.run(1, [&go] {
      while (!go.load()) std::this_thread::yield();
    });
    auto witness = std::make_shared<Witness>(&destroyed_on);
    {
      auto dropped = pool.run(1, [witness] {});
      witness = nullptr;
    }
    const bool here = destroyed_on == std::this_thread::get_id();
    go = true;
    loop.wait(kj::mv(blocker));
    REQUIRE(here);
  }
  pool.join();
}

TEST_CASE("run_parts calls every part once, on the caller and the pool, and returns after all") {
  ps::ComputePool pool(3);
  for (std::size_t parts : {0u, 1u, 2u, 7u, 64u}) {
    for (unsigned helpers : {0u, 1u, 3u, 8u}) {
      INFO(parts << " parts, " << helpers << " helpers");
      std::vector<std::atomic<int>> calls(parts);
      std::atomic<int> finished{0};
      std::mutex m;
      std::set<std::thread::id> threads;
      pool.run_parts(parts, helpers, [&](std::size_t p) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++calls[p];
        {
          std::lock_guard lock(m);
          threads.insert(std::this_thread::get_id());
        }
        ++finished;
      });
      // Every part ran exactly once, before run_parts returned.
      REQUIRE(finished.load() == int(parts));
      for (auto& c : calls) REQUIRE(c.load() == 1);
      // No more threads than asked for, the caller's included.
      CHECK(threads.size() <= std::min<std::size_t>(helpers, 3) + 1);
      if (parts > 0) CHECK(threads.size() >= 1);
    }
  }
  // With many parts that each take a while, a helper does take some.
  std::mutex m;
  std::set<std::thread::id> threads;
  pool.run_parts(32, 3, [&](std::size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard lock(m);
    threads.insert(std::this_thread::get_id());
  });
  CHECK(threads.size() >= 2);
  CHECK(threads.count(std::this_thread::get_id()) == 1);
}

TEST_CASE("run_parts finishes on the caller while every pool thread is busy") {
  // The table push on psd's event loop must not wait on a pool held up by a
  // long update: the caller takes every part no helper has started.
  ps::test::Loop loop;
  ps::ComputePool pool(1);
  std::atomic<bool> go{false};
  auto blocker = pool.run(1, [&go] {
    while (!go.load()) std::this_thread::yield();
  });
  std::atomic<int> calls{0};
  std::set<std::thread::id> threads;
  pool.run_parts(16, 1, [&](std::size_t) {
    ++calls;
    threads.insert(std::this_thread::get_id());  // one thread only: no race
  });
  CHECK(calls.load() == 16);
  CHECK(threads == std::set<std::thread::id>{std::this_thread::get_id()});
  go = true;
  loop.wait(kj::mv(blocker));
  pool.join();  // the late helper found nothing to do
}
