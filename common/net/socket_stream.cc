// One file for the one socket type: its read and write paths share the
// buffer and the socket's state, and connecting and wrapping make it.
#include "common/net/socket_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <kj/debug.h>
#include <kj/vector.h>

#include "common/net/busy_poll.h"
#include "common/net/host_port.h"
#include "common/net/send_holds.h"

namespace ps {

namespace {

constexpr size_t kBufferBytes = 64u << 10;
constexpr size_t kLowWaterBytes = 256u << 10;
constexpr size_t kLowWaterMinBytes = 64u << 10;

// How far a read may raise the low-water mark on a same-host connection
// whose send buffers are fixed at `send_buffer` bytes (SO_SNDBUF read
// back; both ends fix theirs alike). Over loopback a segment is up to 64
// KiB, so a peer whose buffer holds little more than the mark can have all
// it may send in flight and still fall short of it: then no wake-up comes
// until the delayed acknowledgement (tens of ms). With 256 KiB buffers a
// 256 KiB mark made one client's 16-64 MiB pulls 2-3x slower than a 128
// KiB one; 128 KiB buffers stalled even at 64 KiB (push_pull_bench with
// PS_SAME_HOST_SEND_BUFFER_KB=128|256, 2026-11-24). So half the buffer
// (256 KiB at most, as elsewhere), and no raised mark under 256 KiB.
void detect_dead_peer(int fd, std::chrono::milliseconds after);

size_t low_water_cap(int send_buffer) {
  if (send_buffer < (256 << 10)) return 0;
  return std::min(static_cast<size_t>(send_buffer) / 2, kLowWaterBytes);
}

class SocketStreamImpl final : public SocketStream {
 public:
  // Reads only: a socket watched for writes too wakes its event loop each
  // time an acknowledgement frees send space (after every reply), for
  // nothing unless a write is waiting. Writes that find the socket full
  // watch a duplicate of it until they are done (when_writable).
  SocketStreamImpl(kj::UnixEventPort& port, int fd, BusyPoll* busy_poll = nullptr)
      : port_(port),
        fd_(fd),
        observer_(port, fd, kj::UnixEventPort::FdObserver::OBSERVE_READ),
        busy_poll_(busy_poll) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    return read_more(static_cast<kj::byte*>(buffer), min_bytes, max_bytes, 0);
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    // One write at a time (kj's rule), so one member holds the piece.
    single_piece_ = kj::arrayPtr(static_cast<const kj::byte*>(buffer), size);
    return write(kj::arrayPtr(&single_piece_, 1));
  }

  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    if (holds_.empty()) return write_more(pieces, 0);
    return write_more(pieces, 0).attach(holds_.take(pieces));
  }

  void hold_until_sent(const void* data, std::shared_ptr<const void> hold) override {
    holds_.add(data, std::move(hold));
  }

  kj::Promise<void> read_exact(size_t bytes, kj::Function<kj::byte*(size_t)> where) override {
    return read_exact_more(bytes, kj::mv(where), 0);
  }

  void limit_read_ahead(size_t bytes) override {
    read_ahead_ = std::clamp<size_t>(bytes, 1, kBufferBytes);
  }

  void land_next_read(size_t before, kj::ArrayPtr<kj::byte> dest) override {
    // The buffer must hold `before` and what a read asks for after dest.
    if (dest.size() == 0 || before == 0 || before > kBufferBytes / 2) dest = nullptr;
    landing_ = dest;
    landing_before_ = before;
  }

  void release(kj::ArrayPtr<const kj::byte> region) override {
    auto inside = [&](const kj::byte* p) { return p >= region.begin() && p < region.end(); };
    if (landing_.size() > 0 && inside(landing_.begin())) landing_ = nullptr;
    if (parked_size_ > 0 && inside(parked_)) evacuate();
  }

  uint64_t read_calls() const override { return read_calls_; }

  // Same-host connections: see low_water_cap.
  void set_low_water_cap(size_t bytes) { low_water_cap_ = bytes; }

