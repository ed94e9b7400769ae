// common/net/busy_poll.h: the polling budget's and the contention check's
// arithmetic; that neither form loses an event or a wake-up from another
// thread while it polls, nor polls on after its budget; and that a polling
// port stands aside while the CPUs are oversubscribed.
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <kj/async-unix.h>
#include <kj/timer.h>

#include "common/net/busy_poll.h"

using namespace ps;
using namespace std::chrono_literals;

namespace {

struct SocketPair {
  int fd[2];
  SocketPair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fd) == 0); }
  ~SocketPair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  void send_byte() { REQUIRE(::write(fd[1], "x", 1) == 1); }
};

// Waits on the loop (bounded) for a byte another thread sends after `delay`.
void wait_for_byte_sent_later(kj::UnixEventPort& port, kj::WaitScope& ws,
                              std::chrono::milliseconds delay) {
  SocketPair pair;
  kj::UnixEventPort::FdObserver observer(port, pair.fd[0],
                                         kj::UnixEventPort::FdObserver::OBSERVE_READ);
  auto readable = observer.whenBecomesReadable();
  std::thread writer([&] {
    std::this_thread::sleep_for(delay);
    pair.send_byte();
  });
  port.getTimer().timeoutAfter(5 * kj::SECONDS, kj::mv(readable)).wait(ws);
  writer.join();
}

// Twice as many spinning threads as cores, while it lives: a thread of the
// test then waits for a CPU most of the time.
struct CpuHogs {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  CpuHogs() {
    for (unsigned i = 0; i < 2 * std::max(1u, std::thread::hardware_concurrency()); ++i) {
      threads.emplace_back([this] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
    }
  }
  ~CpuHogs() { end(); }
  void end() {
    stop = true;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
};

}  // namespace

TEST_CASE("the polling budget doubles after short waits and halves, to nothing, after long ones") {
  PollBudget budget(64us);
  CHECK(budget.current() == 64us);
  budget.waited(100us);
  CHECK(budget.current() == 32us);
  budget.waited(10ms);
  CHECK(budget.current() == 16us);
  budget.waited(10ms);
  CHECK(budget.current() == 8us);
  budget.waited(10ms);
  CHECK(budget.current() == 0us);  // below max/16: stop polling
  budget.waited(10ms);
  CHECK(budget.current() == 0us);
  budget.waited(20us);  // a wait polling would have caught: start again, small
  CHECK(budget.current() == 8us);
  budget.waited(20us);
  CHECK(budget.current() == 16us);
  budget.waited(1us);
  budget.waited(1us);
  budget.waited(1us);
  CHECK(budget.current() == 64us);  // never above the maximum

  PollBudget off(0us);
  CHECK_FALSE(off.enabled());
  off.waited(1us);
  CHECK(off.current() == 0us);
}

TEST_CASE("a polling event port sees a socket event while polling, and sleeps with no budget") {
  for (auto budget : {0us, 200000us}) {
    CAPTURE(budget.count());
    kj::UnixEventPort port;
    PollingEventPort polling(port, budget,
                             OnContention::kIgnore);  // a loaded machine must not turn it off
    kj::EventLoop loop(polling);
    kj::WaitScope ws(loop);
    wait_for_byte_sent_later(port, ws, 2ms);
    if (budget.count() == 0) {
      CHECK(polling.polled_waits() == 0);
    } else {
      CHECK(polling.polled_waits() >= 1);
    }
  }
}

TEST_CASE("a polling event port sleeps at once while a hold is on, and polls again after") {
  kj::UnixEventPort port;
  PollingEventPort polling(port, 200000us, OnContention::kIgnore);
  kj::EventLoop loop(polling);
  kj::WaitScope ws(loop);
  polling.hold();  // as a same-host row pull waiting for psd's gather
  polling.hold();  // two in flight
  wait_for_byte_sent_later(port, ws, 2ms);
  polling.release();
  wait_for_byte_sent_later(port, ws, 2ms);
  CHECK(polling.polled_waits() == 0);  // the byte came while it slept
  polling.release();
  wait_for_byte_sent_later(port, ws, 2ms);
  CHECK(polling.polled_waits() >= 1);  // its budget untouched by the held waits
}

TEST_CASE("a polling event port passes on wake-ups from other threads") {
  kj::UnixEventPort port;
  PollingEventPort polling(port, 200000us);
  kj::EventLoop loop(polling);
  kj::WaitScope ws(loop);
  const kj::Executor& executor = loop.getExecutor();
  auto paf = kj::newPromiseAndCrossThreadFulfiller<int>();
  std::thread other([&] {
    std::this_thread::sleep_for(2ms);
    executor.executeSync([&] { paf.fulfiller->fulfill(7); });
  });
  CHECK(port.getTimer().timeoutAfter(5 * kj::SECONDS, kj::mv(paf.promise)).wait(ws) == 7);
  other.join();
}

TEST_CASE("busy polling sees events and cross-thread work, then stops after its budget") {
  kj::UnixEventPort port;
  kj::EventLoop loop(port);
  kj::WaitScope ws(loop);
  BusyPoll busy(port, 20000us, OnContention::kIgnore);  // a loaded machine must not turn it off
  CHECK_FALSE(busy.polling());
  busy.kick();
  CHECK(busy.polling());

  // An event that arrives while it polls.
  wait_for_byte_sent_later(port, ws, 1ms);
  CHECK(busy.polling());

  // Work handed over from another thread while it polls (the wake-up its
  // own poll() consumes must still reach the loop).
  busy.kick();
  auto paf = kj::newPromiseAndCrossThreadFulfiller<int>();
  std::thread other([&] {
    std::this_thread::sleep_for(1ms);
    paf.fulfiller->fulfill(7);
  });
  CHECK(port.getTimer().timeoutAfter(5 * kj::SECONDS, kj::mv(paf.promise)).wait(ws) == 7);
  other.join();

  // No more work: it stops within its budget (plus scheduling slack).
  port.getTimer().afterDelay(200 * kj::MILLISECONDS).wait(ws);
  CHECK_FALSE(busy.polling());
}

TEST_CASE(
    "CPU contention turns polling off while it lasts, longer each time polling brings it back") {
  using Clock = CpuContention::Clock;
  const uint64_t tid = 42;
  CpuContention c;
  Clock::time_point t = Clock::now();
  std::chrono::nanoseconds delay = 0ns;
  // One 2 ms window in which the thread waited `share` of the time for a CPU.
  auto window = [&](double share) {
    t += 2ms;
    delay += std::chrono::nanoseconds(static_cast<int64_t>(share * 2e6));
    return c.update(t, delay, tid);
  };
  CHECK_FALSE(c.update(t, delay, tid));  // the first reading only sets the baseline

  // A blip (one window at 30%) among quiet ones is not contention.
  for (double share : {0.0, 0.02, 0.3, 0.0, 0.0, 0.05, 0.0}) CHECK_FALSE(window(share));

  // Sustained waiting: off within two windows, and off while it lasts.
  const bool at_once = window(0.5);
  CHECK((at_once || window(0.5)));
  for (int i = 0; i < 50; ++i) CHECK(window(0.5));
  // It ends: on again once the average decays (~16 windows), not before 2.
  CHECK(window(0.0));
  CHECK(window(0.0));
  int off_windows = 2;
  while (window(0.0) && off_windows < 100) ++off_windows;
  CHECK(off_windows < 30);

  // Polling brings it back at once, again and again: each time off longer.
  std::vector<int> off_spells;
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 100 && !window(0.5); ++i) {
    }
    int n = 1;
    while (n < 1000 && window(0.0)) ++n;
    off_spells.push_back(n);
  }
  CAPTURE(off_spells);
  CHECK(off_spells.back() > off_spells.front() + 20);  // grew, to the 128 ms cap (64 windows)
  CHECK(off_spells.back() <= 64 + 2);

  // Another thread's counter (the client's loop is run by whichever thread
  // calls) says nothing about this one's: a fresh baseline, no verdict.
  CpuContention d;
  const Clock::time_point t0 = Clock::now();
  CHECK_FALSE(d.update(t0, 0ns, 1));
  CHECK_FALSE(d.update(t0 + 2ms, 50ms, 2));
}

