#include "common/net/buffered_message_stream.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <capnp/rpc.capnp.h>
#include <kj/debug.h>

#include "common/net/message_framing.h"

namespace ps {

struct BufferedMessageStream::Buffer : kj::Refcounted {
  Buffer(size_t size, MemoryBudget::Reservation r)
      : reservation(kj::mv(r)), words(kj::heapArray<capnp::word>(size / sizeof(capnp::word))) {}
  MemoryBudget::Reservation reservation;  // given back after `words` is freed
  kj::Array<capnp::word> words;
  kj::byte* bytes() { return reinterpret_cast<kj::byte*>(words.begin()); }
  size_t size() const { return words.size() * sizeof(capnp::word); }
};

// A message in place in a buffer (held), or in memory of its own.
class BufferedMessageStream::Reader final : public capnp::MessageReader {
 public:
  Reader(capnp::ReaderOptions options, kj::Array<kj::ArrayPtr<const capnp::word>> segments,
         kj::Own<Buffer> held, kj::Array<capnp::word> own,
         MemoryBudget::Reservation reservation = {})
      : capnp::MessageReader(options),
        reservation_(kj::mv(reservation)),
        segments_(kj::mv(segments)),
        held_(kj::mv(held)),
        own_(kj::mv(own)) {}

  kj::ArrayPtr<const capnp::word> getSegment(uint id) override {
    return id < segments_.size() ? segments_[id] : nullptr;
  }

