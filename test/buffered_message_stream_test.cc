// ps::BufferedMessageStream (common/net/buffered_message_stream.h), psd's
// message stream: messages up to 128 KiB read in place in a shared buffer,
// larger ones into memory of their own, every one whole and in order
// however the bytes arrive; bad framing refused before anything is read
// for it. The bytes are written from another thread in pieces of random
// size, so reads meet messages cut anywhere.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <catch2/catch.hpp>

#include "common/net/buffered_message_stream.h"
#include "test/kj_test_loop.h"

namespace {

using ps::BufferedMessageStream;
using ps::test::Loop;

// A message holding `blobs` as a List(Data); a small fixed first segment,
// so blobs over it go to segments of their own.
struct Message {
  std::vector<std::vector<uint8_t>> blobs;
  kj::Array<capnp::word> flat;
  size_t segments = 0;
};

Message make_message(const std::vector<size_t>& sizes, std::mt19937& rng) {
  Message m;
  capnp::MallocMessageBuilder builder(64, capnp::AllocationStrategy::FIXED_SIZE);
  auto list = builder.initRoot<capnp::AnyPointer>().initAs<capnp::List<capnp::Data>>(
      static_cast<unsigned>(sizes.size()));
  for (unsigned i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> blob(sizes[i]);
    for (auto& b : blob) b = static_cast<uint8_t>(rng());
    list.set(i, kj::arrayPtr(blob.data(), blob.size()));
    m.blobs.push_back(std::move(blob));
  }
  m.segments = builder.getSegmentsForOutput().size();
  m.flat = capnp::messageToFlatArray(builder);
  return m;
}

// What a reader holds, checked against what was sent; segments must be
// word-aligned for capnp.
void check_same(capnp::MessageReader& reader, const Message& m) {
  for (uint i = 0; reader.getSegment(i) != nullptr; ++i) {
    CHECK(reinterpret_cast<uintptr_t>(reader.getSegment(i).begin()) % sizeof(capnp::word) == 0);
  }
  auto list = reader.getRoot<capnp::AnyPointer>().getAs<capnp::List<capnp::Data>>();
  REQUIRE(list.size() == m.blobs.size());
  for (unsigned i = 0; i < list.size(); ++i) {
    REQUIRE(list[i].size() == m.blobs[i].size());
    if (!m.blobs[i].empty())
      CHECK(std::memcmp(list[i].begin(), m.blobs[i].data(), m.blobs[i].size()) == 0);
  }
}

struct Pair {
  int fds[2];
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~Pair() {
    if (fds[1] >= 0) ::close(fds[1]);
  }
  // fds[0] now belongs to the stream.
  kj::Own<ps::SocketStream> reading_end(Loop& loop) { return ps::wrap_socket(loop.port, fds[0]); }
};

// Writes `bytes` to fd in pieces of 1 byte to 200 KiB with short pauses,
// then closes fd if asked.
std::thread write_in_pieces(int& fd, std::vector<uint8_t> bytes, unsigned seed, bool close_after) {
  return std::thread([&fd, bytes = std::move(bytes), seed, close_after] {
    std::mt19937 rng(seed);
    size_t done = 0;
    while (done < bytes.size()) {
      const size_t piece =
          std::min<size_t>(bytes.size() - done, 1 + rng() % (rng() % 2 ? 64 : 200u << 10));
      // A reader that gave up (and closed its end) fails the send, not the test.
      const ssize_t n = ::send(fd, bytes.data() + done, piece, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
      if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    }
    if (close_after) {
      ::close(fd);
      fd = -1;
    }
  });
}

// Writes each message whole, then waits for the reader to catch up.
// With `read`, message i is written only once the reader has counted i
// messages read (bounded wait), so no two are ever in the socket together,
// however late a loaded machine runs the reader.
std::thread write_one_by_one(int fd, const std::vector<Message>& messages,
                             const std::atomic<size_t>* read = nullptr) {
  return std::thread([fd, &messages, read] {
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (read != nullptr && read->load() < i && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      auto b = messages[i].flat.asBytes();
      size_t done = 0;
      while (done < b.size()) {
        const ssize_t n = ::write(fd, b.begin() + done, b.size() - done);
        if (n <= 0) return;
        done += static_cast<size_t>(n);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
}

std::vector<uint8_t> concat(const std::vector<Message>& messages) {
  std::vector<uint8_t> out;
  for (auto& m : messages) {
    auto b = m.flat.asBytes();
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

kj::Own<capnp::MessageReader> read_one(Loop& loop, BufferedMessageStream& messages,
                                       capnp::ReaderOptions options = capnp::ReaderOptions()) {
  auto got = loop.wait(messages.tryReadMessage(nullptr, options, nullptr));
  KJ_IF_MAYBE (m, got) {
    return kj::mv(m->reader);
  }
  FAIL("the stream ended early");
  return kj::Own<capnp::MessageReader>();
}

}  // namespace

TEST_CASE("messages of every size arrive whole and in order, however the bytes are cut") {
  std::mt19937 rng(11);
  // In the buffer (up to 128 KiB with framing), just over it, and large
  // ones of several segments.
  const std::vector<std::vector<size_t>> shapes = {
      {0},          {1},      {100},         {4096},       {65536}, {65536, 8}, {130000},
      {131000},     {140000}, {1 << 20},     {3 << 20, 5}, {65536}, {7},        {200000, 200000, 3},
      {64, 64, 64}, {65536},  {131064 - 96}, {2 << 20},    {12},
  };
  std::vector<Message> sent;
  for (auto& s : shapes) sent.push_back(make_message(s, rng));
  for (unsigned seed = 1; seed <= 4; ++seed) {
    Loop loop;
    Pair pair;
    auto socket = pair.reading_end(loop);
    BufferedMessageStream messages(*socket);
    auto writer = write_in_pieces(pair.fds[1], concat(sent), seed, true);
    // Some kept to the end, so later messages meet a buffer still in use.
    std::vector<std::pair<kj::Own<capnp::MessageReader>, const Message*>> kept;
    for (size_t i = 0; i < sent.size(); ++i) {
      auto reader = read_one(loop, messages);
      check_same(*reader, sent[i]);
      if (i % 3 == seed % 3) kept.emplace_back(kj::mv(reader), &sent[i]);
    }
    for (auto& [reader, m] : kept) check_same(*reader, *m);
    // Then the end of the stream, as no message.
    CHECK(loop.wait(messages.tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr)) == nullptr);
    writer.join();
  }
}

TEST_CASE("messages still in use keep their bytes while later ones are read") {
  std::mt19937 rng(5);
  std::vector<Message> sent;
  for (int i = 0; i < 40; ++i)
    sent.push_back(make_message({65536 + 8 * static_cast<size_t>(i)}, rng));
  Loop loop;
  Pair pair;
  auto socket = pair.reading_end(loop);
  BufferedMessageStream messages(*socket);

  SECTION("all kept until the end: full buffers are left to them") {
    auto writer = write_in_pieces(pair.fds[1], concat(sent), 3, false);
    std::vector<kj::Own<capnp::MessageReader>> kept;
    for (size_t i = 0; i < sent.size(); ++i) kept.push_back(read_one(loop, messages));
    writer.join();
    for (size_t i = 0; i < sent.size(); ++i) check_same(*kept[i], sent[i]);
    // 40 messages of 64 KiB and more in 256 KiB buffers.
    CHECK(messages.buffers_taken() >= 10);
  }
  SECTION("all kept, each read before the next is sent") {
    auto writer = write_one_by_one(pair.fds[1], sent);
    std::vector<kj::Own<capnp::MessageReader>> kept;
    for (size_t i = 0; i < sent.size(); ++i) kept.push_back(read_one(loop, messages));
    writer.join();
    for (size_t i = 0; i < sent.size(); ++i) check_same(*kept[i], sent[i]);
  }
  SECTION(
      "each kept until the next is read, as the RPC layer does: the two buffers serve them all") {
    auto writer = write_in_pieces(pair.fds[1], concat(sent), 5, false);
    kj::Own<capnp::MessageReader> previous;
    for (size_t i = 0; i < sent.size(); ++i) {
      auto reader = read_one(loop, messages);
      check_same(*reader, sent[i]);
      previous = kj::mv(reader);
    }
    writer.join();
    CHECK(messages.buffers_taken() == 2);
  }
  SECTION("each let go before the next: one buffer serves them all, no spare is taken") {
    auto writer = write_in_pieces(pair.fds[1], concat(sent), 4, false);
    for (size_t i = 0; i < sent.size(); ++i) check_same(*read_one(loop, messages), sent[i]);
    writer.join();
    CHECK(messages.buffers_taken() == 1);
  }
}

TEST_CASE("a stream that ends inside a message is an error") {
  std::mt19937 rng(9);
  Message m = make_message({100000}, rng);
  auto bytes = m.flat.asBytes();
  for (size_t cut : {size_t{3}, size_t{8}, size_t{5000}, bytes.size() - 1}) {
    Loop loop;
    Pair pair;
    auto socket = pair.reading_end(loop);
    BufferedMessageStream messages(*socket);
    auto writer = write_in_pieces(
        pair.fds[1], std::vector<uint8_t>(bytes.begin(), bytes.begin() + cut), 1, true);
    CHECK_THROWS_WITH(loop.wait(messages.tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr)),
                      Catch::Contains("premature EOF"));
    writer.join();
  }
}

TEST_CASE("bad framing is refused before its body is waited for") {
  Loop loop;
  Pair pair;
  auto socket = pair.reading_end(loop);
  BufferedMessageStream messages(*socket);
  SECTION("too many segments") {
    const uint32_t header[2] = {1000, 1};
    REQUIRE(::write(pair.fds[1], header, sizeof(header)) == sizeof(header));
    CHECK_THROWS_WITH(loop.wait(messages.tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr)),
                      Catch::Contains("too many segments"));
  }
  SECTION("over the reader's size limit, in one segment or several") {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 1000;
    const uint32_t one[2] = {0, 1001};
    const uint32_t three[4] = {2, 400, 400, 300};
    const bool several = GENERATE(false, true);
    if (several)
      REQUIRE(::write(pair.fds[1], three, sizeof(three)) == sizeof(three));
    else
      REQUIRE(::write(pair.fds[1], one, sizeof(one)) == sizeof(one));
    // No body follows: a stream that waited for it would time out.
    CHECK_THROWS_WITH(loop.wait(messages.tryReadMessage(nullptr, options, nullptr)),
                      Catch::Contains("too large"));
  }
}

TEST_CASE("messages written through it read back as sent, one or several at a time") {
  std::mt19937 rng(2);
  Loop loop;
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  auto a = ps::wrap_socket(loop.port, fds[0]);
  auto b = ps::wrap_socket(loop.port, fds[1]);
  BufferedMessageStream out(*a), in(*b);
  std::vector<Message> sent;
  for (auto& shape : std::vector<std::vector<size_t>>{{10}, {70000, 70000}, {300000}, {0, 1, 2}}) {
    sent.push_back(make_message(shape, rng));
  }
  // Segments as the RPC layer hands them over.
  auto segments_of = [](const Message& m) {
    capnp::FlatArrayMessageReader reader(m.flat);
    std::vector<kj::ArrayPtr<const capnp::word>> segs;
    for (uint i = 0;; ++i) {
      auto s = reader.getSegment(i);
      if (s == nullptr) break;
      segs.push_back(s);
    }
    return segs;
  };
  auto first = segments_of(sent[0]);
  REQUIRE(first.size() == sent[0].segments);
  auto sending = out.writeMessage(nullptr, kj::arrayPtr(first.data(), first.size()));
  std::vector<std::vector<kj::ArrayPtr<const capnp::word>>> rest;
  for (size_t i = 1; i < sent.size(); ++i) rest.push_back(segments_of(sent[i]));
  std::vector<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> batch;
  for (auto& r : rest) batch.push_back(kj::arrayPtr(r.data(), r.size()));
  // Sent while the other end reads: the large ones do not fit in the socket's buffer.
  sending =
      sending.then([&] { return out.writeMessages(kj::arrayPtr(batch.data(), batch.size())); })
          .eagerlyEvaluate(nullptr);
  for (auto& m : sent) check_same(*read_one(loop, in), m);
  loop.wait(kj::mv(sending));
}

TEST_CASE("a message after a large one that arrived in odd pieces starts on a whole word") {
  // A small message kept (its buffer stays in use), then a large one whose
  // first piece ends mid-word, then a small one: that one must not be read
  // at the odd offset the large one's piece left behind.
  std::mt19937 rng(8);
  Message first = make_message({40}, rng), large = make_message({300000}, rng),
          last = make_message({24}, rng);
  Loop loop;
  Pair pair;
  auto socket = pair.reading_end(loop);
  BufferedMessageStream messages(*socket);
  const int fd = pair.fds[1];
  std::thread writer([fd, &first, &large, &last] {
    auto put = [fd](const kj::byte* p, size_t n) {
      while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= static_cast<size_t>(w);
      }
    };
    put(first.flat.asBytes().begin(), first.flat.asBytes().size());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto l = large.flat.asBytes();
    const size_t cut = 8 + 1001;  // the table and an odd part of the body
    put(l.begin(), cut);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    put(l.begin() + cut, l.size() - cut);
    put(last.flat.asBytes().begin(), last.flat.asBytes().size());
  });
  auto kept = read_one(loop, messages);
  check_same(*read_one(loop, messages), large);
  check_same(*read_one(loop, messages), last);
  check_same(*kept, first);
  writer.join();
}

TEST_CASE("random bytes give messages, an end or an error, nothing worse") {
  for (unsigned seed = 1; seed <= 30; ++seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> junk(rng() % (300u << 10));
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    // Now and then a plausible header: few segments, sizes in range.
    if (junk.size() >= 16 && seed % 2 == 0) {
      const uint32_t header[4] = {
          static_cast<uint32_t>(rng() % 3), static_cast<uint32_t>(rng() % 40000),
          static_cast<uint32_t>(rng() % 40000), static_cast<uint32_t>(rng() % 40000)};
      std::memcpy(junk.data(), header, sizeof(header));
    }
    Loop loop;
    Pair pair;
    std::thread writer;
    bool ended = false;
    {
      auto socket = pair.reading_end(loop);
      BufferedMessageStream messages(*socket);
      writer = write_in_pieces(pair.fds[1], junk, seed, true);
      capnp::ReaderOptions options;
      options.traversalLimitInWords = 64 * 1024;
      try {
        for (int read = 0; read < 1000; ++read) {
          if (loop.wait(messages.tryReadMessage(nullptr, options, nullptr)) == nullptr) {
            ended = true;
            break;
          }
        }
      } catch (const kj::Exception&) {
        ended = true;
      }
    }  // closes the reading end: a writer with bytes left stops
    CHECK(ended);
    writer.join();
  }
}

TEST_CASE("buffers are taken at the first read, of the size the message limit needs") {
  std::mt19937 rng(5);
  std::vector<Message> sent;
  for (int i = 0; i < 20; ++i) sent.push_back(make_message({1000, 3000}, rng));
  Loop loop;
  Pair pair;
  auto socket = pair.reading_end(loop);
  BufferedMessageStream messages(*socket);
  CHECK(messages.buffers_taken() == 0);
  CHECK(messages.buffer_bytes() == BufferedMessageStream::kBufferBytes);
  messages.set_max_message_bytes(64u << 10);  // before hello
  CHECK(messages.buffer_bytes() == (64u << 10));
  auto writer = write_in_pieces(pair.fds[1], concat(sent), 3, false);
  kj::Own<capnp::MessageReader> previous;
  for (size_t i = 0; i < 10; ++i) {
    auto reader = read_one(loop, messages);
    check_same(*reader, sent[i]);
    previous = kj::mv(reader);
  }
  CHECK(messages.buffers_taken() == 2);        // small ones: a message kept in use needs a second
  messages.set_max_message_bytes(UINT64_MAX);  // after hello: full-size buffers, nothing lost
  for (size_t i = 10; i < sent.size(); ++i) {
    auto reader = read_one(loop, messages);
    check_same(*reader, sent[i]);
    previous = kj::mv(reader);
  }
  writer.join();
  CHECK(messages.buffer_bytes() == BufferedMessageStream::kBufferBytes);
  CHECK(messages.buffers_taken() == 3);  // one full-size buffer was enough after the change
}

TEST_CASE("small messages read one at a time reuse the fronts of two buffers") {
  // Each kept until the next is read, as the RPC layer does; each sent
  // after the last was read, so nothing is unread between them. Going on
  // through a buffer instead would touch a new page every message or so.
  std::mt19937 rng(4);
  std::vector<Message> sent;
  for (int i = 0; i < 50; ++i) sent.push_back(make_message({4096}, rng));
  Loop loop;
  Pair pair;
  auto socket = pair.reading_end(loop);
  BufferedMessageStream messages(*socket);
  std::atomic<size_t> read{0};
  auto writer = write_one_by_one(pair.fds[1], sent, &read);
  std::set<const capnp::word*> starts;
  kj::Own<capnp::MessageReader> previous;
  for (auto& m : sent) {
    auto reader = read_one(loop, messages);
    check_same(*reader, m);
    starts.insert(reader->getSegment(0).begin());
    previous = kj::mv(reader);
    ++read;
  }
  writer.join();
  CHECK(starts.size() == 2);
  CHECK(messages.buffers_taken() == 2);
}
