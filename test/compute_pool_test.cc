// ps::ComputePool (server/compute_pool.h).
#include <atomic>
#include <memory>
#include <thread>

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
