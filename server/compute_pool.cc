#include "server/compute_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include <kj/debug.h>

#include "ps/errors.h"

namespace ps {

ComputePool::ComputePool(unsigned threads, unsigned strands)
    : threads_(threads), pool_(threads ? threads : 1) {
  strands_.reserve(strands);
  for (unsigned i = 0; i < strands; ++i)
    strands_.push_back(asio::make_strand(pool_.get_executor()));
}

ComputePool::~ComputePool() { join(); }

void ComputePool::join() {
  if (!joined_) {
    pool_.join();
    joined_ = true;
  }
}

static kj::Exception to_kj(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(ex.what()));
  } catch (...) {
    return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                         kj::str("unknown error in compute task"));
  }
}

kj::Promise<void> ComputePool::run(uint64_t key, std::function<void()> fn) {
  if (threads_ == 0 || joined_) {
    try {
      fn();
      return kj::READY_NOW;
    } catch (...) {
      return to_kj(std::current_exception());
    }
  }
  // fn() typically works on memory of the call that asked for it (a
  // request's gradient, a reply being built). If that call is cancelled (its
  // client went away) the promise is dropped: a task not started yet is
  // skipped, one running is waited for, so fn() never outlives that memory.
  struct Task {
    std::mutex mutex;
    std::condition_variable cv;
    enum { kQueued, kRunning, kDone, kCancelled } state = kQueued;
  };
  auto task = std::make_shared<Task>();
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  // fn is owned by the promise, so what it captures is destroyed on the KJ
  // thread, never on a pool thread after the promise has settled.
  auto owned = std::make_unique<std::function<void()>>(std::move(fn));
  std::function<void()>* f = owned.get();
  asio::post(strands_[key % strands_.size()],
             [f, fulfiller = kj::mv(paf.fulfiller), task]() mutable {
               {
                 std::lock_guard lock(task->mutex);
                 if (task->state == Task::kCancelled) return;
                 task->state = Task::kRunning;
               }
               std::exception_ptr error;
               try {
                 (*f)();
               } catch (...) {
                 error = std::current_exception();
               }
               {
                 std::lock_guard lock(task->mutex);
                 task->state = Task::kDone;
               }
               task->cv.notify_all();
               if (error)
                 fulfiller->reject(to_kj(error));
               else
                 fulfiller->fulfill();
             });
  return paf.promise.attach(kj::defer([task, owned = std::move(owned)] {
    std::unique_lock lock(task->mutex);
    if (task->state == Task::kQueued) task->state = Task::kCancelled;
    task->cv.wait(lock, [&] { return task->state != Task::kRunning; });
  }));
}

void ComputePool::run_parts(std::size_t parts, unsigned helpers,
                            const std::function<void(std::size_t)>& fn) {
  if (parts > 1) helpers = std::min<std::size_t>({helpers, threads_, parts - 1});
  if (parts <= 1 || joined_ || helpers == 0) {
    for (std::size_t p = 0; p < parts; ++p) fn(p);
    return;
  }
  // Parts are handed out by one counter: whoever asks next takes the next
  // part. The state outlives this call for helpers that start late; fn is
  // called only for parts taken, all of which finish before this returns.
  struct Parts {
    const std::function<void(std::size_t)>* fn;
    std::size_t count;
    std::atomic<std::size_t> next{0}, done{0};
  };
  auto state = std::make_shared<Parts>();
  state->fn = &fn;
  state->count = parts;
  auto take = [](Parts& s) {
    for (std::size_t p; (p = s.next.fetch_add(1)) < s.count;) {
      (*s.fn)(p);
      if (s.done.fetch_add(1) + 1 == s.count) s.done.notify_all();
    }
  };
  for (unsigned h = 0; h < helpers; ++h) asio::post(pool_, [state, take] { take(*state); });
  take(*state);
  for (std::size_t d; (d = state->done.load()) < parts;) state->done.wait(d);
}

}  // namespace ps
