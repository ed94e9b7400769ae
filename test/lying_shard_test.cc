// libpsclient against a shard whose replies are well-formed Cap'n Proto but
// wrong (test/lying_shard.h): each call must fail with a message naming the
// shard and what was wrong, never read or write out of bounds, never report
// what psd did not say.
#include <cstring>

#include <capnp/orphan.h>
#include <capnp/serialize.h>
#include <catch2/catch.hpp>

#include "ps/client.h"
#include "test/lying_shard.h"

using ps::test::LyingShard;

namespace {

// A list of `n` structs that take no room in the message (a list pointer
// and its tag, two words): Cap'n Proto reads each as its defaults.
template <typename T>
capnp::Orphan<capnp::List<T>> empty_elements(capnp::Orphanage orphanage, uint32_t n) {
  const uint64_t raw[2] = {1 | (uint64_t{7} << 32),  // list pointer, inline composite, 0 words
                           uint64_t{n} << 2};        // tag: n elements of 0 data, 0 pointers
  capnp::word words[2];
  std::memcpy(words, raw, sizeof(raw));
  kj::ArrayPtr<const capnp::word> segments[1] = {kj::arrayPtr(words, 2)};
  capnp::ReaderOptions options;
  options.traversalLimitInWords = uint64_t{1} << 40;
  capnp::SegmentArrayMessageReader reader(kj::arrayPtr(segments, 1), options);
  return orphanage.newOrphanCopy(reader.getRoot<capnp::List<T>>());
}

template <typename Builder>
capnp::Orphanage orphanage_of(Builder b) {
  return capnp::Orphanage::getForMessageContaining(b);
}

// Each name's values as 4-float tensors (zeros), at `step`.
void honest_pull(ps::wire::Shard::PullParams::Reader params,
                 ps::wire::Shard::PullResults::Builder results, int64_t step = 3) {
  auto tensors = results.initTensors(params.getNames().size());
  for (unsigned i = 0; i < tensors.size(); ++i) {
    tensors[i].setName(params.getNames()[i]);
    tensors[i].initValues(4 * sizeof(float));
  }
  results.setStep(step);
}

ps::TensorSpec tensor(const std::string& name) { return {.name = name, .shape = {4}}; }

ps::TableSpec table() { return {.name = "emb", .dim = 2, .rows = 100}; }

}  // namespace