 private:
  MemoryBudget::Reservation reservation_;  // for own_; given back after it is freed
  kj::Array<kj::ArrayPtr<const capnp::word>> segments_;
  kj::Own<Buffer> held_;
  kj::Array<capnp::word> own_;
};

namespace {

// The segments of a message whose first segment starts at `at`.
kj::Array<kj::ArrayPtr<const capnp::word>> segments_at(const capnp::word* at, const uint32_t* sizes,
                                                       uint32_t count) {
  auto segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(count);
  for (uint32_t k = 0; k < count; ++k) {
    segments[k] = kj::arrayPtr(at, sizes[k]);
    at += sizes[k];
  }
  return segments;
}

}  // namespace

BufferedMessageStream::BufferedMessageStream(SocketStream& stream, MemoryBudget* budget)
    : stream_(stream), budget_(budget) {}

BufferedMessageStream::~BufferedMessageStream() = default;

size_t BufferedMessageStream::room_needed() const {
  return static_cast<size_t>(std::min<uint64_t>(kMaxBufferedBytes, max_message_bytes_));
}

size_t BufferedMessageStream::buffer_bytes() const {
  // While only small messages are accepted (before hello), one such message
  // is all a buffer must hold; the unread bytes move to its front instead.
  const size_t room = room_needed();
  if (room >= kMaxBufferedBytes) return kBufferBytes;
  return std::max<size_t>((room + sizeof(capnp::word) - 1) & ~(sizeof(capnp::word) - 1),
                          sizeof(capnp::word));
}

kj::Own<BufferedMessageStream::Buffer> BufferedMessageStream::take_buffer(size_t size) {
  // The first two buffers of a connection (of the current size) are its
  // fixed cost, bounded by the number of connections, not counted; each one taken beyond them is,
  // while messages in it are in use.
  MemoryBudget::Reservation r;
  const bool fixed = fixed_taken_ < 2;
  if (budget_ != nullptr && !fixed) {
    r = budget_->try_reserve(MemoryUse::kReceiving, size);
    if (!r) {
      kj::throwFatalException(
          kj::Exception(kj::Exception::Type::OVERLOADED, __FILE__, __LINE__,
                        kj::str("psd is out of memory for requests held in progress: ",
                                budget_->describe().c_str())));
    }
  }
  ++buffers_taken_;
  if (fixed) ++fixed_taken_;
  return kj::refcounted<Buffer>(size, kj::mv(r));
}

void BufferedMessageStream::make_room() {
  const size_t size = buffer_bytes();
  if (buffer_.get() == nullptr || buffer_->size() != size) {
    // The first read, or the size changed (hello raised the message limit):
    // a buffer of the size now needed, the unread bytes moved there. Spares
    // of the old size are of no more use.
    KJ_REQUIRE(end_ - pos_ <= size, "unread bytes exceed the read buffer", end_ - pos_, size);
    fixed_taken_ = 0;  // those of the old size go with the messages in them
    auto next = take_buffer(size);
    if (buffer_.get() != nullptr) std::memcpy(next->bytes(), buffer_->bytes() + pos_, end_ - pos_);
    spares_.clear();
    buffer_ = kj::mv(next);
    end_ -= pos_;
    pos_ = 0;
  }
  if (pos_ == end_) {
    // Nothing unread: start again at the front of a buffer no message uses
    // (this one, or a spare), where the pages are warm. Going on into the
    // untouched rest of a buffer costs a page fault per 4 KiB page the first
    // time, which small messages would pay on every call until the buffer
    // had been touched through.
    if (buffer_->isShared()) {
      for (auto& spare : spares_) {
        if (!spare->isShared()) {
          std::swap(buffer_, spare);
          break;
        }
      }
    }
    if (buffer_->isShared() && fixed_taken_ < 2) {
      // The second buffer, taken when first needed: a message is still in
      // use in the first.
      auto next = take_buffer(size);
      spares_.add(kj::mv(buffer_));
      buffer_ = kj::mv(next);
    }
    if (!buffer_->isShared()) {
      pos_ = end_ = 0;
      return;
    }
  }
  if (size - pos_ >= room_needed()) return;
  const size_t unread = end_ - pos_;  // < room_needed(), as pos_ > size - room_needed()
  if (!buffer_->isShared()) {
    std::memmove(buffer_->bytes(), buffer_->bytes() + pos_, unread);
    pos_ = 0;
    end_ = unread;
    return;
  }
  // Messages in use point into this one: leave it to them, and go on in a
  // spare they no longer use, or a new buffer (the RPC layer keeps each
  // message until it has the next, so small messages alternate between two).
  kj::Own<Buffer> next;
  for (auto& spare : spares_) {
    if (!spare->isShared()) {
      next = kj::mv(spare);
      spare = kj::mv(spares_.back());
      spares_.removeLast();
      break;
    }
  }
  if (next.get() == nullptr) next = take_buffer(size);
  std::memcpy(next->bytes(), buffer_->bytes() + pos_, unread);
  if (spares_.size() < kMaxSpares) spares_.add(kj::mv(buffer_));
  buffer_ = kj::mv(next);
  pos_ = 0;
  end_ = unread;
}

kj::Promise<bool> BufferedMessageStream::fill(size_t bytes) {
  if (end_ - pos_ >= bytes) return true;
  KJ_REQUIRE(pos_ + bytes <= buffer_->size(), "message header larger than the read buffer", bytes);
  // Not more than a 64 KiB tensor's message ahead: what is read past a
  // large message's header is copied into that message's own memory.
  const size_t need = pos_ + bytes - end_;
  const size_t ask = std::max(need, std::min(buffer_->size() - end_, kReadAheadBytes));
  return stream_.tryRead(buffer_->bytes() + end_, need, ask).then([this, bytes](size_t n) -> bool {
    end_ += n;
    if (end_ - pos_ >= bytes) return true;
    // tryRead stops short only at the end of the stream.
    if (end_ == pos_) return false;
    kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "premature EOF inside a message"));
  });
}

void BufferedMessageStream::limit_unfinished_calls(uint32_t max_unfinished, uint64_t bytes_each) {
  max_unfinished_ = max_unfinished;
  bytes_per_call_ = bytes_each;
  if (budget_ != nullptr) calls_ = budget_->reserve_anyway(MemoryUse::kReceiving, 0);
}