  kj::Promise<void> whenWriteDisconnected() override {
    if (disconnected_ == nullptr) disconnected_ = observer_.whenWriteDisconnected().fork();
    return KJ_ASSERT_NONNULL(disconnected_).addBranch();
  }

  void shutdownWrite() override { ::shutdown(fd_, SHUT_WR); }

  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // a write waiting for room wakes, and fails in write_more
  }
  void abortRead() override { ::shutdown(fd_, SHUT_RD); }

  void detect_dead_peer(std::chrono::milliseconds after) override {
    ps::detect_dead_peer(fd_, after);
  }

  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    socklen_t len = *length;
    KJ_SYSCALL(::getsockopt(fd_, level, option, value, &len));
    *length = len;
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    KJ_SYSCALL(::setsockopt(fd_, level, option, value, length));
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    socklen_t len = *length;
    KJ_SYSCALL(::getsockname(fd_, addr, &len));
    *length = len;
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    socklen_t len = *length;
    KJ_SYSCALL(::getpeername(fd_, addr, &len));
    *length = len;
  }
  kj::Maybe<int> getFd() const override { return fd_.get(); }

  // For a non-blocking connect(): resolves once the connection is up.
  kj::Promise<void> connected() {
    return when_writable().then([this] {
      write_watch_ = nullptr;
      int error = 0;
      socklen_t len = sizeof(error);
      KJ_SYSCALL(::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len));
      if (error != 0) KJ_FAIL_SYSCALL("connect", error);
    });
  }

 private:
  // One read() into `into`: the bytes read, 0 at the end of the stream, or
  // -1 when the socket is empty (the next readability edge is then watched).
  // With `then` > 0, bytes after the first `ask` go to the start of the
  // buffer (which must be empty), up to `then` of them.
  ssize_t read_once(kj::byte* into, size_t ask, size_t then = 0) {
    const iovec iov[2] = {{into, ask}, {buffer_.begin(), then}};
    return read_once(iov, then == 0 ? 1 : 2);
  }

  ssize_t read_once(const iovec* iov, int count) {
    size_t total = 0;
    for (int i = 0; i < count; ++i) total += iov[i].iov_len;
    ssize_t n;
    do {
      ++read_calls_;
      n = count == 1 ? ::read(fd_, iov[0].iov_base, iov[0].iov_len) : ::readv(fd_, iov, count);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) KJ_FAIL_SYSCALL("read", errno);
      watch_readable();
      return -1;
    }
    if (n > 0 && busy_poll_ != nullptr) busy_poll_->kick();
    if (n > 0 && static_cast<size_t>(n) < total) {
      // Empty now, unless the peer's hang-up came with the data: then the
      // next read() finds the end, and no later edge would say so.
      KJ_IF_MAYBE (at_end, observer_.atEndHint()) {
        if (!*at_end) watch_readable();
      }
    }
    return n;
  }

  // Hands out up to `max` bytes already read, in stream order: the buffer
  // up to the parked bytes, the parked bytes (land_next_read), the rest of
  // the buffer. Each piece goes to to(offset into the `max`); parked bytes
  // that are already there stay put.
  template <typename To>
  size_t take_read(size_t max, To&& to) {
    size_t done = 0;
    while (done < max) {
      const size_t limit = parked_size_ > 0 ? split_ : end_;
      if (pos_ < limit) {
        const size_t n = std::min(max - done, limit - pos_);
        kj::byte* dst = to(done);
        keep_parked(dst, n, 0);
        std::memcpy(dst, buffer_.begin() + pos_, n);
        pos_ += n;
        done += n;
      } else if (parked_size_ > 0) {
        const size_t n = std::min(max - done, parked_size_);
        kj::byte* dst = to(done);
        if (dst != parked_) {
          keep_parked(dst, n, n);
          std::memmove(dst, parked_, n);  // a wrong guess: the two may overlap
        }
        parked_ += n;
        parked_size_ -= n;
        done += n;
        if (parked_size_ == 0) evacuated_ = nullptr;
      } else {
        break;
      }
    }
    return done;
  }

  // After a wrong guess a piece's destination can be where parked bytes
  // still wait (they were read into the memory the guess named): those past
  // the first `skip` move out before [dst, dst + n) is written.
  void keep_parked(const kj::byte* dst, size_t n, size_t skip) {
    const kj::byte* lo = parked_ + skip;
    const kj::byte* hi = parked_ + parked_size_;
    if (lo < hi && dst < hi && dst + n > lo) evacuate();
  }

  void evacuate() {
    auto copy = kj::heapArray<kj::byte>(parked_, parked_size_);
    parked_ = copy.begin();
    evacuated_ = kj::mv(copy);
  }

  // One read into the empty buffer, through the landing if one is set: -1
  // when the socket is empty, else the bytes read (0: end of stream).
  ssize_t fill_buffer() {
    pos_ = end_ = 0;
    if (landing_.size() == 0) {
      const ssize_t n = read_once(buffer_.begin(), read_ahead_);
      if (n > 0) end_ = static_cast<size_t>(n);
      return n;
    }
    const size_t before = landing_before_;
    const iovec iov[3] = {{buffer_.begin(), before},
                          {landing_.begin(), landing_.size()},
                          {buffer_.begin() + before, std::min(read_ahead_, kBufferBytes - before)}};
    const ssize_t n = read_once(iov, 3);
    if (n < 0) return n;  // the landing waits for the next read
    auto dest = landing_;
    landing_ = nullptr;
    const size_t got = static_cast<size_t>(n);
    if (got <= before) {
      end_ = got;
    } else {
      split_ = before;
      parked_ = dest.begin();
      parked_size_ = std::min(got - before, dest.size());
      end_ = got - parked_size_;
    }
    return n;
  }

  // Copies what the buffer holds, then reads until `got` >= min_bytes.
  kj::Promise<size_t> read_more(kj::byte* dst, size_t min_bytes, size_t max_bytes, size_t got) {
    got += take_read(max_bytes - got, [&](size_t at) { return dst + got + at; });
    while (got < min_bytes) {
      if (readable_ != nullptr) {
        // The last read came back short: the socket was empty then, so wait
        // for more rather than spend a read() to learn it again. (At the
        // normal low-water mark: a read_exact given up on may have left it
        // raised, and a small message would never wake us.)
        set_low_water(1);
        auto wait = kj::mv(KJ_ASSERT_NONNULL(readable_));
        readable_ = nullptr;
        return wait.then([this, dst, min_bytes, max_bytes, got] {
          return read_more(dst, min_bytes, max_bytes, got);
        });
      }
      const size_t want = max_bytes - got;
      const bool direct =
          want >= read_ahead_ && landing_.size() == 0;  // large reads skip the buffer
      const ssize_t n = direct ? read_once(dst + got, want) : fill_buffer();
      if (n < 0) continue;
      if (n == 0) return got;  // end of stream
      if (direct) {
        got += n;
      } else {
        got += take_read(want, [&](size_t at) { return dst + got + at; });
      }
    }
    return got;
  }

  kj::Promise<void> read_exact_more(size_t bytes, kj::Function<kj::byte*(size_t)> where,
                                    size_t got) {
    got += take_read(bytes - got, [&](size_t at) { return where(got + at); });
    while (got < bytes) {
      if (readable_ != nullptr) {
        // Much still to come: wake when a good part of it is there, not
        // for every packet (a wake-up costs as much as copying 30 KiB here).
        set_low_water(std::min(bytes - got, low_water_cap_));
        auto wait = kj::mv(KJ_ASSERT_NONNULL(readable_));
        readable_ = nullptr;
        return wait.then([this, bytes, where = kj::mv(where), got]() mutable {
          return read_exact_more(bytes, kj::mv(where), got);
        });
      }
      // The buffer is empty here: what follows the bytes asked for (the
      // next message) goes into it in the same system call, and a read that
      // comes back short says the socket is empty, so the next message
      // read waits instead of spending a read() to learn that.
      const size_t want = bytes - got;
      const ssize_t n = read_once(where(got), want, read_ahead_);
      if (n < 0) continue;
      if (n == 0) return KJ_EXCEPTION(DISCONNECTED, "stream ended inside a message", bytes, got);
      if (static_cast<size_t>(n) > want) {
        pos_ = 0;
        end_ = static_cast<size_t>(n) - want;
      }
      got += std::min(static_cast<size_t>(n), want);
    }
    set_low_water(1);
    return kj::READY_NOW;
  }

  void set_low_water(size_t bytes) {
    const int value = static_cast<int>(bytes < kLowWaterMinBytes ? 1 : bytes);
    if (value == low_water_) return;
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &value, sizeof(value)) == 0) low_water_ = value;
  }

  // Registers for the next readability edge at once, so none that comes
  // after an empty or short read can be missed.
  void watch_readable() {
    if (readable_ == nullptr) readable_ = observer_.whenBecomesReadable();
  }

  kj::Promise<void> write_more(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces,
                               size_t skip) {
    if (aborted_)
      return KJ_EXCEPTION(DISCONNECTED,
                          "connection cut: a call gave up while its request was being sent");
    for (;;) {
      while (pieces.size() > 0 && skip >= pieces[0].size()) {
        skip -= pieces[0].size();
        pieces = pieces.slice(1, pieces.size());
      }
      if (pieces.size() == 0) {
        write_watch_ = nullptr;
        return kj::READY_NOW;
      }
      iovec iov[64];
      const size_t count = std::min<size_t>(pieces.size(), 64);
      for (size_t i = 0; i < count; ++i) {
        iov[i].iov_base = const_cast<kj::byte*>(pieces[i].begin()) + (i == 0 ? skip : 0);
        iov[i].iov_len = pieces[i].size() - (i == 0 ? skip : 0);
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      ssize_t n;
      do {
        n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);  // a closed peer is an error, not SIGPIPE
      } while (n < 0 && errno == EINTR);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) KJ_FAIL_SYSCALL("sendmsg", errno);
        return when_writable().then([this, pieces, skip] { return write_more(pieces, skip); });
      }
      skip += n;
    }
  }

  kj::Promise<void> when_writable() {
    if (write_watch_.get() == nullptr) write_watch_ = kj::heap<WriteWatch>(port_, fd_);
    return write_watch_->observer.whenBecomesWritable();
  }

  // epoll accepts a second registration of the same socket under another
  // descriptor; registering reports at once if it is already writable.
  struct WriteWatch {
    WriteWatch(kj::UnixEventPort& port, int fd)
        : fd(dup_or_throw(fd)),
          observer(port, this->fd, kj::UnixEventPort::FdObserver::OBSERVE_WRITE) {}
    static int dup_or_throw(int fd) {
      int copy;
      KJ_SYSCALL(copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0));
      return copy;
    }
    kj::AutoCloseFd fd;
    kj::UnixEventPort::FdObserver observer;
  };

  kj::UnixEventPort& port_;
  kj::AutoCloseFd fd_;
  kj::UnixEventPort::FdObserver observer_;
  kj::Own<WriteWatch> write_watch_;
  kj::Array<kj::byte> buffer_ = kj::heapArray<kj::byte>(kBufferBytes);
  size_t pos_ = 0, end_ = 0;
  // land_next_read: where the next buffer read puts its middle part, and
  // what such a read left there, not yet taken: parked_size_ bytes at
  // parked_, which come after buffer_[.., split_) and before the rest.
  kj::ArrayPtr<kj::byte> landing_;
  size_t landing_before_ = 0;
  kj::byte* parked_ = nullptr;
  size_t parked_size_ = 0;
  size_t split_ = 0;
  kj::Array<kj::byte> evacuated_;  // parked bytes moved out of memory that was released
  uint64_t read_calls_ = 0;
  size_t read_ahead_ =
      kBufferBytes;  // what a read into the buffer asks the kernel for (limit_read_ahead)
  kj::Maybe<kj::Promise<void>> readable_;
  int low_water_ = 1;
  size_t low_water_cap_ =
      kLowWaterBytes;  // the most set_low_water is asked for (set_low_water_cap)
  kj::Maybe<kj::ForkedPromise<void>> disconnected_;
  kj::ArrayPtr<const kj::byte> single_piece_;
  SendHolds holds_;
  BusyPoll* busy_poll_;
  bool aborted_ = false;  // abort(): no byte more is written
};

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

