#include "compute_pool.h"

#include <kj/debug.h>

#include "ps/errors.h"

namespace ps {

ComputePool::ComputePool(unsigned threads, unsigned strands) : threads_(threads), pool_(threads ? threads : 1) {
  strands_.reserve(strands);
  for (unsigned i = 0; i < strands; ++i) strands_.push_back(asio::make_strand(pool_.get_executor()));
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
    return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str("unknown error in compute task"));
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
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  asio::post(strands_[key % strands_.size()],
             [fn = std::move(fn), fulfiller = kj::mv(paf.fulfiller)]() mutable {
               try {
                 fn();
                 fulfiller->fulfill();
               } catch (...) {
                 fulfiller->reject(to_kj(std::current_exception()));
               }
             });
  return kj::mv(paf.promise);
}

}  // namespace ps
