// What Cap'n Proto >= 1.0 ships as capnp::BufferedMessageStream; to be
// dropped when the distribution has 1.0.
//
// psd's Cap'n Proto message stream (what TwoPartyVatNetwork reads and writes
// through): messages up to 128 KiB are read into a large buffer and handed
// to the RPC layer in place, as capnp 1.0's BufferedMessageStream does.
//
// capnp 0.9 reads a message in two steps, its size and then its segments
// into memory of their own: for a push of a 64 KiB tensor, two read() calls
// and a copy of the tensor out of the socket buffer (docs/performance.md,
// "Figures behind design choices in the code"). Here one read() usually
// brings the whole message, and the reader's segments point into the buffer, which
// stays alive (reference counted) while any message in it is. A buffer
// whose room runs out while messages in it are still in use is left to them
// and another taken: a spare from before once its messages are gone, so
// in steady use no memory is allocated. With nothing unread, reading starts
// again at the front of a buffer no message uses, where the pages are warm
// (the RPC layer keeps each message until it has the next, so small
// messages alternate between the fronts of two buffers).
// Buffers are taken when first needed, not with the connection, and while
// only small messages are accepted (set_max_message_bytes, before hello)
// they are of that size: a peer that connects and never says hello costs
// psd one such buffer, not two large ones.
// Larger messages get memory of their own, filled by reads straight into it
// (SocketStream reads of 64 KiB and more bypass its own buffer), so a 1 MiB
// part is still copied once, by the kernel.
//
// Writes frame the segments as capnp does and hand them to the socket in
// one gather write, each segment a piece of its own (so SocketStream's
// hold_until_sent sees the tensors psd sends from their own memory).
//
// Single-threaded: lives on psd's event loop with its connection.
//
//   auto socket = wrap_socket(port, fd);
//   BufferedMessageStream messages(*socket);
//   capnp::TwoPartyVatNetwork network(messages, Side::SERVER, reader_options);
#pragma once

#include <cstddef>
#include <functional>

#include <capnp/serialize-async.h>
#include <kj/refcount.h>
#include <kj/timer.h>
#include <kj/vector.h>

#include "common/memory_budget.h"
#include "common/net/socket_stream.h"

namespace ps {

class BufferedMessageStream final : public capnp::MessageStream {
 public:
  // Messages up to this size (framing included) are read into the buffer.
  static constexpr size_t kMaxBufferedBytes = 128u << 10;
  static constexpr size_t kBufferBytes = 2 * kMaxBufferedBytes;
  // Bytes asked of the socket at once: a message carrying a 64 KiB tensor.
  static constexpr size_t kReadAheadBytes = 80u << 10;

  // With a `budget`, every large message's memory, and each buffer taken
  // beyond a connection's first two (while messages held in them are in use), are
  // counted against it; one that does not fit ends the connection with an
  // error saying so (the budget must outlive the messages read).
  explicit BufferedMessageStream(SocketStream& stream, MemoryBudget* budget = nullptr);
  ~BufferedMessageStream();

  // What the RPC face above may ask of the socket (connection_control.h).
  ConnectionControl& connection() { return stream_; }

  // Buffers allocated so far (for tests: none before the first read; more
  // than two when a full one still in use was replaced and no spare was free).
  uint64_t buffers_taken() const { return buffers_taken_; }
  // Size of the buffers taken now: kBufferBytes, or the largest message
  // accepted when that is smaller.
  size_t buffer_bytes() const;

  // Backpressure: while full() says so, the next message is not read, and
  // full() is asked again every `poll`. psd's connections say full while
  // their replies not yet written pass a limit: a peer that sends requests
  // and never reads the answers would otherwise have psd queue them all.
  void hold_reads_while(std::function<bool()> full, kj::Timer& timer,
                        kj::Duration poll = 1 * kj::MILLISECONDS);
  uint64_t reads_held() const { return reads_held_; }  // times a read waited (for tests)

  // Largest message accepted from now on (framing included); a larger one
  // ends the connection with an error naming the limit. psd lets a peer
  // that has not said hello send only small messages.
  void set_max_message_bytes(uint64_t bytes) { max_message_bytes_ = bytes; }