bool same_ip(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                       &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

// Idle half the time, then three probes over the other half; data unacknowledged
// for the whole time ends the connection too. Best effort: options this
// kernel lacks are left as they are.
void detect_dead_peer(int fd, std::chrono::milliseconds after) {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  if (after.count() <= 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0)
    return;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return;
  const auto secs = std::max<int64_t>(2, std::chrono::ceil<std::chrono::seconds>(after).count());
  const int one = 1, count = 3;
  const int idle = static_cast<int>(std::min<int64_t>(secs / 2, 32767));
  const int interval = static_cast<int>(std::clamp<int64_t>((secs - idle) / count, 1, 32767));
  const auto user_ms = static_cast<unsigned>(std::min<int64_t>(after.count(), UINT_MAX));
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

// See same_host_connection in the header: why one host's connections get a
// fixed send buffer, and `stream`'s low-water mark a cap to fit it.
void fit_send_buffer_to_host(int fd, SocketStreamImpl& stream) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return;
  const int bytes = same_host_send_buffer_bytes();
  if (bytes <= 0 || !same_host_connection(local, peer)) return;
  set_send_buffer(fd, bytes);
  int granted = 0;
  socklen_t len = sizeof(granted);
  if (::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &granted, &len) == 0)
    stream.set_low_water_cap(low_water_cap(granted));
}

