// common/busy_poll.h: the polling budget's arithmetic, and that neither
// form loses an event or a wake-up from another thread while it polls, nor
// polls on after its budget.
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include <kj/async-unix.h>
#include <kj/timer.h>

#include "busy_poll.h"

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
void wait_for_byte_sent_later(kj::UnixEventPort& port, kj::WaitScope& ws, std::chrono::milliseconds delay) {
  SocketPair pair;
  kj::UnixEventPort::FdObserver observer(port, pair.fd[0], kj::UnixEventPort::FdObserver::OBSERVE_READ);
  auto readable = observer.whenBecomesReadable();
  std::thread writer([&] {
    std::this_thread::sleep_for(delay);
    pair.send_byte();
  });
  port.getTimer().timeoutAfter(5 * kj::SECONDS, kj::mv(readable)).wait(ws);
  writer.join();
}

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
    PollingEventPort polling(port, budget);
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
  BusyPoll busy(port, 20000us);
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
