// ps::ClientMessageStream (client/client_message_stream.h): pull replies whose
// large tensors are read straight into registered buffers, everything else
// read as Cap'n Proto would, and Finish messages sent with the next message.
// The replies here are built as psd builds them (rpc Return, tensors
// referenced as segments of their own) and written from another thread, so
// reads meet the data in pieces as they do in use.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>
#include <catch2/catch.hpp>
#include <kj/async-unix.h>

#include "common/net/client_message_stream.h"
#include "test/kj_test_loop.h"
#include "schema/ps.capnp.h"

namespace {

using ps::test::Loop;

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

kj::ArrayPtr<const kj::byte> bytes_of(const std::vector<float>& v) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(v.data()), v.size() * sizeof(float));
}
kj::ArrayPtr<kj::byte> bytes_of(std::vector<float>& v) {
  return kj::arrayPtr(reinterpret_cast<kj::byte*>(v.data()), v.size() * sizeof(float));
}

// A pull reply as psd sends it: tensors[i] gets values[i], by reference
// (a segment of its own) from 64 KiB up.
struct Reply {
  capnp::MallocMessageBuilder message;
  explicit Reply(uint64_t tag, const std::vector<const std::vector<float>*>& values,
                 unsigned first_segment_words = 1024)
      : message(first_segment_words, capnp::AllocationStrategy::FIXED_SIZE) {
    auto ret = message.initRoot<capnp::rpc::Message>().initReturn();
    ret.setAnswerId(7);
    auto results = ret.initResults().getContent().initAs<ps::wire::Shard::PullResults>();
    results.setTag(tag);
    results.setStep(3);
    auto tensors = results.initTensors(static_cast<unsigned>(values.size()));
    auto orphanage = capnp::Orphanage::getForMessageContaining(results);
    for (unsigned i = 0; i < values.size(); ++i) {
      tensors[i].setName(kj::str("t", i));
      tensors[i].setVersion(i + 1);
      if (values[i]->size() * sizeof(float) >= (64u << 10)) {
        tensors[i].adoptValues(orphanage.referenceExternalData(bytes_of(*values[i])));
      } else {
        tensors[i].setValues(bytes_of(*values[i]));
      }
    }
  }
};

// Writes `flat` (a whole message, or part of it) to fd from a thread, then
// ends the stream if asked.
std::thread write_from_thread(int fd, kj::ArrayPtr<const kj::byte> flat, bool end_after = false) {
  return std::thread([fd, flat, end_after] {
    size_t done = 0;
    while (done < flat.size()) {
      ssize_t n = ::write(fd, flat.begin() + done, flat.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (end_after) ::shutdown(fd, SHUT_WR);
  });
}

kj::Array<kj::byte> flatten(capnp::MessageBuilder& m) {
  auto words = capnp::messageToFlatArray(m);
  auto out = kj::heapArray<kj::byte>(words.asBytes().size());
  std::memcpy(out.begin(), words.asBytes().begin(), out.size());
  return out;
}

struct Fixture {
  Loop l;
  int fds[2];
  kj::Own<ps::SocketStream> socket;
  kj::Own<ps::ClientMessageStream> stream;
  Fixture() {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    socket = ps::wrap_socket(l.port, fds[0]);
    stream = kj::heap<ps::ClientMessageStream>(*socket);
  }
  ~Fixture() { ::close(fds[1]); }

  kj::Own<capnp::MessageReader> read() {
    auto m = l.wait(stream->tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr));
    return kj::mv(KJ_REQUIRE_NONNULL(m).reader);
  }

  // `message` sent from another thread and read by the stream.
  kj::Own<capnp::MessageReader> receive(capnp::MessageBuilder& message) {
    auto flat = flatten(message);
    auto writer = write_from_thread(fds[1], flat);
    auto m = read();
    writer.join();
    return m;
  }
};

ps::wire::Shard::PullResults::Reader results_of(capnp::MessageReader& m) {
  return m.getRoot<capnp::rpc::Message>()
      .getReturn()
      .getResults()
      .getContent()
      .getAs<ps::wire::Shard::PullResults>();
}

}  // namespace

TEST_CASE("a pull reply's large tensors are read straight into the registered buffers") {
  Fixture f;
  auto a = random_floats(256 << 10, 1);  // 1 MiB
  auto b = random_floats(40 << 10, 2);   // 160 KiB
  auto c = random_floats(100, 3);        // small: stays in the first segment
  std::vector<float> da(a.size(), 0.0f), db(b.size(), 0.0f), dc(c.size(), 0.0f);
  auto expect = f.stream->expect({bytes_of(da), bytes_of(db), bytes_of(dc)});
  Reply reply(expect->tag(), {&a, &b, &c});
  auto m = f.receive(reply.message);

  auto tensors = results_of(*m).getTensors();
  REQUIRE(tensors.size() == 3);
  CHECK(tensors[0].getValues().begin() == bytes_of(da).begin());
  CHECK(tensors[1].getValues().begin() == bytes_of(db).begin());
  CHECK(tensors[2].getValues().begin() != bytes_of(dc).begin());  // under the landing size
  CHECK(da == a);
  CHECK(db == b);
  CHECK(std::memcmp(tensors[2].getValues().begin(), c.data(), c.size() * sizeof(float)) == 0);
  CHECK(results_of(*m).getStep() == 3);
  CHECK(tensors[1].getVersion() == 2);
  CHECK(f.stream->landed_messages() == 1);
}

