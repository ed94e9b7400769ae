#include "python/src/async_calls.h"

namespace psclient_py {

py::object new_python_future() {
  // Leaked on purpose: a static py::object would be released after the interpreter is gone.
  static py::handle future_type =
      py::object(py::module_::import("concurrent.futures").attr("Future")).release();
  py::object future = future_type();
  future.attr("set_running_or_notify_cancel")();
  return future;
}

AsyncCalls::~AsyncCalls() { stop(); }

void AsyncCalls::add(std::unique_ptr<AsyncCall> call) {
  std::lock_guard lock(state_->mu);
  state_->queue.push_back(std::move(call));
  if (!thread_.joinable()) {
    state_->stopping = false;
    thread_ = std::thread(run, state_);
  }
  state_->cv.notify_one();
}

void AsyncCalls::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
    state_->cv.notify_one();
  }
  if (thread_.get_id() == std::this_thread::get_id()) {
    // Called from one of the thread's own callbacks: it drains its queue
    // and ends by itself; a later add() starts a new one on a new state.
    thread_.detach();
    state_ = std::make_shared<State>();
    return;
  }
  py::gil_scoped_release nogil;
  thread_.join();
}

void AsyncCalls::run(std::shared_ptr<State> state) {
  for (;;) {
    std::unique_ptr<AsyncCall> call;
    {
      std::unique_lock lock(state->mu);
      state->cv.wait(lock, [&] { return state->stopping || !state->queue.empty(); });
      if (state->queue.empty()) return;
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
