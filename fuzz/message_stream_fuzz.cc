// libFuzzer target over the two message streams that read bytes from the
// other end of a connection: psd's BufferedMessageStream (what any client
// sends) and libpsclient's ClientMessageStream (psd's replies, whose large
// tensors it reads straight into the caller's buffers).
//
// The first input byte picks what the rest is:
//   0: raw bytes for psd's stream;
//   1: raw bytes for the client's stream, with a pull pending (so unknown
//      replies go through its landing logic too);
//   2: the shape of a pull reply as psd builds it (tensor sizes, which ones
//      travel as segments of their own), answering the pending pull, then
//      byte flips and a cut applied to its bytes, then raw bytes after it.
// Modes 1 and 2 may also guess where a reply's tensor starts
// (SocketStream::land_next_read), rightly or not.
// Every message read is traversed whole. Checks, besides the sanitizers':
// an unmutated reply (mode 2 with no flips and no cut) lands every tensor
// bit-exactly in its buffer; the landing buffers are exact-size heap
// allocations, so a write past one is an AddressSanitizer report.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <kj/async-unix.h>
#include <kj/debug.h>

#include "common/net/buffered_message_stream.h"
#include "common/net/client_message_stream.h"
#include "schema/ps.capnp.h"
#include "common/net/socket_stream.h"

namespace {

constexpr size_t kMaxMessages = 64;

capnp::ReaderOptions reader_options() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 1u
                                  << 20;  // 8 MiB: the fuzzer's claims of huge messages stay cheap
  return options;
}

struct Loop {
  kj::UnixEventPort port;
  kj::EventLoop loop{port};
  kj::WaitScope ws{loop};
};

// Writes `bytes` to fd from a thread (a socket holds less than a large
// reply), then ends the stream. A reader that stops early shuts its side
// (SocketStream::abortRead), which fails the write instead of blocking it.
std::thread write_all(int fd, const std::vector<uint8_t>& bytes) {
  return std::thread([fd, &bytes] {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
  });
}

// Reads messages until the end of the stream, an error, or kMaxMessages,
// traversing each; returns how many were read whole.
size_t drain(Loop& l, capnp::MessageStream& stream,
             std::vector<kj::Own<capnp::MessageReader>>* keep) {
  size_t read = 0;
  auto failure = kj::runCatchingExceptions([&] {
    for (; read < kMaxMessages; ++read) {
      auto m = stream.tryReadMessage(nullptr, reader_options(), nullptr).wait(l.ws);
      KJ_IF_MAYBE (message, m) {
        auto reader = kj::mv(message->reader);
        kj::runCatchingExceptions([&] { (void)reader->getRoot<capnp::AnyPointer>().targetSize(); });
        if (keep != nullptr) keep->push_back(kj::mv(reader));
      } else {
        return;
      }
    }
  });
  (void)failure;  // a refused message ends the connection; that is the expected outcome
  return read;
}

struct Tensor {
  std::vector<float> values;
  bool external;  // sent as a segment of its own, as psd sends 64 KiB and more
};

// A pull reply as psd builds it (server/shard.cc): an rpc Return whose
// content is PullResults, large tensors referenced as segments of their own.
std::vector<uint8_t> pull_reply(uint64_t tag, const std::vector<Tensor>& tensors) {
  capnp::MallocMessageBuilder message(256, capnp::AllocationStrategy::FIXED_SIZE);
  auto ret = message.initRoot<capnp::rpc::Message>().initReturn();
  ret.setAnswerId(1);
  auto results = ret.initResults().getContent().initAs<ps::wire::Shard::PullResults>();
  results.setTag(tag);
  auto list = results.initTensors(static_cast<unsigned>(tensors.size()));
  auto orphanage = capnp::Orphanage::getForMessageContaining(results);
  for (unsigned i = 0; i < tensors.size(); ++i) {
    list[i].setName(kj::str("t", i));
    list[i].setVersion(i + 1);
    auto bytes = kj::arrayPtr(reinterpret_cast<const kj::byte*>(tensors[i].values.data()),
                              tensors[i].values.size() * sizeof(float));
    if (tensors[i].external) {
      list[i].adoptValues(orphanage.referenceExternalData(bytes));
    } else {
      list[i].setValues(bytes);
    }
  }
  auto flat = capnp::messageToFlatArray(message);
  auto raw = flat.asBytes();
  return std::vector<uint8_t>(raw.begin(), raw.end());
}