  // Calls in flight: capnp keeps every call's answer until the peer sends
  // its Finish, so a peer that never does makes the server hold them all.
  // With this set, calls read minus Finishes read count against the budget
  // at `bytes_each` (all but the first kFreeCalls, so that a client's few
  // calls are never refused while others fill the budget), and past
  // `max_unfinished` (or the budget) the connection ends with an error saying so.
  void limit_unfinished_calls(uint32_t max_unfinished, uint64_t bytes_each);
  uint64_t unfinished_calls() const { return unfinished_; }
  static constexpr uint64_t kFreeCalls = 64;

  // A large message (one read into memory of its own) must arrive within
  // `base` plus one second per `bytes_per_sec`, else the connection ends:
  // a peer that sends most of a large request and stops would hold its
  // memory for as long as the connection lasts.
  void limit_message_time(kj::Duration base, uint64_t bytes_per_sec, kj::Timer& timer);

  // Fairness: after `messages` messages read in a row, the next read waits
  // for the event loop's next look at the sockets and timers, so that one
  // peer whose requests are always ready cannot keep the loop from serving
  // the others (or firing its timers).
  void yield_every(unsigned messages, kj::Timer& timer);

  // capnp::MessageStream
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(
      kj::ArrayPtr<kj::AutoCloseFd> fdSpace, capnp::ReaderOptions options,
      kj::ArrayPtr<capnp::word> scratchSpace) override;
  kj::Promise<void> writeMessage(
      kj::ArrayPtr<const int> fds,
      kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) override;
  kj::Promise<void> writeMessages(
      kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) override;
  kj::Maybe<int> getSendBufferSize() override;
  kj::Promise<void> end() override;

 private:
  struct Buffer;
  class Reader;

  // Resolves once the buffer holds `bytes` unread bytes (false: the stream
  // ended with none unread).
  kj::Promise<bool> fill(size_t bytes);
  // A buffer where a message of up to room_needed() bytes starting at the
  // unread bytes fits, the unread bytes moved there if need be.
  void make_room();
  size_t room_needed() const;
  // A new buffer of `size` bytes, counted against the budget beyond the first two.
  kj::Own<Buffer> take_buffer(size_t size);
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> read_after_header(
      capnp::ReaderOptions options);
  uint64_t charged_calls() const { return unfinished_ > kFreeCalls ? unfinished_ - kFreeCalls : 0; }
  // Counts a Call or Finish (limit_unfinished_calls) and hands the message on.
  kj::Maybe<capnp::MessageReaderAndFds> deliver(kj::Own<capnp::MessageReader> message);
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> read_large(capnp::ReaderOptions options,
                                                                uint32_t count, size_t table_bytes,
                                                                size_t total_words);

  static constexpr size_t kMaxSpares = 2;

  SocketStream& stream_;
  kj::Own<Buffer> buffer_;              // null until the first read
  kj::Vector<kj::Own<Buffer>> spares_;  // full buffers kept for reuse once no message uses them
  size_t pos_ = 0, end_ = 0;            // unread bytes: [pos_, end_) of buffer_
  uint64_t buffers_taken_ = 0;
  unsigned fixed_taken_ = 0;  // buffers of the current size taken without counting them
  std::function<bool()> full_;
  kj::Timer* timer_ = nullptr;
  kj::Duration poll_ = 1 * kj::MILLISECONDS;
  uint64_t reads_held_ = 0;
  MemoryBudget* budget_ = nullptr;
  uint64_t max_message_bytes_ = UINT64_MAX;
  uint32_t max_unfinished_ = 0;  // 0: not counted
  uint64_t bytes_per_call_ = 0;
  uint64_t unfinished_ = 0;
  MemoryBudget::Reservation calls_;
  kj::Timer* message_timer_ = nullptr;
  kj::Duration message_base_ = 0 * kj::SECONDS;
  uint64_t message_bytes_per_sec_ = 1;
  unsigned yield_every_ = 0;
  unsigned read_in_a_row_ = 0;
  kj::Timer* yield_timer_ = nullptr;
};

}  // namespace ps
