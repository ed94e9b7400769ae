#include "python/src/async_calls.h"

#include <chrono>

#include <spdlog/spdlog.h>

namespace psclient_py {

namespace {
// Set once, at import (no function-local static: a thread that imported
// under its guard released the GIL in the import, and another thread
// waited for the guard holding the GIL). Leaked on purpose: released after
// the interpreter is gone otherwise.
py::handle future_type;
}  // namespace

void init_async_calls() {
  future_type = py::object(py::module_::import("concurrent.futures").attr("Future")).release();
}

py::object new_python_future() {
  py::object future = future_type();
  future.attr("set_running_or_notify_cancel")();
  return future;
}

AsyncCalls::~AsyncCalls() { stop(); }

void AsyncCalls::add(std::unique_ptr<AsyncCall> call) {
  std::lock_guard lock(state_->mu);
  state_->queue.push_back(std::move(call));
  if (!state_->running) {
    std::thread thread(run, state_);
    state_->running = true;
    state_->stopping = false;
    state_->thread_id = thread.get_id();
    thread.detach();
  }
  state_->cv.notify_all();
}

bool AsyncCalls::stop(const std::function<bool()>& interrupted) {
  const std::shared_ptr<State> state = state_;
  uint64_t ended = 0;
  {
    std::lock_guard lock(state->mu);
    if (!state->running) return true;
    state->stopping = true;
    ended = state->ended;
    state->cv.notify_all();
    if (state->thread_id == std::this_thread::get_id()) {
      // Called from one of the thread's own callbacks: it drains its queue
      // and ends by itself; a later add() starts a new one on a new state.
      state_ = std::make_shared<State>();
      return true;
    }
  }
  py::gil_scoped_release nogil;
  std::unique_lock lock(state->mu);
  const auto start = std::chrono::steady_clock::now();
  auto say_at = start + std::chrono::seconds(5);
  while (!state->cv.wait_for(lock, std::chrono::milliseconds(100),
                             [&] { return state->ended != ended; })) {
    if (const auto now = std::chrono::steady_clock::now(); now >= say_at) {
      // No silent wait: what the Client being closed waits for, and until when.
      say_at += std::chrono::seconds(5);
      spdlog::info(
          "closing the Client: waiting for {} async call(s) to finish ({} s; each ends by its "
          "call_timeout; Ctrl-C stops waiting)",
          state->queue.size() + 1,
          std::chrono::duration_cast<std::chrono::seconds>(now - start).count());
    }
    if (!interrupted) continue;
    lock.unlock();
    const bool stop_waiting = interrupted();  // takes the GIL: not with the lock held
    lock.lock();
    if (stop_waiting && state->ended == ended) return false;
  }
  return true;
}

bool AsyncCalls::keep_until_completed(std::shared_ptr<void> keep) {
  std::lock_guard lock(state_->mu);
  if (!state_->running || state_->thread_id != std::this_thread::get_id()) return false;
  state_->keep.push_back(std::move(keep));
  return true;
}

void AsyncCalls::run(std::shared_ptr<State> state) {
  for (;;) {
    std::unique_ptr<AsyncCall> call;
    {
      std::unique_lock lock(state->mu);
      state->cv.wait(lock, [&] { return state->stopping || !state->queue.empty(); });
      if (state->queue.empty()) {
        std::vector<std::shared_ptr<void>> keep = std::move(state->keep);
        state->running = false;
        ++state->ended;
        state->cv.notify_all();
        lock.unlock();
        keep.clear();  // a Client closed from a callback: its calls are all done
        return;
      }
      call = std::move(state->queue.front());
      state->queue.pop_front();
    }
    call->wait();
    py::gil_scoped_acquire gil;
    try {
      call->complete();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("psclient: completing a future");
    }
    call.reset();
  }
}

}  // namespace psclient_py