void make_nonblocking(int fd) {
  int flags;
  KJ_SYSCALL(flags = fcntl(fd, F_GETFL));
  KJ_SYSCALL(fcntl(fd, F_SETFL, flags | O_NONBLOCK));
  KJ_SYSCALL(fcntl(fd, F_SETFD, FD_CLOEXEC));
}

kj::Promise<kj::Own<SocketStream>> connect_to(kj::UnixEventPort& port, const SocketAddress& addr) {
  const int family = addr.storage.ss_family;
  int fd;
  KJ_SYSCALL(fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  auto stream = kj::heap<SocketStreamImpl>(port, fd);
  if (family != AF_UNIX) {
    int one = 1;
    KJ_SYSCALL(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
  }
  int r;
  do {
    r = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.length);
  } while (r < 0 && errno == EINTR);
  if (r == 0) {
    fit_send_buffer_to_host(fd, *stream);
    return kj::Own<SocketStream>(kj::mv(stream));
  }
  if (errno != EINPROGRESS) KJ_FAIL_SYSCALL("connect", errno);
  auto* raw = stream.get();
  return raw->connected().then([stream = kj::mv(stream), fd]() mutable {
    fit_send_buffer_to_host(fd, *stream);
    return kj::Own<SocketStream>(kj::mv(stream));
  });
}

// Tries the addresses in order; fails with the last one's error.
kj::Promise<kj::Own<SocketStream>> connect_any(kj::UnixEventPort& port,
                                               kj::Array<SocketAddress> addrs, size_t i) {
  auto attempt = kj::evalNow([&] { return connect_to(port, addrs[i]); });
  if (i + 1 >= addrs.size()) return attempt;
  return attempt.catch_([&port, addrs = kj::mv(addrs), i](kj::Exception&&) mutable {
    return connect_any(port, kj::mv(addrs), i + 1);
  });
}

kj::Array<SocketAddress> resolve(const std::string& host, const std::string& service) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* list = nullptr;
  const int r = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (r != 0) KJ_FAIL_REQUIRE("cannot resolve host name", host, gai_strerror(r));
  kj::Vector<SocketAddress> out;
  for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
    SocketAddress s;
    std::memcpy(&s.storage, a->ai_addr, a->ai_addrlen);
    s.length = a->ai_addrlen;
    out.add(s);
  }
  ::freeaddrinfo(list);
  return out.releaseAsArray();
}