namespace ps {

TEST_CASE("lying shard: a push answered with a status list of the wrong length fails", "[lying]") {
  const unsigned statuses = GENERATE(0u, 1u, 3u);
  LyingShard shard({.push = [statuses](auto, auto results) {
    auto list = results.initStatus(statuses);
    for (unsigned i = 0; i < statuses; ++i) list.set(i, wire::PushStatus::STALE);
    results.setStep(1);
  }});
  Client client(shard.options());
  client.declare({tensor("a"), tensor("b")});
  const std::vector<float> g(4, 0.5f);
  auto push = [&] {
    return client.push(std::vector<std::string>{"a", "b"},
                       {std::span<const float>(g), std::span<const float>(g)});
  };
  INFO(statuses << " statuses for 2 gradients");
  REQUIRE_THROWS_MATCHES(
      push(), RequestError,
      Catch::Matchers::Message("push: shard 0 (" + shard.address() + ") replied " +
                               std::to_string(statuses) + " statuses for 2 gradients"));
}

TEST_CASE("lying shard: a pull answered with the wrong byte count fails naming the shard",
          "[lying]") {
  const unsigned bytes = GENERATE(0u, 12u, 20u);
  LyingShard shard({.pull = [bytes](auto params, auto results) {
    honest_pull(params, results);
    results.getTensors()[0].initValues(bytes);
  }});
  Client client(shard.options());
  client.declare({tensor("w")});
  std::vector<float> out(4, 7.0f);
  REQUIRE_THROWS_MATCHES(
      client.pull("w", out), RequestError,
      Catch::Matchers::Message("pull: shard 0 (" + shard.address() + ") replied " +
                               std::to_string(bytes) +
                               " bytes for tensor 'w' of 16 bytes (was it created with another "
                               "shape or chunk size?)"));
}

TEST_CASE("lying shard: a large pull answered with another size fails within its buffer",
          "[lying]") {
  // 128 KiB: sent as a segment of its own, which the client reads straight
  // into the caller's buffer when its size is the one asked for
  // (common/net/client_message_stream.h).
  constexpr uint32_t kFloats = 1u << 15;
  const int extra = GENERATE(0, -8, 8, -4);
  LyingShard shard({.pull = [extra](auto params, auto results) {
    auto tensors = results.initTensors(1);
    tensors[0].setName(params.getNames()[0]);
    auto values = tensors[0].initValues(kFloats * sizeof(float) + extra);
    std::memset(values.begin(), 0x3f, values.size());
    results.setTag(params.getTag());
    results.setStep(1);
  }});
  Client client(shard.options());
  client.declare({{.name = "w", .shape = {kFloats}}});
  std::vector<float> out(kFloats + 4, 5.0f);  // w word-aligned, with guards either side
  const std::span<float> w(out.data() + 2, kFloats);
  INFO(extra << " bytes more than the tensor has");
  if (extra == 0) {
    client.pull("w", w);
    float expected;
    std::memset(&expected, 0x3f, sizeof(expected));
    CHECK(w.front() == expected);
    CHECK(w.back() == expected);
  } else {
    REQUIRE_THROWS_MATCHES(
        client.pull("w", w), RequestError,
        Catch::Matchers::Message("pull: shard 0 (" + shard.address() + ") replied " +
                                 std::to_string(kFloats * sizeof(float) + extra) +
                                 " bytes for tensor 'w' of " +
                                 std::to_string(kFloats * sizeof(float)) +
                                 " bytes (was it created with another shape or chunk size?)"));
  }
  // Nothing was written next to the buffer.
  CHECK(out.front() == 5.0f);
  CHECK(out.back() == 5.0f);
}

TEST_CASE("lying shard: a pull answered with another number of tensors fails naming the shard",
          "[lying]") {
  LyingShard shard({.pull = [](auto params, auto results) {
    auto tensors = results.initTensors(params.getNames().size() + 1);
    for (auto t : tensors) t.initValues(4 * sizeof(float));
  }});
  Client client(shard.options());
  client.declare({tensor("w")});
  std::vector<float> out(4);
  REQUIRE_THROWS_MATCHES(client.pull("w", out), RequestError,
                         Catch::Matchers::Message("pull: shard 0 (" + shard.address() +
                                                  ") replied 2 tensors for 1 asked"));
}

TEST_CASE("lying shard: a step outside [0, 2^62] in a reply fails the call", "[lying]") {
  const int64_t step = GENERATE(int64_t{-7}, std::numeric_limits<int64_t>::max());
  const std::string said =
      "shard 0 (%) replied step " + std::to_string(step) + ", outside [0, 2^62]";
  auto expected = [&](const std::string& call, const LyingShard& shard) {
    std::string m = said;
    m.replace(m.find('%'), 1, shard.address());
    return Catch::Matchers::Message(call + ": " + m);
  };
  SECTION("pull") {
    LyingShard shard(
        {.pull = [step](auto params, auto results) { honest_pull(params, results, step); }});
    Client client(shard.options());
    client.declare({tensor("w")});
    std::vector<float> out(4);
    REQUIRE_THROWS_MATCHES(client.pull(std::vector<std::string>{"w"}, {std::span<float>(out)}),
                           RequestError, expected("pull", shard));
  }
  SECTION("push") {
    LyingShard shard({.push = [step](auto params, auto results) {
      results.initStatus(params.getGrads().size());
      results.setStep(step);
    }});
    Client client(shard.options());
    client.declare({tensor("w")});
    const std::vector<float> g(4, 0.5f);
    REQUIRE_THROWS_MATCHES(client.push(std::vector<std::string>{"w"}, {std::span<const float>(g)}),
                           RequestError, expected("push", shard));
  }
  SECTION("stepDone") {
    LyingShard shard({.step_done = [step](auto, auto results) { results.setGlobalStep(step); }});
    Client client(shard.options());
    REQUIRE_THROWS_MATCHES(client.step_done(0), RequestError, expected("stepDone", shard));
  }
  SECTION("pullRows") {
    LyingShard shard({.pull_rows = [step](auto params, auto results) {
      results.initRows(params.getIds().size() * 2 * sizeof(float));
      results.setStep(step);
    }});
    Client client(shard.options());
    client.declare_tables({table()});
    const std::vector<int64_t> ids{1, 2, 3};
    std::vector<float> out(6);
    REQUIRE_THROWS_MATCHES(client.pull_rows("emb", ids, out), RequestError,
                           expected("pull_rows", shard));
  }
  SECTION("pushRows") {
    LyingShard shard({.push_rows = [step](auto, auto results) { results.setStep(step); }});
    ClientOptions options = shard.options();
    options.worker_index = 0;
    Client client(options);
    client.declare_tables({table()});
    const std::vector<int64_t> ids{1, 2};
    const std::vector<float> g(4, 0.5f);
    REQUIRE_THROWS_MATCHES(client.push_and_step({}, {}, {{"emb", ids, g}}, 0, 0), RequestError,
                           expected("push_and_step", shard));
  }
}

TEST_CASE("lying shard: pull_rows answered with the wrong byte count fails naming the shard",
          "[lying]") {
  LyingShard shard({.pull_rows = [](auto params, auto results) {
    results.initRows(params.getIds().size() * 2 * sizeof(float) - 4);
    results.setStep(1);
  }});
  Client client(shard.options());
  client.declare_tables({table()});
  const std::vector<int64_t> ids{5, 6, 5};
  std::vector<float> out(6);
  REQUIRE_THROWS_MATCHES(
      client.pull_rows("emb", ids, out), RequestError,
      Catch::Matchers::Message("pull_rows: shard 0 (" + shard.address() +
                               ") replied 12 bytes for 2 rows of table 'emb', expected 16"));
}

TEST_CASE("lying shard: lists of elements that take no room in the reply are refused", "[lying]") {
  constexpr uint32_t kClaimed = 1u << 20;
  auto refusal = [](const std::string& call, const LyingShard& shard, const std::string& what) {
    return Catch::Matchers::Message(call + ": shard 0 (" + shard.address() +
                                    ") replied a list of " + std::to_string(kClaimed) + " " + what +
                                    " that takes 1 words of its message (each takes at least one)");
  };
  SECTION("list") {
    LyingShard shard({.list = [](auto results) {
      results.adoptTensors(empty_elements<wire::TensorMeta>(orphanage_of(results), kClaimed));
    }});
    Client client(shard.options());
    REQUIRE_THROWS_MATCHES(client.list(), RequestError, refusal("list", shard, "tensors"));
  }
  SECTION("stats") {
    LyingShard shard({.stats = [](auto results) {
      auto stats = results.initStats();
      stats.adoptWorkers(empty_elements<wire::WorkerState>(orphanage_of(results), kClaimed));
    }});
    Client client(shard.options());
    REQUIRE_THROWS_MATCHES(client.stats(), RequestError, refusal("stats", shard, "workers"));
  }
  SECTION("listTables") {
    LyingShard shard({.list_tables = [](auto results) {
      results.adoptTables(empty_elements<wire::TableMeta>(orphanage_of(results), kClaimed));
    }});
    Client client(shard.options());
    REQUIRE_THROWS_MATCHES(client.list_tables(), RequestError,
                           refusal("listTables", shard, "tables"));
  }
}

TEST_CASE("lying shard: a list with real elements still reads", "[lying]") {
  LyingShard shard({.stats = [](auto results) {
    auto workers = results.initStats().initWorkers(2);
    workers[1].setWorkerIndex(1);
    workers[1].setStep(9);
  }});
  Client client(shard.options());
  const auto stats = client.stats();
  REQUIRE(stats.size() == 1);
  REQUIRE(stats[0].workers.size() == 2);
  CHECK(stats[0].workers[1].step == 9);
}

TEST_CASE("lying shard: a hello this client cannot go on with fails the connection", "[lying]") {
  struct Case {
    std::function<void(wire::ShardInfo::Builder)> lie;
    std::string said;
  };
  const auto c = GENERATE(
      Case{[](auto info) { info.setProtocolVersion(wire::K_PROTOCOL_VERSION + 1); },
           "speaks protocol version " + std::to_string(wire::K_PROTOCOL_VERSION + 1) +
               ", this client " + std::to_string(wire::K_PROTOCOL_VERSION)},
      Case{[](auto info) { info.setGlobalStep(-3); }, "said global step -3, outside [0, 2^62]"},
      Case{[](auto info) { info.setWorkerStep(-2); },
           "said this worker's step was -2, outside [0, 2^62]"});
  LyingShard shard({.hello = c.lie});
  try {
    Client client(shard.options());
    FAIL("connected to a shard whose hello " << c.said);
  } catch (const ConnectionError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("psd at " + shard.address() + " " + c.said));
  }
}

}  // namespace ps
