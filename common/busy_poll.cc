#include "busy_poll.h"

#include <algorithm>

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

bool PollingEventPort::wait() {
  const auto start = Clock::now();
  if (budget_.current().count() > 0) {
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
    if (now - idle_since_ >= budget_.current()) {
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
