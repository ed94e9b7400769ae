// Receives pull replies straight into the caller's buffers.
//
// Cap'n Proto reads a message into memory of its own, and a pull then copied
// each tensor from there into the buffer the caller gave: on these machines
// that copy was a fifth of a 4 MiB pull. psd sends each large tensor as a
// message segment of its own, after a first segment that holds the rest of
// the reply, the request's tag included (schema/ps.capnp, Shard.pull). This
// stream reads that first segment, finds the pull it answers by the tag, and
// reads each tensor's segment directly into the buffer registered for it;
// the reply then points at the caller's buffer, and the pull sees there is
// nothing to copy. Messages it does not recognise, and tensors it cannot
// place (unaligned buffers, odd layouts), are read as Cap'n Proto would.
//
// A pull that gives up (timeout, cancellation) withdraws its registration;
// bytes still arriving for it then go to memory of the stream's own, never
// to a buffer the caller may have freed (SocketStream::read_exact asks for
// the destination before every system call).
//
// Single-threaded: lives on the client's event loop with its connection.
//
//   LandingMessageStream messages(*socket);
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

#include "socket_stream.h"

namespace ps {

class LandingMessageStream final : public capnp::MessageStream {
 public:
  // Segments smaller than this are read with the rest of their message.
  static constexpr size_t kMinLandingBytes = 16u << 10;

  explicit LandingMessageStream(SocketStream& stream);
  ~LandingMessageStream() noexcept(false);

  struct Destinations;

  // Where the values of one pull request go, in the order of its names
  // (empty: that tensor is not landed). Withdrawn when destroyed.
  class Expectation {
   public:
    Expectation(LandingMessageStream& stream, kj::Own<Destinations> dest);
    ~Expectation();
    KJ_DISALLOW_COPY(Expectation);
    uint64_t tag() const;

   private:
    LandingMessageStream& stream_;
    kj::Own<Destinations> dest_;
  };

  kj::Own<Expectation> expect(std::vector<kj::ArrayPtr<kj::byte>> buffers);

  // Messages read so far with at least one segment landed (for tests and
  // benchmarks: says the direct path was taken).
  uint64_t landed_messages() const { return landed_messages_; }

  // capnp::MessageStream
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(kj::ArrayPtr<kj::AutoCloseFd> fdSpace,
                                                                   capnp::ReaderOptions options,
                                                                   kj::ArrayPtr<capnp::word> scratchSpace) override;
  kj::Promise<void> writeMessage(kj::ArrayPtr<const int> fds,
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

  SocketStream& stream_;
  capnp::AsyncIoMessageStream writer_;
  std::unordered_map<uint64_t, Destinations*> expected_;
  uint64_t next_tag_;
  uint64_t landed_messages_ = 0;
  kj::Own<Placeholder> placeholder_;
};

}  // namespace ps
