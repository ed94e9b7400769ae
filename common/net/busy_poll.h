// Polling for a while before sleeping, for event loops whose next event
// usually comes within tens of microseconds.
//
// On a VM, a thread that sleeps in epoll_wait() and is woken by a packet
// pays for the halt and the wake-up, a large part of a small round trip. A
// loop that keeps asking the kernel for events (epoll_wait with no timeout,
// cheap) for a short while sees the next message as soon as it lands, so
// small pulls and pushes come back sooner (docs/performance.md, "Figures
// behind design choices in the code", and "Busy polling"). The price is a
// core kept busy, which on a machine with fewer cores than busy threads
// slows everyone. Hence psd (--busy_poll_us) and clients
// (ClientOptions::busy_poll) poll up to 50 us by default, and both adapt:
//  - to the waits, as Linux's guest halt-polling: a wait that polling would
//    have caught (it ended within the budget) doubles the time polled next,
//    one that outlasted the budget halves it, down to not polling at all
//    until waits get short again;
//  - to the machine (CpuContention): while the polling thread has had to
//    wait for a CPU, no polling, so polling clients that share too few cores
//    with psd run as fast as clients that never poll.
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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

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

// Whether polling stops while CpuContention says the machine is busy:
// always in use; tests of the polling itself ignore it, so that a loaded
// test machine does not turn polling off under them.
enum class OnContention { kStopPolling, kIgnore };

// Whether the thread that polls has lately had to wait for a CPU, i.e. a
// poll would keep a core from a thread with work to do. The signal is the
// thread's run-queue delay (/proc/thread-self/schedstat), read at most once
// per 2 ms window and averaged over ~8 windows, so one process running for a
// moment is not contention: over 1/16 of the time spent waiting turns
// polling off for a hold time, and keeps it off while the waiting lasts. The
// hold doubles (to 128 ms) each time polling brings the waiting back, and
// halves with each window polled with almost none. Where schedstat is
// missing: never contended.
class CpuContention {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kWindow = std::chrono::milliseconds(2);
  static constexpr auto kMaxHold = std::chrono::milliseconds(128);

  explicit CpuContention(OnContention on = OnContention::kStopPolling)
      : ignore_(on == OnContention::kIgnore) {}

  // True while polling should stay off; reads the thread's delay at most
  // once per window. Never, with OnContention::kIgnore.
  bool contended(Clock::time_point now);
  // The arithmetic, apart for tests: the thread's total run-queue delay so
  // far (`thread` names whose it is; a change of thread starts afresh).
  bool update(Clock::time_point now, std::chrono::nanoseconds run_delay, uint64_t thread);

 private:
  const bool ignore_;
  Clock::time_point last_{};
  std::chrono::nanoseconds last_delay_{0};
  uint64_t thread_ = 0;
  double waiting_ = 0;  // recent share of time spent waiting for a CPU
  bool off_ = false;
  Clock::time_point off_until_{};
  Clock::duration hold_ = kWindow;
};

// This thread's total run-queue delay so far, if the kernel reports it.
std::optional<std::chrono::nanoseconds> thread_run_delay();

class PollingEventPort final : public kj::EventPort {
 public:
  PollingEventPort(kj::UnixEventPort& inner, std::chrono::microseconds budget,
                   OnContention on_contention = OnContention::kStopPolling)
      : inner_(inner), budget_(budget), contention_(on_contention) {}

  bool wait() override;
  bool poll() override { return inner_.poll(); }
  void setRunnable(bool runnable) override {
    runnable_ = runnable;
    inner_.setRunnable(runnable);
  }
  void wake() const override { inner_.wake(); }

  // Waits that ended while polling (for tests and benchmarks).
  uint64_t polled_waits() const { return polled_waits_; }

  // While any hold is on (taken on any thread), waits sleep at once: the
  // loop awaits something known to take longer than a poll (a reply psd
  // must first gather many rows for), and polling would only keep a core
  // from the threads doing that work.
  void hold() { holds_.fetch_add(1, std::memory_order_relaxed); }
  void release() { holds_.fetch_sub(1, std::memory_order_relaxed); }

 private:
  kj::UnixEventPort& inner_;
  std::atomic<int> holds_{0};
  PollBudget budget_;
  CpuContention contention_;
  bool runnable_ = false;
  uint64_t polled_waits_ = 0;
};

class BusyPoll {
 public:
  BusyPoll(kj::UnixEventPort& port, std::chrono::microseconds budget,
           OnContention on_contention = OnContention::kStopPolling)
      : port_(port), budget_(budget), contention_(on_contention) {}
  // On the loop's thread, on new work: once the loop runs out of work, it
  // polls for a while before sleeping.
  void kick();
  bool polling() const { return spinning_; }

 private:
  kj::Promise<void> spin();

  kj::UnixEventPort& port_;
  PollBudget budget_;
  CpuContention contention_;
  PollBudget::Clock::time_point idle_since_{};
  bool kicked_ = false;
  bool spinning_ = false;
  kj::Promise<void> spinner_ = nullptr;
};

}  // namespace ps
