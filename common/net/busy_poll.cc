#include "common/net/busy_poll.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <kj/debug.h>

namespace ps {

using Clock = PollBudget::Clock;

void PollBudget::waited(Clock::duration waited) {
  if (!enabled()) return;
  if (waited <= max_) {
    // Polling catches waits like this one: poll longer (from nothing, start small).
    now_ = std::min<Clock::duration>(max_, now_.count() == 0 ? max_ / 8 : now_ * 2);
  } else {
    now_ = now_ / 2;
    if (now_ <= max_ / 16) now_ = Clock::duration::zero();
  }
}

std::optional<std::chrono::nanoseconds> thread_run_delay() {
  // One descriptor per thread, kept open: a read is then one pread().
  thread_local struct File {
    int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    ~File() {
      if (fd >= 0) ::close(fd);
    }
  } file;
  if (file.fd < 0) return std::nullopt;
  char text[128];
  const ssize_t n = ::pread(file.fd, text, sizeof(text) - 1, 0);
  if (n <= 0) return std::nullopt;
  text[n] = '\0';
  unsigned long long on_cpu = 0, waiting = 0;  // "on-CPU ns, run-queue ns, time slices"
  if (std::sscanf(text, "%llu %llu", &on_cpu, &waiting) != 2) return std::nullopt;
  return std::chrono::nanoseconds(waiting);
}

bool CpuContention::update(Clock::time_point now, std::chrono::nanoseconds run_delay,
                           uint64_t thread) {
  if (thread == thread_ && last_ != Clock::time_point{} && run_delay >= last_delay_ &&
      now > last_) {
    const double fraction = std::chrono::duration<double>(run_delay - last_delay_).count() /
                            std::chrono::duration<double>(now - last_).count();
    // An average over ~8 windows: one window's blip (another process
    // running for a moment) is not contention; a sustained share is.
    waiting_ += (std::min(fraction, 1.0) - waiting_) / 8;
    if (waiting_ > 1.0 / 16) {
      if (!off_) {
        // Off for a while (and while the waiting lasts), longer each time
        // polling brings the waiting back.
        off_ = true;
        off_until_ = now + hold_;
        hold_ = std::min<Clock::duration>(hold_ * 2, kMaxHold);
      }
    } else if (off_) {
      off_ = now < off_until_;
    } else if (waiting_ < 1.0 / 64) {
      hold_ = std::max<Clock::duration>(hold_ / 2, kWindow);  // polled with (almost) no waiting
    }
  }
  last_ = now;
  last_delay_ = run_delay;
  thread_ = thread;
  return off_;
}

bool CpuContention::contended(Clock::time_point now) {
  if (ignore_) return false;
  if (now - last_ < kWindow) return off_;
  const auto delay = thread_run_delay();
  if (!delay) {
    last_ = now;
    return false;
  }
  return update(now, *delay, static_cast<uint64_t>(::syscall(SYS_gettid)));
}

bool PollingEventPort::wait() {
  const auto start = Clock::now();
  if (holds_.load(std::memory_order_relaxed) > 0) return inner_.wait();  // the budget untouched
  if (budget_.current().count() > 0 && !contention_.contended(start)) {
    const auto deadline = start + budget_.current();
    do {
      const bool woken = inner_.poll();
      if (woken || runnable_) {
        budget_.waited(Clock::now() - start);
        ++polled_waits_;
        return woken;
      }
    } while (Clock::now() < deadline);
  }
  const bool woken = inner_.wait();
  budget_.waited(Clock::now() - start);
  return woken;
}

void BusyPoll::kick() {
  if (!budget_.enabled()) return;
  if (!kicked_ && idle_since_ != Clock::time_point{}) {
    // The first work after an idle spell: was it short enough to poll through?
    budget_.waited(Clock::now() - idle_since_);
    idle_since_ = {};
  }
  kicked_ = true;
  if (spinning_) return;
  spinning_ = true;
  spinner_ = spin().eagerlyEvaluate([this](kj::Exception&& e) {
    spinning_ = false;
    KJ_LOG(ERROR, "busy polling stopped", e);
  });
}

kj::Promise<void> BusyPoll::spin() {
  // evalLast: this runs once all other queued work is done, i.e. when the
  // loop would otherwise sleep; the budget counts from the first such turn
  // after the last kick.
  return kj::evalLast([this]() -> kj::Promise<void> {
    const auto now = Clock::now();
    if (kicked_) {
      kicked_ = false;
      idle_since_ = now;
    }
    if (now - idle_since_ >= budget_.current() || contention_.contended(now)) {
      spinning_ = false;  // the loop sleeps; idle_since_ stays for the next kick to judge
      return kj::READY_NOW;
    }
    // poll() reports a wake-up from another thread (psd's compute pool
    // handing work back) once, and only the loop's own poll acts on it:
    // pass it on.
    if (port_.poll()) port_.wake();
    return spin();
  });
}

}  // namespace ps