TEST_CASE("a reply like one before is read in one system call, its tensor straight into place") {
  Fixture f;
  auto small = random_floats(100, 11);
  std::vector<float> got_small(small.size());
  std::vector<uint64_t> calls;
  std::vector<std::vector<float>> sent;
  for (unsigned round = 0; round < 3; ++round) {
    sent.push_back(random_floats(16 << 10, 12 + round));  // 64 KiB: a segment of its own
    std::vector<float> dest(sent.back().size(), 0.0f);
    auto expect = f.stream->expect({bytes_of(got_small), bytes_of(dest)});
    Reply reply(expect->tag(), {&small, &sent.back()});
    auto flat = flatten(reply.message);
    // All of it in the socket before the stream reads (a Unix socket holds 64 KiB and more).
    REQUIRE(::write(f.fds[1], flat.begin(), flat.size()) == static_cast<ssize_t>(flat.size()));
    const uint64_t before = f.socket->read_calls();
    auto m = f.read();
    calls.push_back(f.socket->read_calls() - before);
    auto tensors = results_of(*m).getTensors();
    REQUIRE(tensors.size() == 2);
    CHECK(tensors[1].getValues().begin() == bytes_of(dest).begin());
    CHECK(dest == sent.back());
    CHECK(std::memcmp(tensors[0].getValues().begin(), small.data(), small.size() * sizeof(float)) ==
          0);
  }
  // The first round learns where the tensor starts (the first segment, then
  // the tensor: two reads); the next ones read both at once.
  CHECK(calls == std::vector<uint64_t>{2, 1, 1});
  CHECK(f.stream->landed_messages() == 3);
}

TEST_CASE(
    "a reply with no registered tag, or a buffer of another size, is read as Cap'n Proto would") {
  Fixture f;
  auto a = random_floats(64 << 10, 4);
  std::vector<float> da(a.size(), 0.0f), wrong(a.size() / 2, 0.0f);
  auto expect = f.stream->expect({bytes_of(wrong)});
  for (uint64_t tag : {expect->tag() + 1, expect->tag()}) {
    Reply reply(tag, {&a});
    auto m = f.receive(reply.message);
    auto values = results_of(*m).getTensors()[0].getValues();
    REQUIRE(values.size() == a.size() * sizeof(float));
    CHECK(std::memcmp(values.begin(), a.data(), values.size()) == 0);
  }
  CHECK(std::all_of(wrong.begin(), wrong.end(), [](float x) { return x == 0.0f; }));
  CHECK(f.stream->landed_messages() == 0);
}