// The addresses travel as an Own: GCC 12 warns (wrongly) about an
// uninitialised kj::Array inside kj::ExceptionOr.
using Addresses = kj::Own<kj::Array<SocketAddress>>;

kj::Promise<Addresses> resolve_off_loop(std::string host, std::string service) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<Addresses>();
  // The fulfiller may outlive the promise (a Client given up on): that is
  // what a cross-thread fulfiller allows. Held by shared_ptr because
  // std::thread needs a callable with a noexcept destructor.
  auto fulfiller =
      std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<Addresses>>>(kj::mv(paf.fulfiller));
  std::thread([host = std::move(host), service = std::move(service), fulfiller] {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                        [&] { (*fulfiller)->fulfill(kj::heap(resolve(host, service))); })) {
      (*fulfiller)->reject(kj::mv(*e));
    }
  }).detach();
  return kj::mv(paf.promise);
}

}  // namespace

bool same_host_connection(const sockaddr_storage& local, const sockaddr_storage& peer) {
  return is_loopback(peer) || same_ip(local, peer);
}

void set_send_buffer(int fd, int bytes) {
  const int value = bytes / 2;  // the kernel doubles it (room for its bookkeeping)
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, sizeof(value));
}

int same_host_send_buffer_bytes() {
  static const int bytes = [] {
    if (const char* kb = std::getenv("PS_SAME_HOST_SEND_BUFFER_KB")) {
      int value = -1;
      const char* end = kb + std::strlen(kb);
      const auto [at, error] = std::from_chars(kb, end, value);
      if (error == std::errc() && at == end && value >= 0 && value <= (64 << 10))
        return value << 10;
    }
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return static_cast<int>(l2 > 0 ? std::clamp<long>(l2 / 2, 256 << 10, 1 << 20) : 512 << 10);
  }();
  return bytes;
}