kj::Maybe<capnp::MessageReaderAndFds> BufferedMessageStream::deliver(
    kj::Own<capnp::MessageReader> message) {
  if (max_unfinished_ > 0) {
    // A malformed message is the RPC layer's to report.
    capnp::rpc::Message::Which which = capnp::rpc::Message::UNIMPLEMENTED;
    (void)kj::runCatchingExceptions(
        [&] { which = message->getRoot<capnp::rpc::Message>().which(); });
    if (which == capnp::rpc::Message::CALL) {
      ++unfinished_;
      KJ_REQUIRE(unfinished_ <= max_unfinished_,
                 "too many calls in flight on this connection: the peer sends no Finish for the "
                 "answers it has",
                 max_unfinished_);
      if (budget_ != nullptr && !calls_.try_resize(charged_calls() * bytes_per_call_)) {
        kj::throwFatalException(kj::Exception(
            kj::Exception::Type::OVERLOADED, __FILE__, __LINE__,
            kj::str("psd is out of memory for the ", unfinished_,
                    " calls in flight on this connection: ", budget_->describe().c_str())));
      }
    } else if (which == capnp::rpc::Message::FINISH && unfinished_ > 0) {
      --unfinished_;
      calls_.try_resize(charged_calls() * bytes_per_call_);
    }
  }
  return capnp::MessageReaderAndFds{kj::mv(message), nullptr};
}

void BufferedMessageStream::limit_message_time(kj::Duration base, uint64_t bytes_per_sec,
                                               kj::Timer& timer) {
  message_timer_ = &timer;
  message_base_ = base;
  message_bytes_per_sec_ = std::max<uint64_t>(bytes_per_sec, 1);
}

void BufferedMessageStream::yield_every(unsigned messages, kj::Timer& timer) {
  yield_every_ = messages;
  yield_timer_ = &timer;
}

void BufferedMessageStream::hold_reads_while(std::function<bool()> full, kj::Timer& timer,
                                             kj::Duration poll) {
  full_ = std::move(full);
  timer_ = &timer;
  poll_ = poll;
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> BufferedMessageStream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd> fds, capnp::ReaderOptions options,
    kj::ArrayPtr<capnp::word> scratch) {
  if (full_ && full_()) {
    ++reads_held_;
    read_in_a_row_ = 0;
    return timer_->afterDelay(poll_).then(
        [this, fds, options, scratch] { return tryReadMessage(fds, options, scratch); });
  }
  if (yield_every_ > 0 && ++read_in_a_row_ > yield_every_) {
    // A zero delay still waits for the loop to look at its sockets and
    // timers, which it does once nothing else is queued.
    read_in_a_row_ = 0;
    return yield_timer_->afterDelay(0 * kj::NANOSECONDS).then([this, fds, options, scratch] {
      read_in_a_row_ = 1;
      return tryReadMessage(fds, options, scratch);
    });
  }
  make_room();
  return fill(sizeof(capnp::word))
      .then([this, options](bool any) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        if (!any) return kj::Maybe<capnp::MessageReaderAndFds>(nullptr);
        return read_after_header(options);
      });
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> BufferedMessageStream::read_after_header(
    capnp::ReaderOptions options) {
  uint32_t first[2];
  std::memcpy(first, buffer_->bytes() + pos_, sizeof(first));
  const uint64_t count = uint64_t{first[0]} + 1;
  KJ_REQUIRE(count <= kMaxSegments, "message has too many segments", count);
  const size_t table_bytes = segment_table_bytes(static_cast<uint32_t>(count));
  return fill(table_bytes)
      .then([this, options,
             table_bytes](bool) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        const auto* table = reinterpret_cast<const uint32_t*>(buffer_->bytes() + pos_);
        const uint32_t count = table[0] + 1;
        uint64_t total_words = 0;
        for (uint32_t k = 0; k < count; ++k) total_words += table[1 + k];
        KJ_REQUIRE(total_words <= options.traversalLimitInWords,
                   "message is too large; see capnp::ReaderOptions (psd --max_message_mb)",
                   total_words);
        const uint64_t message_bytes = table_bytes + total_words * sizeof(capnp::word);
        KJ_REQUIRE(message_bytes <= max_message_bytes_,
                   "message is too large for this connection (a peer that has not said hello may "
                   "send small ones only)",
                   message_bytes, max_message_bytes_);
        if (message_bytes > kMaxBufferedBytes)
          return read_large(options, count, table_bytes, total_words);
        return fill(message_bytes).then([this, options, count, table_bytes, message_bytes](bool) {
          const kj::byte* start = buffer_->bytes() + pos_;
          auto segments = segments_at(reinterpret_cast<const capnp::word*>(start + table_bytes),
                                      reinterpret_cast<const uint32_t*>(start) + 1, count);
          pos_ += message_bytes;
          return deliver(
              kj::heap<Reader>(options, kj::mv(segments), kj::addRef(*buffer_), nullptr));
        });
      });
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> BufferedMessageStream::read_large(
    capnp::ReaderOptions options, uint32_t count, size_t table_bytes, size_t total_words) {
  MemoryBudget::Reservation reservation;
  if (budget_ != nullptr) {
    reservation = budget_->try_reserve(MemoryUse::kReceiving, total_words * sizeof(capnp::word));
    if (!reservation) {
      kj::throwFatalException(kj::Exception(kj::Exception::Type::OVERLOADED, __FILE__, __LINE__,
                                            kj::str("psd is out of memory for this request of ",
                                                    (total_words * sizeof(capnp::word)) >> 20,
                                                    " MiB: ", budget_->describe().c_str())));
    }
  }
  auto own = kj::heapArray<capnp::word>(total_words);
  auto segments = segments_at(
      own.begin(), reinterpret_cast<const uint32_t*>(buffer_->bytes() + pos_) + 1, count);
  const size_t body = total_words * sizeof(capnp::word);
  const size_t take = std::min(end_ - pos_ - table_bytes, body);
  auto* dst = reinterpret_cast<kj::byte*>(own.begin());
  std::memcpy(dst, buffer_->bytes() + pos_ + table_bytes, take);
  pos_ += table_bytes + take;
  if (pos_ == end_) {
    // All of the buffer was this message's: the next one starts on a whole
    // word, as capnp's readers need.
    pos_ = end_ = (pos_ + sizeof(capnp::word) - 1) & ~(sizeof(capnp::word) - 1);
  }
  auto reader = kj::heap<Reader>(options, kj::mv(segments), kj::Own<Buffer>(), kj::mv(own),
                                 kj::mv(reservation));
  auto done = [this, reader = kj::mv(reader)]() mutable { return deliver(kj::mv(reader)); };
  if (take == body) return done();
  // Straight into the message's memory. (Not read_exact's raised
  // SO_RCVLOWAT: data left waiting in the socket holds back the window and
  // slows pipelined parts; docs/performance.md, "Figures behind design
  // choices in the code".)
  auto rest = stream_.read(dst + take, body - take).then(kj::mv(done));
  if (message_timer_ == nullptr) return rest;
  const kj::Duration allowed =
      message_base_ + (body * 1000 / message_bytes_per_sec_) * kj::MILLISECONDS;
  return rest.exclusiveJoin(message_timer_->afterDelay(allowed).then(
      [allowed, body]() -> kj::Maybe<capnp::MessageReaderAndFds> {
        kj::throwFatalException(
            kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                          kj::str("a request of ", body >> 10, " KiB did not arrive within ",
                                  allowed / kj::MILLISECONDS, " ms; the connection is closed")));
      }));
}