TEST_CASE(
    "a polling event port stops polling while the CPUs are oversubscribed, and polls again after") {
  if (!thread_run_delay()) {
    WARN("SKIPPED: this kernel reports no run-queue delay (/proc/thread-self/schedstat)");
    return;
  }
  kj::UnixEventPort port;
  PollingEventPort polling(port,
                           200000us);  // longer than every wait here: only contention stops it
  kj::EventLoop loop(polling);
  kj::WaitScope ws(loop);

  CpuHogs hogs;
  // Bounded: until a run of waits that did not poll, at most 2 s.
  int quiet_run = 0;
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (quiet_run < 5 && std::chrono::steady_clock::now() < deadline) {
    const uint64_t before = polling.polled_waits();
    wait_for_byte_sent_later(port, ws, 3ms);
    quiet_run = polling.polled_waits() == before ? quiet_run + 1 : 0;
  }
  hogs.end();
  CHECK(quiet_run >= 5);

  // CPUs free again: polling comes back once the hold (at most 128 ms) ends.
  bool polled_again = false;
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (!polled_again && std::chrono::steady_clock::now() < until) {
    const uint64_t before = polling.polled_waits();
    wait_for_byte_sent_later(port, ws, 0ms);
    polled_again = polling.polled_waits() > before;
  }
  CHECK(polled_again);
}

TEST_CASE("psd's busy polling stops early while the CPUs are oversubscribed") {
  if (!thread_run_delay()) {
    WARN("SKIPPED: this kernel reports no run-queue delay (/proc/thread-self/schedstat)");
    return;
  }
  kj::UnixEventPort port;
  kj::EventLoop loop(port);
  kj::WaitScope ws(loop);
  BusyPoll busy(port, 200000us);  // 200 ms: only contention ends it within the 100 ms below
  CpuHogs hogs;
  busy.kick();
  port.getTimer().afterDelay(100 * kj::MILLISECONDS).wait(ws);
  CHECK_FALSE(busy.polling());
}
