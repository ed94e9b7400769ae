// Polling for a while before sleeping, for event loops whose next event
// usually comes within tens of microseconds.
//
// On the VMs psd runs on, a thread that sleeps in epoll_wait() and is woken
// by a packet pays for the halt and the wake-up: about 9 us each way, half
// of a 64-byte TCP ping-pong. A loop that keeps asking the kernel for events
// (epoll_wait with no timeout, ~1 us) for a short while sees the next
// message as soon as it lands: with both ends polling, a 4 KiB pull went
// from 48 to 31 us and a 64 KiB push from 65 to 47 us (bench/push_pull_bench
// --busy_poll_us 50 --psd_busy_poll_us 50). The price is a core kept busy,
// which on a machine with fewer cores than busy threads slows everyone:
// psd (one thread) polls by default (--busy_poll_us 50), clients only when
// asked (ClientOptions::busy_poll). Both adapt, as Linux's guest halt-polling:
// a wait that polling would have caught (it ended within the budget) doubles
// the time polled next, one that outlasted the budget halves it, down to
// not polling at all until waits get short again.
//
// Two forms, for the two kinds of loop:
//  - PollingEventPort wraps a kj::UnixEventPort the caller owns (libpsclient's
//    loop): each wait() polls first.
//  - BusyPoll runs on a loop whose port it cannot wrap (psd's, made by
//    kj::setupAsyncIo): kick() on new work, and it polls, as the loop's last
//    queued work, once the loop runs out of work.
//
//   kj::UnixEventPort port;
//   PollingEventPort polling(port, std::chrono::microseconds(50));
//   kj::EventLoop loop(polling);
#pragma once

#include <chrono>

#include <kj/async-unix.h>

namespace ps {

// How long to poll next, from how long the last waits took.
class PollBudget {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PollBudget(std::chrono::microseconds max) : max_(max), now_(max) {}
  bool enabled() const { return max_.count() > 0; }
  Clock::duration current() const { return now_; }
  // A wait (polling included) that lasted `waited`.
  void waited(Clock::duration waited);

 private:
  const Clock::duration max_;
  Clock::duration now_;
};

class PollingEventPort final : public kj::EventPort {
 public:
  PollingEventPort(kj::UnixEventPort& inner, std::chrono::microseconds budget) : inner_(inner), budget_(budget) {}

  bool wait() override;
  bool poll() override { return inner_.poll(); }
  void setRunnable(bool runnable) override {
    runnable_ = runnable;
    inner_.setRunnable(runnable);
  }
  void wake() const override { inner_.wake(); }

  // Waits that ended while polling (for tests and benchmarks).
  uint64_t polled_waits() const { return polled_waits_; }

 private:
  kj::UnixEventPort& inner_;
  PollBudget budget_;
  bool runnable_ = false;
  uint64_t polled_waits_ = 0;
};

class BusyPoll {
 public:
  BusyPoll(kj::UnixEventPort& port, std::chrono::microseconds budget) : port_(port), budget_(budget) {}
  // On the loop's thread, on new work: once the loop runs out of work, it
  // polls for a while before sleeping.
  void kick();
  bool polling() const { return spinning_; }

 private:
  kj::Promise<void> spin();

  kj::UnixEventPort& port_;
  PollBudget budget_;
  PollBudget::Clock::time_point idle_since_{};
  bool kicked_ = false;
  bool spinning_ = false;
  kj::Promise<void> spinner_ = nullptr;
};

}  // namespace ps