kj::Promise<void> BufferedMessageStream::writeMessage(
    kj::ArrayPtr<const int>, kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> one[] = {segments};
  return writeMessages(kj::arrayPtr(one, 1));
}

kj::Promise<void> BufferedMessageStream::writeMessages(
    kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) {
  // All of them in one gather write, each segment a piece of its own.
  size_t count = 0;
  for (auto& m : messages) count += 1 + m.size();
  auto tables = kj::heapArrayBuilder<kj::Array<uint32_t>>(messages.size());
  auto pieces = kj::heapArrayBuilder<kj::ArrayPtr<const kj::byte>>(count);
  for (auto& m : messages) {
    KJ_REQUIRE(m.size() > 0, "a message has at least one segment");
    tables.add(segment_table(m));
    pieces.add(tables.back().asBytes());
    for (auto& s : m) pieces.add(s.asBytes());
  }
  auto all = pieces.finish();
  auto* raw = all.begin();
  return stream_.write(kj::arrayPtr(raw, all.size())).attach(kj::mv(all), tables.finish());
}

kj::Maybe<int> BufferedMessageStream::getSendBufferSize() { return send_buffer_size(stream_); }

kj::Promise<void> BufferedMessageStream::end() {
  stream_.shutdownWrite();
  return kj::READY_NOW;
}

}  // namespace ps
