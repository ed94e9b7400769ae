// Carries libpsclient's std::futures to Python: each *_async call returns a
// concurrent.futures.Future (so asyncio.wrap_future and
// concurrent.futures.wait work), which one thread per Client completes as
// the calls end, in the order they were made (a call that ends early is
// reported once those before it are). The arrays lent to a call are held
// until then.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include "python/src/errors.h"
#include "python/src/array_buffer.h"

namespace psclient_py {

namespace py = pybind11;

class AsyncCall {
 public:
  virtual ~AsyncCall() = default;  // GIL held
  virtual void wait() = 0;         // GIL released: until the C++ call ends
  virtual void complete() = 0;     // GIL held: sets the Python future
};

// A new concurrent.futures.Future, already marked running (it cannot be
// cancelled: the request may be on the wire). GIL held.
py::object new_python_future();
// Imports what new_python_future() needs; called once, when the module is imported.
void init_async_calls();

template <class T>
class FutureCall : public AsyncCall {
 public:
  using Convert = std::function<py::object(T&&)>;
  FutureCall(std::future<T> future, py::object python_future, std::vector<ArrayBuffer> buffers,
             Convert convert)
      : future_(std::move(future)),
        python_future_(std::move(python_future)),
        buffers_(std::move(buffers)),
        convert_(std::move(convert)) {}

  void wait() override {
    try {
      value_.emplace(future_.get());
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  void complete() override {
    py::object outcome;
    bool ok = !error_;
    try {
      outcome = ok ? convert_(std::move(*value_)) : exception_object(error_);
    } catch (py::error_already_set& e) {
      ok = false;
      outcome = e.value();
    }
    buffers_.clear();  // the arrays are the caller's again before anyone hears of the result
    python_future_.attr(ok ? "set_result" : "set_exception")(outcome);
  }

 private:
  std::future<T> future_;
  py::object python_future_;
  std::vector<ArrayBuffer> buffers_;
  Convert convert_;
  std::optional<T> value_;
  std::exception_ptr error_;
};

class AsyncCalls {
 public:
  AsyncCalls() = default;
  ~AsyncCalls();  // stop()
  AsyncCalls(const AsyncCalls&) = delete;
  AsyncCalls& operator=(const AsyncCalls&) = delete;

  // GIL held. Starts the completing thread when none is running.
  void add(std::unique_ptr<AsyncCall> call);
  // Waits (GIL released) for every call added so far to be completed, and
  // ends the thread; callers in several threads all wait. GIL held on
  // entry. add() may be called again later. Returns false, the calls not
  // all completed, when `interrupted` (asked every 100 ms) says so.
  bool stop(const std::function<bool()>& interrupted = {});
  // Called from one of the completing thread's own callbacks (a Client
  // dropped or closed there): `keep` is released once the calls queued
  // before it are completed, not before (they need the Client), on that
  // thread, without the GIL. Returns false elsewhere, keeping nothing.
  bool keep_until_completed(std::shared_ptr<void> keep);

 private:
  // Shared with the thread, which is detached and ends by itself once
  // stopping with its queue empty.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::unique_ptr<AsyncCall>> queue;
    bool running = false;   // a thread serves this queue
    bool stopping = false;  // it ends once the queue is empty
    uint64_t ended = 0;     // threads that have ended
    std::thread::id thread_id;
    std::vector<std::shared_ptr<void>> keep;  // released when the thread ends
  };
  static void run(std::shared_ptr<State> state);

  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// A concurrent.futures.Future of `future`'s value, converted by `convert`
// (GIL held), completed by `calls`; `buffers` are held until then. GIL held.
template <class T, class Convert>
py::object start_async(AsyncCalls& calls, std::future<T> future, std::vector<ArrayBuffer> buffers,
                       Convert convert) {
  py::object python_future = new_python_future();
  calls.add(std::make_unique<FutureCall<T>>(std::move(future), python_future, std::move(buffers),
                                            typename FutureCall<T>::Convert(std::move(convert))));
  return python_future;
}

}  // namespace psclient_py
