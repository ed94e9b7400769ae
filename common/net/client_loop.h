// libpsclient's KJ event loop, run by whichever thread needs it.
//
// A blocking call from a thread that finds the loop free runs the loop
// itself: it builds the request, sends it and waits for the reply on its own
// thread, with no hand-over to another thread and back (two cross-thread
// wake-ups, on a VM more than the rest of a small pull). When
// another thread is running the loop, the work is handed to that thread
// through the loop's kj::Executor, as any thread-per-loop design does.
//
// Work that goes on after the call that started it returns (an async push
// in flight, a report) is "kept": a helper thread runs the loop until all
// kept work is done, then goes back to sleep.
//
// Every Cap'n Proto object of the client belongs to the loop; code touching
// them runs inside run() (or in promise continuations, which the loop runs).
// The loop is the client's own (kj::UnixEventPort + kj::EventLoop, sockets
// from common/net/socket_stream.h) rather than kj::setupAsyncIo()'s, which
// binds its loop to the thread that made it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include <kj/async-io.h>
#include <kj/common.h>
#include <kj/async-unix.h>
#include <kj/time.h>

#include "common/net/busy_poll.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PS_TSAN 1
#endif
#elif defined(__SANITIZE_THREAD__)
#define PS_TSAN 1
#endif
#ifdef PS_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#define PS_TSAN_ACQUIRE(a) __tsan_acquire((void*)(a))
#define PS_TSAN_RELEASE(a) __tsan_release((void*)(a))
#define PS_TSAN_IGNORE_BEGIN() \
  (AnnotateIgnoreReadsBegin(__FILE__, __LINE__), AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define PS_TSAN_IGNORE_END() \
  (AnnotateIgnoreWritesEnd(__FILE__, __LINE__), AnnotateIgnoreReadsEnd(__FILE__, __LINE__))
#else
#define PS_TSAN_ACQUIRE(a) ((void)0)
#define PS_TSAN_RELEASE(a) ((void)0)
#define PS_TSAN_IGNORE_BEGIN() ((void)0)
#define PS_TSAN_IGNORE_END() ((void)0)
#endif

namespace ps {

// kj's timer reads the clock only when its loop polls or waits, and this
// loop sleeps between calls (no thread runs it then): timer().now() and
// afterDelay() at the start of a call can lie as far in the past as the
// client was idle, so a deadline from them could expire at once. Deadlines
// are taken from the clock the loop's port reads.
inline kj::TimePoint clock_now() { return kj::systemPreciseMonotonicClock().now(); }

class ClientLoop {
 public:
  // busy_poll: how long a wait polls before it sleeps (common/net/busy_poll.h).
  explicit ClientLoop(std::chrono::microseconds busy_poll = {});
  ~ClientLoop();  // stops the helper; cancel kept work first
  ClientLoop(const ClientLoop&) = delete;
  ClientLoop& operator=(const ClientLoop&) = delete;

  // Runs f() with the loop and waits for it, and for the promise it returns
  // if any; returns its value or throws its kj::Exception. Must not be
  // called from inside the loop (a promise continuation).
  template <typename F>
  auto run(F&& f) {
    std::unique_lock drive = take_loop();
    if (drive.owns_lock()) {
      std::optional<kj::WaitScope> scope;
      if (enter(scope)) {
        KJ_DEFER(leave(scope, drive));
        return as_promise(f).wait(*scope);
      }
      drive.unlock();  // this thread runs a KJ loop of its own: hand over
    }
    // Another thread runs the loop: hand the work over, and have the helper
    // run the loop until it is done should that thread leave first.
    keep();
    PS_TSAN_RELEASE(&f);
    // ThreadSanitizer does not see executeSync's synchronisation (inside
    // libkj, not instrumented). The loop thread releases once the work's
    // promise is done (its result written into executeSync's event, on this
    // thread's stack); this thread acquires after executeSync returns. Its
    // own accesses inside executeSync (reading that result out, before the
    // acquire can be made) are left out: it only waits there.
    PS_TSAN_IGNORE_BEGIN();
    KJ_DEFER({
      PS_TSAN_ACQUIRE(&f);
      PS_TSAN_IGNORE_END();
    });
    return executor_->executeSync([this, &f] {
      PS_TSAN_ACQUIRE(&f);
      // evalNow: work that throws still releases (and counts its release()).
      return kj::evalNow([&f] { return as_promise(f); }).attach(kj::defer([this, &f] {
        PS_TSAN_RELEASE(&f);
        release();
      }));
    });
  }

  // As run(), for an f() that returns a kj::Promise<void>, and giving it
  // up on request: while this thread waits for the promise, it asks stop()
  // every `every` (on this thread, outside the loop's continuations,
  // whichever thread runs the loop). Once stop() returns true the promise
  // is destroyed, on the loop, before run_interruptible returns false
  // (nothing of the work runs after that); true: the promise completed.
  // stop() must not throw, nor use what this loop serves.
  template <typename F, typename Stop>
  bool run_interruptible(F&& f, Stop&& stop, kj::Duration every) {
    std::unique_lock drive = take_loop();
    if (drive.owns_lock()) {
      std::optional<kj::WaitScope> scope;
      if (enter(scope)) {
        KJ_DEFER(leave(scope, drive));
        // Dropping the fork (at return) destroys the work.
        auto work = kj::evalNow([&f] { return as_promise(f); }).fork();
        for (;;) {
          bool ticked = false;
          work.addBranch()
              .exclusiveJoin(after(every).then([&ticked] { ticked = true; }))
              .wait(*scope);
          if (!ticked) return true;
          if (stop()) return false;
        }
      }
      drive.unlock();  // this thread runs a KJ loop of its own: hand over
    }
    return hand_over_interruptible(f, stop, every);
  }

  // Marks work that outlives the run() that started it; the helper thread
  // runs the loop until release() has been called as often. keep() from any
  // thread; release() only from the loop (attach it to the work's promise).
  void keep();
  void release();
  // Ties a promise to keep()/release(): call inside run().
  // Tell whoever waits for the work's result in a continuation of kept(p),
  // not inside p: kj drops p (and so calls release()) before running the
  // continuation, and the waiter's next call finds no kept work (take_loop()).
  template <typename T>
  kj::Promise<T> kept(kj::Promise<T> p) {
    keep();
    return p.attach(kj::defer([this] { release(); }));
  }

  // Only inside run() or the loop's continuations.
  kj::UnixEventPort& port() { return *port_; }
  kj::Timer& timer() { return port_->getTimer(); }
  // `delay` from now on the clock itself (see clock_now).
  kj::Promise<void> after(kj::Duration delay) { return timer().atTime(clock_now() + delay); }

  // While one is alive, the loop's waits do not poll (PollingEventPort::hold).
  //   auto hold = kj::heap<ClientLoop::PollingHold>(loop);
  //   return long_wait.attach(kj::mv(hold));
  class PollingHold {
   public:
    explicit PollingHold(ClientLoop& loop) : port_(*loop.polling_) { port_.hold(); }
    ~PollingHold() { port_.release(); }
    PollingHold(const PollingHold&) = delete;
    PollingHold& operator=(const PollingHold&) = delete;

   private:
    PollingEventPort& port_;
  };

 private:
  // run_interruptible's work handed to the thread that runs the loop: this
  // thread waits for its outcome in slices of `every`, asking stop() in
  // between, and cancels it through the loop's executor (kj::Canceler:
  // destroyed before cancel() returns) when stop() says so.
  template <typename F, typename Stop>
  bool hand_over_interruptible(F& f, Stop& stop, kj::Duration every) {
    struct Handover {
      std::mutex mutex;
      std::condition_variable settled;
      bool done = false;                 // under mutex
      kj::Maybe<kj::Exception> error;    // loop thread, read once done
      kj::Canceler* canceler = nullptr;  // loop thread: null once the work is gone
    };
    auto h = std::make_shared<Handover>();
    keep();
    // ThreadSanitizer and executeSync: as in run().
    PS_TSAN_RELEASE(&f);
    PS_TSAN_IGNORE_BEGIN();
    executor_->executeSync([this, h, &f] {
      PS_TSAN_ACQUIRE(&f);
      auto canceler = kj::heap<kj::Canceler>();
      h->canceler = canceler.get();
      auto work = kj::evalNow([&f] { return as_promise(f); });
      // The outcome is told once the work's promises are destroyed, not when
      // its last continuation runs: what they hold (the caller's frame)
      // must be gone before the caller returns.
      canceler->wrap(kj::mv(work))
          .then([] {}, [h](kj::Exception&& e) { h->error = kj::mv(e); })
          .attach(kj::defer([this, h] {
                    h->canceler = nullptr;
                    {
                      std::lock_guard lock(h->mutex);
                      h->done = true;
                      h->settled.notify_all();
                    }
                    release();
                  }),
                  kj::mv(canceler))
          .detach([](kj::Exception&&) {});
      PS_TSAN_RELEASE(&f);
    });
    PS_TSAN_ACQUIRE(&f);
    PS_TSAN_IGNORE_END();
    const auto slice = std::chrono::nanoseconds(every / kj::NANOSECONDS);
    std::unique_lock lock(h->mutex);
    while (!h->settled.wait_for(lock, slice, [&h] { return h->done; })) {
      lock.unlock();
      const bool give_up = stop();
      lock.lock();
      if (give_up && !h->done) {
        lock.unlock();
        // As above: executeSync's own hand-back is invisible to TSan.
        PS_TSAN_IGNORE_BEGIN();
        executor_->executeSync([h] {
          if (h->canceler != nullptr) h->canceler->cancel("interrupted");
        });
        PS_TSAN_IGNORE_END();
        return false;
      }
    }
    KJ_IF_MAYBE (e, h->error) {
      kj::throwFatalException(kj::mv(*e));
    }
    return true;
  }

  // f()'s result as a promise (f may return void, a value or a promise).
  template <typename F>
  static kj::PromiseForResult<F&, void> as_promise(F& f) {
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      return kj::READY_NOW;
    } else {
      return f();
    }
  }

  // The loop's lock if this thread may run the loop now. Right after kept
  // work ends the helper still holds the loop for a moment (it polls once
  // before sleeping); a call handed over then would keep the helper on the
  // loop, and the caller's next call would find it busy again, and so on:
  // two cross-thread wake-ups per call, for good. So while the helper holds
  // the loop with no kept work left, wait (briefly) for it to let go.
  std::unique_lock<std::mutex> take_loop();
  // Enters the loop on this thread; false if the thread has a loop of its own.
  bool enter(std::optional<kj::WaitScope>& scope);
  // Sends what the finished work left queued, leaves the loop, and wakes
  // the helper if kept work remains.
  void leave(std::optional<kj::WaitScope>& scope, std::unique_lock<std::mutex>& drive);
  void helper_main();
  void wake_helper();

  kj::Own<kj::UnixEventPort> port_;
  kj::Own<PollingEventPort> polling_;
  kj::Own<kj::EventLoop> loop_;
  kj::Own<const kj::Executor> executor_;

  std::mutex drive_;  // held by the thread running the loop
  std::atomic<bool> helper_driving_{
      false};  // the helper holds drive_ (or is about to, or just did)
  std::atomic<uint64_t> kept_{0};
  kj::Own<kj::PromiseFulfiller<void>> drained_;  // the helper's wake-up when kept_ hits 0

  std::mutex helper_mutex_;
  std::condition_variable helper_cv_;
  std::atomic<bool> stop_{false};
  std::thread helper_;
};

}  // namespace ps
