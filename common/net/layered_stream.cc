#include "common/net/layered_stream.h"

#include <cstring>
#include <memory>
#include <vector>

#include <kj/debug.h>

#include "common/net/send_holds.h"

namespace ps {

namespace {

class LayeredSocketStream final : public SocketStream {
 public:
  LayeredSocketStream(kj::Own<kj::AsyncIoStream> top, SocketStream& socket, ExplainFailure explain)
      : top_(kj::mv(top)), socket_(socket), explain_(std::move(explain)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    ++read_calls_;
    return explained(top_->tryRead(buffer, min_bytes, max_bytes));
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    single_piece_ = kj::arrayPtr(static_cast<const kj::byte*>(buffer), size);
    return write(kj::arrayPtr(&single_piece_, 1));
  }

  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    if (aborted_) {
      return KJ_EXCEPTION(DISCONNECTED, "connection cut (abort) before this write");
    }
    return explained(top_->write(pieces)).attach(holds_.take(pieces));
  }

  void hold_until_sent(const void* data, std::shared_ptr<const void> hold) override {
    holds_.add(data, std::move(hold));
  }

  kj::Promise<void> read_exact(size_t bytes, kj::Function<kj::byte*(size_t)> where) override {
    if (bounce_.size() == 0) bounce_ = kj::heapArray<kj::byte>(kBounceBytes);
    return read_exact_from(bytes, kj::mv(where), 0);
  }

  void limit_read_ahead(size_t) override {}
  void land_next_read(size_t, kj::ArrayPtr<kj::byte>) override {}
  void release(kj::ArrayPtr<const kj::byte>) override {}
  uint64_t read_calls() const override { return read_calls_; }

  void abort() override {
    aborted_ = true;
    socket_.abort();
  }
  void detect_dead_peer(std::chrono::milliseconds after) override {
    socket_.detect_dead_peer(after);
  }

  kj::Promise<void> whenWriteDisconnected() override { return top_->whenWriteDisconnected(); }
  void shutdownWrite() override { top_->shutdownWrite(); }
  void abortRead() override { top_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    socket_.getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    socket_.setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    socket_.getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    socket_.getpeername(addr, length);
  }
  // No descriptor: bytes written to the socket directly would bypass the layer.
  kj::Maybe<int> getFd() const override { return nullptr; }

 private:
  static constexpr size_t kBounceBytes = 64u << 10;

  kj::Promise<void> read_exact_from(size_t bytes, kj::Function<kj::byte*(size_t)> where,
                                    size_t got) {
    if (got == bytes) return kj::READY_NOW;
    ++read_calls_;
    const size_t ask = std::min(bytes - got, bounce_.size());
    return explained(top_->tryRead(bounce_.begin(), 1, ask))
        .then([this, bytes, where = kj::mv(where), got](size_t n) mutable -> kj::Promise<void> {
          if (n == 0) {
            return KJ_EXCEPTION(DISCONNECTED, "connection ended in the middle of a message");
          }
          // Asked now, after the read: the destination may have changed while it waited.
          std::memcpy(where(got), bounce_.begin(), n);
          return read_exact_from(bytes, kj::mv(where), got + n);
        });
  }

  template <class T>
  kj::Promise<T> explained(kj::Promise<T> p) {
    if (!explain_) return p;
    return p.catch_([this](kj::Exception&& e) -> kj::Promise<T> { return explain_(kj::mv(e)); });
  }

  kj::Own<kj::AsyncIoStream> top_;
  SocketStream& socket_;
  ExplainFailure explain_;
  kj::ArrayPtr<const kj::byte> single_piece_;
  SendHolds holds_;
  kj::Array<kj::byte> bounce_;
  uint64_t read_calls_ = 0;
  bool aborted_ = false;
};

class ReplayStream final : public kj::AsyncIoStream {
 public:
  ReplayStream(kj::Array<kj::byte> first, kj::Own<SocketStream> socket)
      : first_(kj::mv(first)), socket_(kj::mv(socket)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    const size_t left = first_.size() - taken_;
    if (left == 0) return socket_->tryRead(buffer, min_bytes, max_bytes);
    const size_t n = std::min(left, max_bytes);
    std::memcpy(buffer, first_.begin() + taken_, n);
    taken_ += n;
    if (n >= min_bytes) return n;
    return socket_->tryRead(static_cast<kj::byte*>(buffer) + n, min_bytes - n, max_bytes - n)
        .then([n](size_t more) { return n + more; });
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return socket_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return socket_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return socket_->whenWriteDisconnected(); }
  void shutdownWrite() override { socket_->shutdownWrite(); }
  void abortRead() override { socket_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    socket_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    socket_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    socket_->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    socket_->getpeername(addr, length);
  }

 private:
  kj::Array<kj::byte> first_;
  size_t taken_ = 0;
  kj::Own<SocketStream> socket_;
};

}  // namespace

kj::Own<SocketStream> layer_socket(kj::Own<kj::AsyncIoStream> top, SocketStream& socket,
                                   ExplainFailure explain) {
  return kj::heap<LayeredSocketStream>(kj::mv(top), socket, std::move(explain));
}

kj::Own<kj::AsyncIoStream> replay_first(kj::Array<kj::byte> first, kj::Own<SocketStream> socket) {
  return kj::heap<ReplayStream>(kj::mv(first), kj::mv(socket));
}

}  // namespace ps
