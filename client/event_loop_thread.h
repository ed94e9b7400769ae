// The thread that runs libpsclient's KJ event loop. All Cap'n Proto objects
// live on it; other threads hand it work through its kj::Executor.
#pragma once

#include <thread>

#include <kj/async-io.h>

namespace ps {

class EventLoopThread {
 public:
  EventLoopThread();
  ~EventLoopThread();  // stops the loop and joins
  EventLoopThread(const EventLoopThread&) = delete;
  EventLoopThread& operator=(const EventLoopThread&) = delete;

  // Runs f() on the loop thread and waits for it (and for the promise it
  // returns, if any). Callable from any thread but the loop's own.
  template <typename F>
  auto run_sync(F&& f) {
    return executor_->executeSync(std::forward<F>(f));
  }

  // Only to be used on the loop thread.
  kj::AsyncIoContext& io() { return *io_; }
  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  std::thread thread_;
  kj::Own<const kj::Executor> executor_;
  kj::AsyncIoContext* io_ = nullptr;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
};

}  // namespace ps