TEST_CASE("a withdrawn pull's bytes stop going to its buffer, even mid-segment") {
  Fixture f;
  auto a = random_floats(256 << 10, 5);  // 1 MiB in one segment
  std::vector<float> da(a.size(), 0.0f);
  auto expect =
      kj::Maybe<kj::Own<ps::ClientMessageStream::Expectation>>(f.stream->expect({bytes_of(da)}));
  Reply reply(KJ_ASSERT_NONNULL(expect)->tag(), {&a});
  auto flat = flatten(reply.message);
  const size_t first = flat.size() - (600u << 10);  // header, first segment and ~400 KiB of values
  auto head = write_from_thread(f.fds[1], flat.slice(0, first));
  auto reading = f.stream->tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr);
  // Let the stream take in what has arrived.
  const size_t landed_floats = (first - (flat.size() - a.size() * sizeof(float))) / sizeof(float);
  for (int i = 0; i < 5000 && da[landed_floats - 1] == 0.0f; ++i) {
    f.l.ws.poll();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  head.join();
  REQUIRE(da[landed_floats - 1] == a[landed_floats - 1]);
  expect = nullptr;  // the pull gives up: its buffer may be gone from here on
  auto tail = write_from_thread(f.fds[1], flat.slice(first, flat.size()));
  auto m = f.l.wait(kj::mv(reading));
  tail.join();
  auto values = results_of(*KJ_ASSERT_NONNULL(m).reader).getTensors()[0].getValues();
  CHECK(values.begin() != bytes_of(da).begin());
  CHECK(std::equal(a.begin(), a.begin() + landed_floats, da.begin()));
  CHECK(std::all_of(da.begin() + landed_floats, da.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("a reply laid out otherwise (landing pads after the values) still reads correctly") {
  Fixture f;
  auto a = random_floats(64 << 10, 6);
  auto b = random_floats(64 << 10, 7);
  std::vector<float> da(a.size(), 0.0f), db(b.size(), 0.0f);
  auto expect = f.stream->expect({bytes_of(da), bytes_of(db)});
  // A 16-word first segment: the tensor list and the far-pointer pads end
  // up in segments after the values' own, unknown when those arrive.
  Reply reply(expect->tag(), {&a, &b}, 16);
  REQUIRE(reply.message.getSegmentsForOutput().size() > 3);
  auto m = f.receive(reply.message);
  auto tensors = results_of(*m).getTensors();
  REQUIRE(tensors.size() == 2);
  CHECK(std::memcmp(tensors[0].getValues().begin(), a.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(tensors[1].getValues().begin(), b.data(), b.size() * sizeof(float)) == 0);
}

TEST_CASE("garbage where a reply's first segment should be is passed on, not trusted") {
  Fixture f;
  std::vector<float> da(64 << 10, 0.0f);
  auto expect = f.stream->expect({bytes_of(da)});
  // Two segments: 8 words of noise, then 256 KiB.
  std::vector<uint32_t> header = {1, 8, 32u << 10, 0};
  auto noise = random_floats(16, 8);
  std::vector<kj::byte> flat(header.size() * 4 + 64 + (256u << 10), 0x5a);
  std::memcpy(flat.data(), header.data(), header.size() * 4);
  std::memcpy(flat.data() + header.size() * 4, noise.data(), 64);
  auto writer = write_from_thread(f.fds[1], kj::arrayPtr(flat.data(), flat.size()));
  auto m = f.read();
  writer.join();
  CHECK(m->getSegment(1).size() == 32u << 10);
  CHECK(f.stream->landed_messages() == 0);
  CHECK(std::all_of(da.begin(), da.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("framing errors: too many segments, end of stream inside a message") {
  SECTION("too many segments") {
    Fixture f;
    uint32_t header[2] = {100000, 1};
    REQUIRE(::write(f.fds[1], header, sizeof(header)) == sizeof(header));
    CHECK_THROWS_WITH(f.read(), Catch::Contains("too many segments"));
  }
  SECTION("ends inside a landing segment") {
    Fixture f;
    auto a = random_floats(64 << 10, 9);
    std::vector<float> da(a.size(), 0.0f);
    auto expect = f.stream->expect({bytes_of(da)});
    Reply reply(expect->tag(), {&a});
    auto flat = flatten(reply.message);
    auto writer = write_from_thread(f.fds[1], flat.slice(0, flat.size() - 1000), true);
    CHECK_THROWS(f.read());
    writer.join();
  }
  SECTION("a clean end between messages is no message") {
    Fixture f;
    ::shutdown(f.fds[1], SHUT_WR);
    auto m = f.l.wait(f.stream->tryReadMessage(nullptr, capnp::ReaderOptions(), nullptr));
    CHECK(m == nullptr);
  }
}

namespace {

// Bytes waiting on fd, without blocking.
std::vector<kj::byte> drain(int fd) {
  std::vector<kj::byte> out(1 << 16);
  const ssize_t n = ::recv(fd, out.data(), out.size(), MSG_DONTWAIT);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

}  // namespace

TEST_CASE("a Finish waits for the next message and goes out with it, in order") {
  Fixture f;
  capnp::MallocMessageBuilder finish;
  finish.initRoot<capnp::rpc::Message>().initFinish().setQuestionId(41);
  f.l.wait(f.stream->writeMessage(nullptr, finish.getSegmentsForOutput()));
  capnp::MallocMessageBuilder finish2;
  finish2.initRoot<capnp::rpc::Message>().initFinish().setQuestionId(42);
  f.l.wait(f.stream->writeMessage(nullptr, finish2.getSegmentsForOutput()));
  CHECK(drain(f.fds[1]).empty());  // held back

  capnp::MallocMessageBuilder call;
  call.initRoot<capnp::rpc::Message>().initCall().setQuestionId(43);
  f.l.wait(f.stream->writeMessage(nullptr, call.getSegmentsForOutput()));
  auto got = drain(f.fds[1]);
  std::vector<kj::byte> want;
  for (auto* m : {&finish, &finish2, &call}) {
    auto flat = capnp::messageToFlatArray(*m);
    want.insert(want.end(), flat.asBytes().begin(), flat.asBytes().end());
  }
  CHECK(got == want);
}

TEST_CASE("end() sends a held Finish before ending the stream") {
  Fixture f;
  capnp::MallocMessageBuilder finish;
  finish.initRoot<capnp::rpc::Message>().initFinish().setQuestionId(7);
  auto flat = capnp::messageToFlatArray(finish);
  f.l.wait(f.stream->writeMessage(nullptr, finish.getSegmentsForOutput()));
  f.l.wait(f.stream->end());
  auto got = drain(f.fds[1]);
  CHECK(got == std::vector<kj::byte>(flat.asBytes().begin(), flat.asBytes().end()));
  kj::byte extra;
  CHECK(::recv(f.fds[1], &extra, 1, MSG_DONTWAIT) == 0);  // end of stream
}