kj::Own<SocketStream> wrap_socket(kj::UnixEventPort& port, int fd, BusyPoll* busy_poll) {
  make_nonblocking(fd);
  // Small replies must not wait for Nagle (refused, harmlessly, on Unix sockets).
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto stream = kj::heap<SocketStreamImpl>(port, fd, busy_poll);
  fit_send_buffer_to_host(fd, *stream);
  return stream;
}

kj::Promise<kj::Own<SocketStream>> connect_socket(kj::UnixEventPort& port,
                                                  const std::string& address) {
  if (address.rfind("unix:", 0) == 0) {
    const std::string path = address.substr(5);
    SocketAddress a;
    auto* un = reinterpret_cast<sockaddr_un*>(&a.storage);
    KJ_REQUIRE(path.size() < sizeof(un->sun_path), "Unix socket path too long", path);
    un->sun_family = AF_UNIX;
    std::memcpy(un->sun_path, path.c_str(), path.size() + 1);
    a.length = offsetof(sockaddr_un, sun_path) + path.size() + 1;
    return connect_to(port, a);
  }
  const std::optional<HostPort> parts = split_host_port(address);
  KJ_REQUIRE(parts.has_value() && !parts->port.empty(), "address needs a port (host:port)",
             address);
  const std::string& host = parts->host;
  const std::string& service = parts->port;
  SocketAddress a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  char* end = nullptr;
  const unsigned long port_number = std::strtoul(service.c_str(), &end, 10);
  const bool numeric_port = end != nullptr && *end == '\0' && port_number <= 65535;
  if (numeric_port && ::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port_number));
    a.length = sizeof(sockaddr_in);
    return connect_to(port, a);
  }
  if (numeric_port && ::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port_number));
    a.length = sizeof(sockaddr_in6);
    return connect_to(port, a);
  }
  return resolve_off_loop(host, service).then([&port](Addresses addrs) {
    KJ_REQUIRE(addrs->size() > 0, "host name resolved to no address");
    return connect_any(port, kj::mv(*addrs), 0);
  });
}

}  // namespace ps
