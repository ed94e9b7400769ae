#include "event_loop_thread.h"

#include <future>

namespace ps {

EventLoopThread::EventLoopThread() {
  std::promise<void> ready;
  auto ready_future = ready.get_future();
  thread_ = std::thread([this, &ready] {
    auto io = kj::setupAsyncIo();
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    io_ = &io;
    stop_ = kj::mv(paf.fulfiller);
    executor_ = kj::getCurrentThreadExecutor().addRef();
    ready.set_value();
    paf.promise.wait(io.waitScope);
    io_ = nullptr;
  });
  ready_future.wait();
}

EventLoopThread::~EventLoopThread() {
  stop_->fulfill();
  thread_.join();
}

}  // namespace ps