void fuzz_psd_stream(Loop& l, int fd, const std::vector<uint8_t>& bytes, int peer) {
  auto socket = ps::wrap_socket(l.port, fd);
  ps::BufferedMessageStream stream(*socket);
  auto writer = write_all(peer, bytes);
  drain(l, stream, nullptr);
  socket->abortRead();
  writer.join();
}

void fuzz_client_stream(Loop& l, int fd, int peer, FuzzedDataProvider& in, bool reply) {
  auto socket = ps::wrap_socket(l.port, fd);
  ps::ClientMessageStream stream(*socket);

  std::vector<Tensor> tensors(in.ConsumeIntegralInRange<size_t>(1, 4));
  for (auto& t : tensors) {
    // Around the landing thresholds (16 KiB, 64 KiB) and a little over.
    t.values.resize(in.ConsumeIntegralInRange<size_t>(0, 40u << 10));
    for (size_t k = 0; k < t.values.size(); ++k) t.values[k] = static_cast<float>(k % 1009) * 0.5f;
    // capnp references whole words only (psd sends in place only then).
    t.external = in.ConsumeBool() && t.values.size() % 2 == 0;
  }
  std::vector<std::vector<float>> buffers;
  std::vector<kj::ArrayPtr<kj::byte>> places;
  for (auto& t : tensors) {
    // Mostly the right size; sometimes not (the stream must then not land it).
    const size_t n =
        in.ConsumeBool() ? t.values.size() : in.ConsumeIntegralInRange<size_t>(0, 40u << 10);
    buffers.emplace_back(n, -1.0f);
    places.push_back(
        kj::arrayPtr(reinterpret_cast<kj::byte*>(buffers.back().data()), n * sizeof(float)));
  }
  auto expect = stream.expect(places);
  // A guess where the reply's first large tensor starts (libpsclient
  // guesses from the last reply alike; SocketStream::land_next_read),
  // right or wrong: every byte must still end up where it belongs.
  kj::ArrayPtr<kj::byte> landing;
  if (in.ConsumeBool()) {
    landing = places[in.ConsumeIntegralInRange<size_t>(0, places.size() - 1)];
    socket->land_next_read(in.ConsumeIntegralInRange<size_t>(0, 4096), landing);
  }

  std::vector<uint8_t> bytes;
  bool intact = false;
  if (reply) {
    bytes = pull_reply(expect->tag(), tensors);
    const size_t flips = in.ConsumeIntegralInRange<size_t>(0, 8);
    for (size_t k = 0; k < flips && !bytes.empty(); ++k) {
      bytes[in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1)] ^=
          in.ConsumeIntegralInRange<uint8_t>(1, 255);
    }
    const bool cut = in.ConsumeBool();
    if (cut && !bytes.empty()) bytes.resize(in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1));
    intact = flips == 0 && !cut;
  }
  auto rest = in.ConsumeRemainingBytes<uint8_t>();
  bytes.insert(bytes.end(), rest.begin(), rest.end());

  auto writer = write_all(peer, bytes);
  std::vector<kj::Own<capnp::MessageReader>> messages;
  drain(l, stream, &messages);
  socket->abortRead();
  writer.join();
  socket->release(landing);  // before the buffers go

  if (intact) {
    // The reply is the first message; its values read back exactly as sent,
    // from the caller's buffer where they landed or from the message.
    if (messages.empty()) __builtin_trap();
    auto got = messages[0]
                   ->getRoot<capnp::rpc::Message>()
                   .getReturn()
                   .getResults()
                   .getContent()
                   .getAs<ps::wire::Shard::PullResults>()
                   .getTensors();
    if (got.size() != tensors.size()) __builtin_trap();
    for (unsigned i = 0; i < got.size(); ++i) {
      auto values = got[i].getValues();
      const size_t size = tensors[i].values.size() * sizeof(float);
      if (values.size() != size) __builtin_trap();
      if (size > 0 && std::memcmp(values.begin(), tensors[i].values.data(), size) != 0)
        __builtin_trap();
      // A tensor that landed is the caller's buffer, now holding the values.
      if (values.begin() == places[i].begin() && places[i].size() != size) __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint8_t mode = in.ConsumeIntegralInRange<uint8_t>(0, 2);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  {
    Loop l;
    if (mode == 0) {
      fuzz_psd_stream(l, fds[0], in.ConsumeRemainingBytes<uint8_t>(), fds[1]);
    } else {
      fuzz_client_stream(l, fds[0], fds[1], in, mode == 2);
    }
  }  // the stream closed fds[0]
  ::close(fds[1]);
  return 0;
}
