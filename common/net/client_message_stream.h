// libpsclient's Cap'n Proto message stream to one shard (what
// TwoPartyVatNetwork reads and writes through). Two things set it apart
// from capnp's own:
//
// Pull replies land in the caller's buffers. Cap'n Proto reads a message
// into memory of its own, and a pull then copied each tensor from there into
// the buffer the caller gave, a sizeable part of a large pull
// (docs/performance.md). psd sends each large tensor as a message segment
// of its own, after a first segment that holds the rest of the reply, the request's tag
// included (schema/ps.capnp, Shard.pull). This stream reads that first
// segment, finds the pull it answers by the tag, and reads each tensor's
// segment directly into the buffer registered for it; the reply then points
// at the caller's buffer, and the pull sees there is nothing to copy.
// Messages it does not recognise, and tensors it cannot place (unaligned
// buffers, odd layouts), are read as Cap'n Proto would.
//
// Where the only pull pending that can land is like one answered before
// (its buffers of the same sizes), the reply most likely has the same
// first segment: the stream has the socket's next read put that many bytes
// in its buffer and the rest straight into the first tensor's buffer
// (SocketStream::land_next_read), so a 64 KiB pull is one read() rather
// than two (the first segment, then the tensor). A wrong guess costs a
// copy, never a wrong byte: until its reply is in, a pull's buffers are
// scratch memory, and a pull that fails may leave anything in them.
//
// Finish messages wait for the next message. Cap'n Proto sends a Finish
// when a call's reply has been used; this stream holds it back and sends it
// in one system call with the next message: one system call instead of two
// here, one wake-up instead of two in psd. (A Finish only lets psd forget
// the answer; Cap'n Proto 1.0 leaves most of them out, 0.9 cannot.) An idle
// client's last Finish waits for its next call or for the connection's end.
//
// A pull that gives up (timeout, cancellation) withdraws its registration;
// bytes still arriving for it then go to memory of the stream's own, never
// to a buffer the caller may have freed (SocketStream::read_exact asks for
// the destination before every system call).
//
// Single-threaded: lives on the client's event loop with its connection.
//
//   ClientMessageStream messages(*socket);
//   capnp::TwoPartyVatNetwork network(messages, Side::CLIENT, options);
//   ...
//   auto expect = messages.expect({as_bytes(out)});   // before sending
//   request.setTag(expect->tag());
//   request.send().attach(kj::mv(expect));            // withdrawn when done
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <capnp/serialize-async.h>
#include <kj/refcount.h>
#include <kj/vector.h>

#include "common/net/socket_stream.h"

namespace ps {

class ClientMessageStream final : public capnp::MessageStream {
 public:
  // Segments smaller than this are read with the rest of their message.
  static constexpr size_t kMinLandingBytes = 16u << 10;
  // While a pull that can land is pending, the socket is read this far
  // ahead only (SocketStream::limit_read_ahead): enough for a reply's
  // segment table and first segment, so that its tensors stay in the socket
  // and are read straight into their buffers rather than copied there.
  static constexpr size_t kLandingReadAhead = 4u << 10;

  explicit ClientMessageStream(SocketStream& stream);
  ~ClientMessageStream() noexcept(false);

  struct Destinations;

  // Where the values of one pull request go, in the order of its names
  // (empty: that tensor is not landed). Withdrawn when destroyed.
  class Expectation {
   public:
    explicit Expectation(kj::Own<Destinations> dest);
    ~Expectation();
    KJ_DISALLOW_COPY(Expectation);
    uint64_t tag() const;

   private:
    kj::Own<Destinations> dest_;
  };

  kj::Own<Expectation> expect(std::vector<kj::ArrayPtr<kj::byte>> buffers);

  // Messages read so far with at least one segment landed (for tests and
  // benchmarks: says the direct path was taken).
  uint64_t landed_messages() const { return landed_messages_; }

  // What the call layer above may ask of the socket (connection_control.h).
  ConnectionControl& connection() { return stream_; }

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
  struct Incoming;
  class Placeholder;
  class Received;

  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> read_body(kj::Own<Incoming> in);
  void plan_landings(Incoming& in);
  kj::Promise<void> read_segments(Incoming& in, size_t k);
  capnp::MessageReaderAndFds finish(kj::Own<Incoming> in);

  // Writes the held Finish messages, then the message (none: just those).
  kj::Promise<void> write_framed(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments);

  SocketStream& stream_;
  kj::Vector<kj::Array<capnp::word>>
      finishes_;  // Finish messages waiting for the next write, framed
  std::unordered_map<uint64_t, Destinations*> expected_;
  // Bytes before the first tensor in the last landed reply to a pull of
  // each shape (Destinations::shape): where the next such reply's tensor
  // is guessed to start (SocketStream::land_next_read).
  static constexpr size_t kMaxKnownShapes = 1024;
  std::unordered_map<uint64_t, size_t> prefix_bytes_;
  size_t landable_ = 0;  // of expected_, those with a buffer psd sends as a segment of its own
  uint64_t next_tag_;
  uint64_t landed_messages_ = 0;
  kj::Own<Placeholder> placeholder_;
};

}  // namespace ps
