#include "common/net/client_loop.h"

#include <spdlog/spdlog.h>

namespace ps {

ClientLoop::ClientLoop(std::chrono::microseconds busy_poll)
    : port_(kj::heap<kj::UnixEventPort>()),
      polling_(kj::heap<PollingEventPort>(*port_, busy_poll)),
      loop_(kj::heap<kj::EventLoop>(*polling_)),
      executor_(loop_->getExecutor().addRef()),
      helper_([this] { helper_main(); }) {}

ClientLoop::~ClientLoop() {
  run([this] {
    stop_ = true;
    if (drained_) drained_->fulfill();
  });
  wake_helper();
  helper_.join();
  executor_ = nullptr;
  loop_ = nullptr;
  polling_ = nullptr;
  port_ = nullptr;
}

bool ClientLoop::enter(std::optional<kj::WaitScope>& scope) {
  try {
    scope.emplace(*loop_);
    return true;
  } catch (const kj::Exception&) {
    return false;
  }
}

void ClientLoop::leave(std::optional<kj::WaitScope>& scope, std::unique_lock<std::mutex>& drive) {
  try {
    // Cap'n Proto may queue work behind the reply (handing its Finish to
    // the stream, say): run it now, without asking the kernel for events,
    // which would cost a system call for nothing most of the time.
    loop_->run();
  } catch (const kj::Exception& e) {
    spdlog::warn("libpsclient: {}", e.getDescription().cStr());
  }
  scope.reset();
  drive.unlock();
  if (kept_.load() > 0) wake_helper();
}

std::unique_lock<std::mutex> ClientLoop::take_loop() {
  std::unique_lock drive(drive_, std::try_to_lock);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
  while (!drive.owns_lock() && helper_driving_.load() && kept_.load() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    drive.try_lock();
  }
  return drive;
}

void ClientLoop::keep() {
  if (kept_.fetch_add(1) == 0) wake_helper();
}

void ClientLoop::release() {
  if (kept_.fetch_sub(1) == 1 && drained_) {
    drained_->fulfill();
    drained_ = nullptr;
  }
}

void ClientLoop::wake_helper() {
  // Taking the mutex orders this with the helper's check of kept_ and
  // stop_: no lost wake-up.
  { std::lock_guard lock(helper_mutex_); }
  helper_cv_.notify_one();
}

void ClientLoop::helper_main() {
  for (;;) {
    {
      std::unique_lock lock(helper_mutex_);
      helper_cv_.wait(lock, [this] { return stop_.load() || kept_.load() > 0; });
    }
    // Set from before drive_ is taken until after it is let go: a caller
    // that finds drive_ taken and the flag down knows another caller has it.
    helper_driving_ = true;
    KJ_DEFER(helper_driving_ = false);
    std::lock_guard drive(drive_);
    kj::WaitScope scope(*loop_);
    if (stop_) {
      scope.poll();
      return;
    }
    while (kept_.load() > 0 && !stop_) {
      auto paf = kj::newPromiseAndFulfiller<void>();
      drained_ = kj::mv(paf.fulfiller);
      // kept_ only drops on the loop, which this thread holds: no race.
      if (kept_.load() == 0) break;
      paf.promise.wait(scope);
    }
    drained_ = nullptr;
    scope.poll();
  }
}

}  // namespace ps
