// libpsclient against real psd processes on loopback ports.
// One test program per area: its cases share the helpers at its top;
// splitting it would duplicate them.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include <capnp/ez-rpc.h>
#include <kj/async-io.h>

#include "schema/ps.capnp.h"
#include "ps/client.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;

namespace {

ClientOptions options_for(std::initializer_list<const PsdProcess*> shards) {
  ClientOptions o;
  for (auto* s : shards) o.ps_hosts.push_back(s->address());
  return o;
}

TensorSpec sgd_tensor(std::string name, std::vector<uint64_t> shape, InitConfig init = {},
                      float lr = 1.0f) {
  return TensorSpec{.name = std::move(name),
                    .shape = std::move(shape),
                    .optimizer = OptimizerConfig::sgd(lr),
                    .init = std::move(init)};
}

// A raw Cap'n Proto connection, to send what libpsclient would refuse to;
// a client (worker index -1) unless told a worker's index.
struct RawClient {
  explicit RawClient(const PsdProcess& psd, int32_t worker_index = -1)
      : rpc(psd.address()), shard(rpc.getMain<wire::Shard>()) {
    auto req = shard.helloRequest();
    req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
    req.setWorkerIndex(worker_index);
    req.send().wait(ws());
  }
  capnp::EzRpcClient rpc;
  wire::Shard::Client shard;
  kj::WaitScope& ws() { return rpc.getWaitScope(); }

  void push_bytes(const std::string& name, const std::vector<uint8_t>& bytes) {
    auto req = shard.pushRequest();
    auto g = req.initGrads(1);
    g[0].setName(name);
    g[0].setValues(kj::arrayPtr(bytes.data(), bytes.size()));
    req.send().wait(ws());
  }
};

std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// An async job on one psd with an SGD tensor "w" of two zeros: its chief,
// and a raw connection as worker 1 to send step reports by hand.
struct AsyncJobWithRawWorker {
  AsyncJobWithRawWorker(const PsdProcess& psd, int64_t train_steps)
      : chief(chief_options(psd)), worker(psd, 1) {
    chief.create({sgd_tensor("w", {2})});
    chief.init_job({.mode = SyncMode::kAsync, .train_steps = train_steps});
    chief.set_ready();
  }
  static ClientOptions chief_options(const PsdProcess& psd) {
    ClientOptions o = options_for({&psd});
    o.worker_index = 0;
    o.is_chief = true;
    return o;
  }
  Client chief;
  RawClient worker;
};

}  // namespace

TEST_CASE("push then pull gives exactly the SGD result") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  client.create(
      {sgd_tensor("w", {2, 2}, InitConfig::from_values({1, 2, 3, 4}), 0.5f), sgd_tensor("b", {2})});
  CHECK(client.pull("w") == std::vector<float>{1, 2, 3, 4});
  CHECK(client.pull("b") == std::vector<float>{0, 0});
  CHECK(client.push("w", std::vector<float>{2, 2, -2, 4}) == PushStatus::kApplied);
  CHECK(client.pull("w") == std::vector<float>{0, 1, 4, 2});

  // A second create with the same shape keeps the values.
  client.create({sgd_tensor("w", {2, 2}, InitConfig::constant(7))});
  CHECK(client.pull("w") == std::vector<float>{0, 1, 4, 2});
  auto infos = client.list();
  REQUIRE(infos.size() == 2);
  CHECK(infos[1].name == "w");
  CHECK(infos[1].version == 1);
  CHECK(infos[1].shape == std::vector<uint64_t>{2, 2});
}

TEST_CASE("a waiting call ends when ClientOptions::interrupted says so") {
  PsdProcess psd;
  ClientOptions o = options_for({&psd});
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> asked{0};
  o.interrupted = [&] {
    ++asked;
    return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(500);
  };
  Client client(o);
  CHECK_THROWS_AS(client.barrier("never", 2, std::chrono::seconds(30)), InterruptedError);
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited < std::chrono::seconds(3));
  CHECK(asked >= 3);  // every 100 ms while it waited
  // A call that does not wait is not interrupted, and the Client goes on.
  client.create({{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  client.push("w", std::vector<float>{1, 2});
  CHECK(client.pull("w") == std::vector<float>{-1, -2});
}

TEST_CASE("concurrent pushes from threads sum exactly") {
  PsdProcess psd;
  const int threads = 4, pushes = 100, n = 1000;
  {
    Client setup(options_for({&psd}));
    setup.create({sgd_tensor("acc", {n})});
  }
  SECTION("one client per thread") {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        Client c(options_for({&psd}));
        c.declare({sgd_tensor("acc", {n})});
        std::vector<float> g(n, float(t + 1));
        for (int i = 0; i < pushes; ++i) c.push("acc", g);
      });
    }
    for (auto& w : workers) w.join();
  }
  SECTION("one client shared by all threads, with futures") {
    Client shared(options_for({&psd}));
    shared.declare({sgd_tensor("acc", {n})});
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::vector<float> g(n, float(t + 1));
        for (int i = 0; i < pushes; i += 4) {
          std::vector<std::future<PushResult>> inflight;
          for (int k = 0; k < 4; ++k)
            inflight.push_back(shared.push_async({"acc"}, {std::span<const float>(g)}));
          for (auto& f : inflight) f.get();
        }
      });
    }
    for (auto& w : workers) w.join();
  }
  Client check(options_for({&psd}));
  check.declare({sgd_tensor("acc", {n})});
  const float expected = -float(pushes * (1 + 2 + 3 + 4));
  auto v = check.pull("acc");
  CHECK(std::count(v.begin(), v.end(), expected) == n);
  CHECK(check.stats()[0].pushes == uint64_t(threads * pushes));
}

TEST_CASE("polling or sleeping, on either side, changes no result") {
  // Everything else here runs at the defaults (both sides poll): this is
  // where each side also sleeps at once, and polls long.
  const auto [psd_us, client_us] =
      GENERATE(std::pair{0, 0}, std::pair{200, 200}, std::pair{0, 200}, std::pair{200, 0});
  CAPTURE(psd_us, client_us);
  PsdProcess psd({"--busy_poll_us", std::to_string(psd_us)});
  ClientOptions o = options_for({&psd});
  o.busy_poll = std::chrono::microseconds(client_us);
  const int threads = 3, pushes = 60, n = 300000;  // 1.2 MB: more than one part
  Client shared(o);
  shared.create({sgd_tensor("acc", {n}), sgd_tensor("small", {4})});
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<float> g(n, float(t + 1));
      for (int i = 0; i < pushes; i += 3) {
        std::vector<std::future<PushResult>> inflight;
        for (int k = 0; k < 3; ++k)
          inflight.push_back(shared.push_async({"acc"}, {std::span<const float>(g)}));
        for (auto& f : inflight) f.get();
        shared.push("small", std::vector<float>{1, 1, 1, 1});
      }
    });
  }
  for (auto& w : workers) w.join();
  auto v = shared.pull("acc");
  CHECK(std::count(v.begin(), v.end(), -float(pushes * (1 + 2 + 3))) == n);
  CHECK(shared.pull("small") == std::vector<float>(4, -float(threads * pushes / 3)));
}

TEST_CASE("pulls racing pushes never see a half-updated tensor") {
  // psd sends large tensors from their own memory; an update while a reply
  // is on its way must go to a copy. Every push adds 1 to every element, so
  // any pulled part must be uniform: a mix would be a torn read.
  PsdProcess psd;
  // 64 KiB (its replies read in one system call after the first,
  // client_message_stream.h), 1 MiB (applied on the loop), 4 MiB (on the pool).
  const uint64_t n = GENERATE(uint64_t{1} << 14, uint64_t{1} << 18, uint64_t{1} << 20);
  ClientOptions o = options_for({&psd});
  o.part_bytes = n * sizeof(float);
  {
    Client setup(o);
    setup.create({sgd_tensor("w", {n})});
  }
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    Client c(o);
    c.declare({sgd_tensor("w", {n})});
    std::vector<float> g(n, -1.0f);
    for (int i = 0; i < 60 && !stop; ++i) c.push("w", g);
    stop = true;
  });
  Client reader(o);
  reader.declare({sgd_tensor("w", {n})});
  std::vector<float> v(n);
  int pulls = 0, torn = 0;
  float last = 0.0f;
  bool monotonic = true;
  while (!stop || pulls < 5) {
    reader.pull("w", v);
    ++pulls;
    if (std::count(v.begin(), v.end(), v[0]) != static_cast<std::ptrdiff_t>(n)) ++torn;
    monotonic = monotonic && v[0] >= last;
    last = v[0];
  }
  pusher.join();
  CHECK(torn == 0);
  CHECK(monotonic);
  reader.pull("w", v);
  CHECK(std::count(v.begin(), v.end(), 60.0f) == static_cast<std::ptrdiff_t>(n));
}

TEST_CASE("pushes from several processes sum exactly") {
  PsdProcess psd;
  CHECK(ps::test::run_push_workers(psd.address(), 3, 200) == 3);
  Client c(options_for({&psd}));
  c.declare({sgd_tensor("shared", {4096})});
  auto v = c.pull("shared");
  CHECK(std::count(v.begin(), v.end(), -1200.0f) == 4096);  // 200 * (1 + 2 + 3)
}

TEST_CASE("a tensor split over 3 shards round-trips bit-exactly") {
  PsdProcess a, b, c;
  ClientOptions o = options_for({&a, &b, &c});
  o.chunk_bytes = 64 << 10;  // 16384 floats per part
  Client client(o);
  const std::size_t n = 100'003;  // 7 parts, the last one short
  std::mt19937 rng(1);
  std::vector<float> init(n);
  for (auto& x : init) {
    uint32_t bits = rng();
    std::memcpy(&x, &bits, 4);
    if (!std::isfinite(x)) x = -0.0f;
  }
  init[5] = std::numeric_limits<float>::denorm_min();
  client.create({sgd_tensor("emb", {n}, InitConfig::from_values(init)), sgd_tensor("small", {3})});
  std::vector<float> out(n);
  client.pull("emb", out);
  CHECK(std::memcmp(out.data(), init.data(), n * 4) == 0);

  auto parts = client.placement().parts_of("emb");
  CHECK(parts.size() == 7);
  auto infos = client.list();
  REQUIRE(infos.size() == 2);
  CHECK(infos[0].name == "emb");
  CHECK(infos[0].shards == std::vector<int>{0, 1, 2});
  auto stats = client.stats();
  CHECK(stats[0].tensors + stats[1].tensors + stats[2].tensors == 8);

  std::vector<float> g(n), expected(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = float(int(rng() % 2001) - 1000) / 64.0f;
    expected[i] = init[i] - 1.0f * g[i];
  }
  client.push("emb", g);
  client.pull("emb", out);
  CHECK(std::memcmp(out.data(), expected.data(), n * 4) == 0);
}

TEST_CASE("a create placed otherwise than the tensors' creator's is refused, creating nothing") {
  // Created a second time where this client places them, the copies
  // trained apart: one worker's pushes never reached the other's pulls.
  PsdProcess a, b;
  ClientOptions first = options_for({&a, &b});
  first.chunk_bytes = 1u << 20;
  first.part_bytes = 256u << 10;
  Client creator(first);
  const std::size_t n = 512 * 1024;  // two chunks of four parts
  creator.create({sgd_tensor("big", {1000}), sgd_tensor("x", {10}), sgd_tensor("y", {10}),
                  sgd_tensor("w", {n})});
  const uint64_t tensors = creator.stats()[0].tensors + creator.stats()[1].tensors;

  SECTION("another chunk size") {
    ClientOptions o = first;
    o.chunk_bytes = 2u << 20;  // all of "w" on one shard
    Client other(o);
    CHECK_THROWS_AS(other.create({sgd_tensor("w", {n})}), ConfigError);
    CHECK_THROWS_WITH(other.create({sgd_tensor("w", {n})}),
                      Catch::Contains("'w/part_0' on shard 1") && Catch::Contains("chunk_bytes"));
  }
  SECTION("another placement policy") {
    ClientOptions o = first;
    o.placement = PlacementPolicy::kGreedyBytes;
    Client other(o);
    CHECK_THROWS_WITH(other.create({sgd_tensor("big", {1000}), sgd_tensor("x", {10}),
                                    sgd_tensor("y", {10})}),
                      Catch::Contains("'y' on shard 0"));
    // The refused create left the placement as it was.
    CHECK_FALSE(other.placement().contains("big"));
  }
  SECTION("another part size, a tensor stored whole elsewhere") {
    ClientOptions o = first;
    o.chunk_bytes = 4096;
    o.part_bytes = 2048;  // "big" in two parts
    Client other(o);
    CHECK_THROWS_WITH(other.create({sgd_tensor("big", {1000}), sgd_tensor("x", {10}),
                                    sgd_tensor("y", {10})}),
                      Catch::Contains("'big' exists as 'big' on shard 0"));
  }
  SECTION("the same options: an idempotent create") {
    Client other(first);
    other.create({sgd_tensor("big", {1000}), sgd_tensor("x", {10}), sgd_tensor("y", {10}),
                  sgd_tensor("w", {n})});
    other.push("y", std::vector<float>(10, 1.0f));
    CHECK(creator.pull("y") == std::vector<float>(10, -1.0f));
  }
  CHECK(creator.stats()[0].tensors + creator.stats()[1].tensors == tensors);
}

TEST_CASE("a NaN or Inf anywhere in a push that goes out as several requests refuses all of it") {
  // psd checks each request whole; the client checks a push it splits.
  const std::size_t n = 100'003;  // 7 parts of 64 KiB over 3 shards
  std::vector<float> init(n);
  for (std::size_t i = 0; i < n; ++i) init[i] = float(i % 977) / 8.0f;
  std::vector<float> out(n);

  SECTION("parts over three shards, and a batch of tensors") {
    PsdProcess a, b, c;
    ClientOptions o = options_for({&a, &b, &c});
    o.chunk_bytes = 64 << 10;
    Client client(o);
    client.create({sgd_tensor("emb", {n}, InitConfig::from_values(init)),
                   sgd_tensor("w", {2}, InitConfig::from_values({1, 2}))});
    for (std::size_t bad : {n - 1, std::size_t{0}, std::size_t{40'000}}) {
      std::vector<float> g(n, 0.5f);
      g[bad] = bad == 0 ? INFINITY : NAN;
      CHECK_THROWS_WITH(client.push("emb", g),
                        Catch::Contains("gradient for 'emb' contains NaN or Inf"));
      CHECK_THROWS_WITH(client.push({"w", "emb"}, {std::vector<float>{1, 1}, g}),
                        Catch::Contains("NaN or Inf"));
      CHECK_THROWS_WITH(client.push_async({"emb"}, {g}).get(), Catch::Contains("NaN or Inf"));
      client.pull("emb", out);
      CHECK(std::memcmp(out.data(), init.data(), n * 4) == 0);
      CHECK(client.pull("w") == std::vector<float>{1, 2});
    }
    std::vector<float> g(n, 0.5f);  // a clean one still goes through
    client.push("emb", g);
    client.pull("emb", out);
    CHECK(out[n - 1] == init[n - 1] - 0.5f);
  }
  SECTION("one shard, more than one request's worth") {
    PsdProcess psd;
    ClientOptions o = options_for({&psd});
    o.chunk_bytes = 64 << 10;
    o.max_request_bytes = 128 << 10;
    Client client(o);
    client.create({sgd_tensor("emb", {n}, InitConfig::from_values(init))});
    std::vector<float> g(n, 0.5f);
    g[n - 2] = -INFINITY;
    CHECK_THROWS_WITH(client.push("emb", g), Catch::Contains("NaN or Inf"));
    client.pull("emb", out);
    CHECK(std::memcmp(out.data(), init.data(), n * 4) == 0);
    // Without the client's check, psd refuses only the request with the
    // bad value: what the check is for.
    o.check_split_pushes = false;
    Client unchecked(o);
    unchecked.declare({sgd_tensor("emb", {n})});
    CHECK_THROWS_WITH(unchecked.push("emb", g), Catch::Contains("NaN or Inf"));
    unchecked.pull("emb", out);
    CHECK(out[0] == init[0] - 0.5f);
    CHECK(out[n - 2] == init[n - 2]);
  }
  SECTION("psds that accept them (--allow_nonfinite) get them") {
    PsdProcess a({"--allow_nonfinite"}), b({"--allow_nonfinite"});
    ClientOptions o = options_for({&a, &b});
    o.chunk_bytes = 64 << 10;
    Client client(o);
    client.create({sgd_tensor("emb", {n}, InitConfig::from_values(init))});
    std::vector<float> g(n, 0.0f);
    g[n - 1] = NAN;
    client.push("emb", g);
    client.pull("emb", out);
    CHECK(std::isnan(out[n - 1]));
    CHECK(std::memcmp(out.data(), init.data(), (n - 1) * 4) == 0);
  }
  SECTION("a push that reports a step to the shards it has no gradient for") {
    PsdProcess a, b;
    ClientOptions o = options_for({&a, &b});
    o.worker_index = 0;
    Client client(o);
    client.create({sgd_tensor("a", {4})});  // on shard 0 alone
    const std::vector<float> bad = {1, 2, NAN, 4};
    CHECK_THROWS_WITH(client.push_and_step({"a"}, {std::span<const float>(bad)}, 0, 0),
                      Catch::Contains("NaN or Inf"));
    // Shard 1 got no stepDone either: its global step did not move.
    for (const auto& st : client.stats()) CHECK(st.global_step == 0);
    CHECK(client.pull("a") == std::vector<float>(4, 0.0f));
  }
}

TEST_CASE("a create refused anywhere creates nothing anywhere") {
  auto names_on = [](Client& c) {
    std::vector<std::string> out;
    for (const auto& t : c.list()) out.push_back(t.name);
    return out;
  };
  SECTION("a shape clash on one shard of two") {
    PsdProcess a, b;
    Client one(options_for({&a, &b}));
    one.create({sgd_tensor("p", {2}), sgd_tensor("q", {2})});
    Client two(options_for({&a, &b}));
    // x goes to shard 0, q (with another shape) to shard 1, which refuses it.
    CHECK_THROWS_WITH(two.create({sgd_tensor("x", {3}), sgd_tensor("q", {5})}),
                      Catch::Contains("exists with shape [2]"));
    CHECK(names_on(one) == std::vector<std::string>{"p", "q"});
  }
  SECTION("tensors that fit psd's memory limit one by one, not together, in one request") {
    PsdProcess psd({"--max_memory_mb", "1"});
    ClientOptions o = options_for({&psd});
    o.max_request_bytes = 4 << 20;
    Client client(o);
    CHECK_THROWS_WITH(client.create({sgd_tensor("u", {150'000}), sgd_tensor("v", {150'000})}),
                      Catch::Contains("memory limit"));
    CHECK(names_on(client).empty());
    client.create({sgd_tensor("u", {150'000})});  // each alone fits
    CHECK(names_on(client) == std::vector<std::string>{"u"});
  }
  SECTION(
      "tensors that fit psd's memory limit one by one, not together, over several requests to one "
      "shard") {
    PsdProcess psd({"--max_memory_mb", "1"});
    Client client(options_for({&psd}));  // 1 MiB requests: one tensor each
    CHECK_THROWS_WITH(client.create({sgd_tensor("u", {150'000}), sgd_tensor("v", {150'000})}),
                      Catch::Contains("memory limit"));
    CHECK(names_on(client).empty());
  }
  SECTION("values the checking round leaves out are checked by the client") {
    PsdProcess psd;
    ClientOptions o = options_for({&psd});
    o.max_request_bytes = 64 << 10;
    Client client(o);
    std::vector<float> good(12'000, 0.5f), bad(12'000, 0.5f);
    bad.back() = NAN;
    auto valued = [](std::string name, std::vector<float> v) {
      const uint64_t n = v.size();
      return sgd_tensor(std::move(name), {n}, InitConfig::from_values(std::move(v)));
    };
    CHECK_THROWS_WITH(client.create({valued("u", good), valued("v", bad)}),
                      Catch::Contains("NaN or Inf initial value"));
    TensorSpec restored = valued("r", good);
    restored.optimizer = OptimizerConfig::adam(0.1f);
    restored.slots = {good, bad};
    CHECK_THROWS_WITH(client.create({valued("u", good), restored}),
                      Catch::Contains("NaN or Inf restored slot"));
    restored.slots = {good};  // Adam keeps two
    CHECK_THROWS_WITH(client.create({valued("u", good), restored}),
                      Catch::Contains("restored with 1 optimizer slots"));
    CHECK(names_on(client).empty());
    // And what passes arrives whole, values and slots, after the check.
    std::vector<float> ramp(12'000);
    for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<float>(i);
    restored.slots = {ramp, good};
    client.create({valued("u", ramp), restored});
    CHECK(names_on(client) == std::vector<std::string>{"r", "u"});
    CHECK(client.pull("u") == ramp);
    CHECK(client.pull("r") == good);
  }
  SECTION(
      "restored tensors: requests are cut by their values and slots, and a part too big for psd is "
      "refused first") {
    PsdProcess psd({"--max_message_mb", "2"});
    Client client(options_for({&psd}));
    auto restored = [](std::string name, std::size_t n, float x) {
      TensorSpec t =
          sgd_tensor(std::move(name), {n}, InitConfig::from_values(std::vector<float>(n, x)));
      t.optimizer = OptimizerConfig::adam(0.1f);
      t.slots = {std::vector<float>(n, 0.5f), std::vector<float>(n, 0.25f)};
      return t;
    };
    // 1.2 MB each with values and slots: together (they were one request,
    // by their values alone) over psd's 2 MiB, so psd dropped the connection.
    client.create({restored("a", 100'000, 1.0f), restored("b", 100'000, 2.0f)});
    CHECK(client.pull("a") == std::vector<float>(100'000, 1.0f));
    CHECK(client.pull("b") == std::vector<float>(100'000, 2.0f));
    // A 1 MiB part with two slots cannot go in one message of 2 MiB: refused
    // before anything is sent (before: "Broken pipe", the small one created).
    CHECK_THROWS_WITH(
        client.create({restored("small", 1000, 1.0f), restored("big", 1 << 20, 1.0f)}),
        Catch::Contains("more than psd accepts in one message"));
    CHECK(names_on(client) == std::vector<std::string>{"a", "b"});
  }
  SECTION("the client forgets what it declared for a refused create") {
    PsdProcess a, b;
    Client other(options_for({&a, &b}));
    other.create({sgd_tensor("x", {8}, InitConfig::constant(2))});
    Client client(options_for({&a, &b}));
    CHECK_THROWS_WITH(client.create({sgd_tensor("x", {4})}),
                      Catch::Contains("exists with shape [8]"));
    // x is declarable as psd has it, and the next tensor lands where it
    // does for a client that never declared the refused one.
    client.declare({sgd_tensor("x", {8})});
    CHECK(client.pull("x") == std::vector<float>(8, 2.0f));
    client.declare({sgd_tensor("y", {2})});
    Client fresh(options_for({&a, &b}));
    fresh.declare({sgd_tensor("x", {8}), sgd_tensor("y", {2})});
    CHECK(client.placement().at("y").parts[0].shard == fresh.placement().at("y").parts[0].shard);
  }
  SECTION(
      "a shard's share too large for one check request is checked in several, and still as a "
      "whole") {
    // 2 x 3072 parts of 4 KiB: the check of one shard's share passed psd's
    // 1 MiB message limit (the connection broke, the create retried for
    // good). Each tensor fits --max_memory_mb alone, not both together.
    PsdProcess psd({"--max_message_mb", "1", "--max_memory_mb", "20"});
    ClientOptions o = options_for({&psd});
    o.part_bytes = 4096;
    o.chunk_bytes = 16 << 20;
    Client client(o);
    CHECK_THROWS_WITH(client.create({sgd_tensor("a", {3u << 20}), sgd_tensor("b", {3u << 20})}),
                      Catch::Contains("memory limit"));
    CHECK(names_on(client).empty());
    client.create({sgd_tensor("a", {3u << 20})});
    CHECK(names_on(client) == std::vector<std::string>{"a"});
    CHECK(client.pull("a") == std::vector<float>(3u << 20, 0.0f));
  }
  SECTION("long names are counted in a request's size") {
    // 4000 one-float tensors with 500-character names went as requests
    // over a 2 MiB limit (a broken connection), and their pull's reply too.
    PsdProcess psd({"--max_message_mb", "2"});
    ClientOptions o = options_for({&psd});
    o.max_request_bytes = 2 << 20;
    Client client(o);
    std::vector<TensorSpec> specs;
    std::vector<std::string> names;
    for (int i = 0; i < 4000; ++i) {
      std::string name = std::to_string(i);
      name.insert(0, 500 - name.size(), 'n');
      names.push_back(name);
      specs.push_back(sgd_tensor(name, {1}, InitConfig::constant(static_cast<float>(i))));
    }
    client.create(specs);
    std::vector<std::vector<float>> values(4000, std::vector<float>(1));
    std::vector<std::span<float>> out(values.begin(), values.end());
    client.pull(names, out);
    CHECK(values[3999][0] == 3999.0f);
    CHECK(psd.alive());
  }
  SECTION("the checking round does not count against --max_tensors_per_client") {
    PsdProcess psd({"--max_tensors_per_client", "2"});
    ClientOptions o = options_for({&psd});
    o.max_request_bytes = 64 << 10;
    Client client(o);
    client.create({sgd_tensor("u", {12'000}), sgd_tensor("v", {12'000})});  // two requests
    CHECK(names_on(client) == std::vector<std::string>{"u", "v"});
  }
}

TEST_CASE(
    "a create that fails in one thread leaves another thread's create of the same tensor "
    "standing") {
  // Thread A creates {x, y} and psd refuses y (another shape there); thread
  // B creates {x} at the same time and succeeds. A's failure must not take x
  // back out of the Client's placement: B uses the tensor it has just
  // created.
  PsdProcess psd;
  Client other(options_for({&psd}));
  Client client(options_for({&psd}));
  int unusable = 0;
  for (int i = 0; i < 100; ++i) {
    // (Not "x" + to_string(i): GCC 12 warns -Wrestrict on it, wrongly.)
    std::string x = std::to_string(i), y = x;
    x.insert(x.begin(), 'x');
    y.insert(y.begin(), 'y');
    other.create({sgd_tensor(y, {3})});
    std::atomic<int> ready{0};
    auto together = [&] {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
    };
    std::string a_error;  // Catch's assertions are for the test's own thread
    std::thread a([&] {
      together();
      try {
        client.create({sgd_tensor(x, {2}), sgd_tensor(y, {2})});
      } catch (const RequestError& e) {
        a_error = e.what();
      }
    });
    together();
    client.create({sgd_tensor(x, {2})});
    a.join();
    CHECK_THAT(a_error, Catch::Contains("exists with shape"));
    try {
      client.pull(x);
    } catch (const ConfigError&) {
      ++unusable;
    }
  }
  CHECK(unusable == 0);
}

TEST_CASE(
    "ps hosts listed in another order than the psds were started with, or a shard back as another, "
    "are refused") {
  PsdProcess a({"--shard_index", "0", "--num_shards", "2"}),
      b({"--shard_index", "1", "--num_shards", "2"});
  {
    Client client(options_for({&a, &b}));  // the order they were started with
    client.create({sgd_tensor("w", {4}, InitConfig::constant(1.0f)),
                   sgd_tensor("v", {4}, InitConfig::constant(2.0f))});
  }
  auto refused = [](ClientOptions o, const std::string& why) {
    CAPTURE(why);
    try {
      Client client(std::move(o));
      FAIL("the client was not refused");
    } catch (const ConfigError& e) {
      CHECK_THAT(std::string(e.what()),
                 Catch::Contains("ps hosts out of order") && Catch::Contains(why));
    }
  };
  refused(options_for({&b, &a}), "is shard 1 of 2");
  refused(options_for({&b}), "lists 1 hosts with it at position 0");
  PsdProcess standalone;
  refused(options_for({&a, &b, &standalone}), "lists 3 hosts");
  // Nothing was created or changed by the refused clients.
  Client client(options_for({&a, &b}));
  CHECK(client.stats()[0].tensors + client.stats()[1].tensors == 2);
  client.create({sgd_tensor("w", {4}, InitConfig::constant(9.0f)),
                 sgd_tensor("v", {4}, InitConfig::constant(9.0f))});
  CHECK(client.pull("w") == std::vector<float>{1, 1, 1, 1});
  CHECK(client.pull("v") == std::vector<float>{2, 2, 2, 2});

  // psds started without a place (neither --shard_index nor --task_index)
  // cannot tell: any order is taken, as before.
  PsdProcess c, d;
  CHECK_NOTHROW(Client(options_for({&d, &c})));

  // A shard that comes back as another one (restarted with other flags) is
  // not taken either: calls that need it fail and say why.
  const int port = b.port();
  b.kill();
  PsdProcess wrong({"--shard_index", "0", "--num_shards", "2"}, port);
  CHECK_THROWS_WITH(client.pull("v"),
                    Catch::Contains("ps hosts out of order") && Catch::Contains("is shard 0 of 2"));
  CHECK(client.pull("w") == std::vector<float>{1, 1, 1, 1});  // shard 0 is still served
}

TEST_CASE("a psd on this host is reached over its Unix socket, with the same values as over TCP") {
  ps::test::TempDir dir;
  const std::string sock = dir.path() + "/psd.sock";
  PsdProcess psd({"--unix_socket", sock});
  Client local(options_for({&psd}));
  CHECK(local.connection_addresses() == std::vector<std::string>{"unix:" + sock});
  ClientOptions tcp_options = options_for({&psd});
  tcp_options.prefer_unix_socket = false;
  Client tcp(tcp_options);
  CHECK(tcp.connection_addresses() == std::vector<std::string>{psd.address()});

  const std::size_t n = 3 * (1 << 18) + 5;  // 3 MiB and a bit: four parts
  std::mt19937 rng(3);
  std::vector<float> init(n), g(n), expected(n);
  for (std::size_t i = 0; i < n; ++i) {
    init[i] = float(int(rng() % 2001) - 1000) / 32.0f;
    g[i] = float(int(rng() % 2001) - 1000) / 64.0f;
    expected[i] = init[i] - g[i];
  }
  local.create({sgd_tensor("big", {n}, InitConfig::from_values(init))});
  tcp.create({sgd_tensor("big", {n})});  // declares it here too; the values stay
  std::vector<float> via_tcp(n), via_unix(n);
  tcp.pull("big", via_tcp);
  CHECK(std::memcmp(via_tcp.data(), init.data(), n * 4) == 0);
  local.push("big", g);
  tcp.pull("big", via_tcp);
  local.pull("big", via_unix);
  CHECK(std::memcmp(via_tcp.data(), expected.data(), n * 4) == 0);
  CHECK(std::memcmp(via_unix.data(), expected.data(), n * 4) == 0);
  // The probe that found the socket is not a worker: a chief still gets in.
  ClientOptions chief = options_for({&psd});
  chief.is_chief = true;
  chief.worker_index = 0;
  Client c(chief);
  CHECK(c.connection_addresses() == std::vector<std::string>{"unix:" + sock});
}

TEST_CASE("a Unix socket the client cannot reach leaves it on TCP") {
  ps::test::TempDir dir;
  const std::string sock = dir.path() + "/psd.sock";
  PsdProcess psd({"--unix_socket", sock});
  std::filesystem::remove(sock);  // psd still advertises it; nobody can connect to it by name
  Client client(options_for({&psd}));
  CHECK(client.connection_addresses() == std::vector<std::string>{psd.address()});
  client.create({sgd_tensor("w", {2}, InitConfig::from_values({1, 2}))});
  client.push("w", std::vector<float>{1, 1});
  CHECK(client.pull("w") == std::vector<float>{0, 1});
}

TEST_CASE(
    "a retried push that reports a step is answered with the job's step and stop, not applied "
    "again") {
  PsdProcess psd;
  AsyncJobWithRawWorker job(psd, 1);
  Client& chief = job.chief;
  RawClient& worker = job.worker;
  const auto grad = float_bytes({1, 1});
  auto send = [&] {
    auto req = worker.shard.pushRequest();
    req.setRequestId(42);
    req.setDoneStep(0);
    auto g = req.initGrads(1);
    g[0].setName("w");
    g[0].setValues(kj::arrayPtr(grad.data(), grad.size()));
    auto reply = req.send().wait(worker.ws());
    return std::pair<int64_t, bool>(reply.getStep(), reply.getStop());
  };
  CHECK(send() ==
        std::pair<int64_t, bool>(1, true));  // the job reached train_steps with this report
  CHECK(send() == std::pair<int64_t, bool>(1, true));    // a retry (its reply lost) learns it too
  CHECK(chief.pull("w") == std::vector<float>{-1, -1});  // applied once
  CHECK(chief.stats()[0].global_step == 1);
}

TEST_CASE(
    "a stepDone sent again with its request id counts once; reports without an id all count") {
  // Before, a step report retried after a lost reply moved an async job's
  // global step twice.
  PsdProcess psd;
  AsyncJobWithRawWorker job(psd, 3);
  Client& chief = job.chief;
  RawClient& worker = job.worker;
  auto report = [&](int64_t step, uint64_t id) {
    auto req = worker.shard.stepDoneRequest();
    req.setStep(step);
    req.setRequestId(id);
    auto reply = req.send().wait(worker.ws());
    return std::pair<int64_t, bool>(reply.getGlobalStep(), reply.getStop());
  };
  CHECK(report(0, 7) == std::pair<int64_t, bool>(1, false));
  CHECK(report(0, 7) == std::pair<int64_t, bool>(1, false));  // the retry: answered, not counted
  CHECK(report(1, 8) == std::pair<int64_t, bool>(2, false));
  CHECK(report(2, 0) == std::pair<int64_t, bool>(3, true));  // no id (an older client) counts...
  CHECK(report(2, 0) == std::pair<int64_t, bool>(4, true));  // ...every time, as before
  CHECK(report(1, 8) ==
        std::pair<int64_t, bool>(4, true));  // a late retry learns the job's step now
  CHECK(chief.stats()[0].global_step == 4);
  // The client numbers its reports: two calls are two steps.
  CHECK(chief.step_done(0).global_step == 5);
  CHECK(chief.step_done(1).global_step == 6);
}

TEST_CASE("bad requests get clear errors and change nothing") {
  PsdProcess psd({"--max_message_mb", "1"});
  ClientOptions o = options_for({&psd});
  o.chunk_bytes = 256 << 10;
  Client client(o);
  client.create({sgd_tensor("w", {4}, InitConfig::from_values({1, 2, 3, 4}))});
  const std::vector<float> original = {1, 2, 3, 4};

  SECTION("unknown tensor") {
    RawClient raw(psd);
    auto req = raw.shard.pullRequest();
    req.initNames(1).set(0, "nope");
    CHECK_THROWS_WITH(req.send().wait(raw.ws()), Catch::Contains("unknown tensor 'nope'"));
    CHECK_THROWS_WITH(raw.push_bytes("nope", float_bytes({1})),
                      Catch::Contains("unknown tensor 'nope'"));
    CHECK_THROWS_WITH(client.pull("nope"), Catch::Contains("unknown tensor 'nope'"));
  }
  SECTION("wrong gradient length") {
    RawClient raw(psd);
    CHECK_THROWS_WITH(raw.push_bytes("w", float_bytes({1, 1, 1})),
                      Catch::Contains("expects 4 floats"));
    CHECK_THROWS_WITH(raw.push_bytes("w", {1, 2, 3, 4, 5}), Catch::Contains("expects 4 floats"));
    CHECK_THROWS_AS(client.push("w", std::vector<float>{1, 1}), RequestError);
  }
  SECTION("NaN and Inf gradients") {
    CHECK_THROWS_WITH(client.push("w", std::vector<float>{1, NAN, 1, 1}),
                      Catch::Contains("NaN or Inf"));
    CHECK_THROWS_WITH(client.push("w", std::vector<float>{1, 1, INFINITY, 1}),
                      Catch::Contains("NaN or Inf"));
  }
  SECTION("a bad tensor in a batch rejects the whole batch") {
    client.create({sgd_tensor("v", {2})});
    std::vector<float> gw = {1, 1, 1, 1}, gv = {NAN, 0};
    CHECK_THROWS_AS(client.push({"w", "v"}, {gw, gv}), RequestError);
    CHECK(client.pull("v") == std::vector<float>{0, 0});
  }
  SECTION("a create that leaves its values out, for real") {
    RawClient raw(psd);
    auto request = [&](bool validate_only) {
      auto req = raw.shard.createRequest();
      req.setValidateOnly(validate_only);
      req.setValuesLeftOut(true);
      auto spec = req.initSpecs(1)[0];
      spec.setName("x");
      spec.initShape(1).set(0, 3);
      spec.initInit().setKind(wire::InitKind::VALUES);
      return req;
    };
    CHECK_THROWS_WITH(request(false).send().wait(raw.ws()),
                      Catch::Contains("left out only when validating"));
    CHECK(request(true).send().wait(raw.ws()).getTensors().size() == 0);
    auto pull = raw.shard.pullRequest();
    pull.initNames(1).set(0, "x");
    CHECK_THROWS_WITH(pull.send().wait(raw.ws()), Catch::Contains("unknown tensor 'x'"));
  }
  SECTION("create with another shape") {
    Client other(o);
    CHECK_THROWS_WITH(other.create({sgd_tensor("w", {2, 2})}),
                      Catch::Contains("exists with shape [4]"));
  }
  SECTION("a pull whose reply would be over the size limit") {
    client.create({sgd_tensor("big", {150'000})});  // parts of 256 KiB
    RawClient raw(psd);
    auto req = raw.shard.pullRequest();
    auto names = req.initNames(5);
    for (unsigned i = 0; i < 5; ++i) names.set(i, "big/part_0");
    CHECK_THROWS_WITH(req.send().wait(raw.ws()), Catch::Contains("over this psd's message limit"));
    CHECK(client.pull("w") == original);
  }
  SECTION("a message over the size limit") {
    RawClient raw(psd);
    std::vector<uint8_t> big(2 << 20, 0);
    CHECK_THROWS(raw.push_bytes("w", big));
    // The daemon serves on, for this client and others.
    CHECK(client.pull("w") == original);
    Client fresh(o);
    fresh.declare({sgd_tensor("w", {4})});
    CHECK(fresh.pull("w") == original);
  }
  SECTION("steps out of range (found by fuzz/shard_fuzz: psd took differences of them)") {
    RawClient raw(psd);
    const auto grad = float_bytes({1, 1, 1, 1});
    for (int64_t step :
         {int64_t{-1}, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
      auto req = raw.shard.pushRequest();
      req.setStep(step);
      auto g = req.initGrads(1);
      g[0].setName("w");
      g[0].setValues(kj::arrayPtr(grad.data(), grad.size()));
      CHECK_THROWS_WITH(req.send().wait(raw.ws()), Catch::Contains("out of range"));
    }
    // A worker's step reports likewise; a negative minStep asks for no step.
    RawClient worker(psd, 0);
    auto done = worker.shard.stepDoneRequest();
    done.setStep(std::numeric_limits<int64_t>::max());
    CHECK_THROWS_WITH(done.send().wait(worker.ws()), Catch::Contains("stepDone: step"));
    auto push = worker.shard.pushRequest();
    push.setDoneStep(std::numeric_limits<int64_t>::max());
    auto g = push.initGrads(1);
    g[0].setName("w");
    g[0].setValues(kj::arrayPtr(grad.data(), grad.size()));
    CHECK_THROWS_WITH(push.send().wait(worker.ws()), Catch::Contains("doneStep"));
    auto pull = worker.shard.pullRequest();
    pull.setMinStep(std::numeric_limits<int64_t>::min());
    pull.initNames(1).set(0, "w");
    auto reply = pull.send().wait(worker.ws());  // holds the values read below
    auto got = reply.getTensors()[0].getValues();
    CHECK(std::vector<uint8_t>(got.begin(), got.end()) == float_bytes(original));
  }
  SECTION("garbage bytes on the socket") {
    auto io = kj::setupAsyncIo();
    auto addr = io.provider->getNetwork().parseAddress(psd.address()).wait(io.waitScope);
    auto conn = addr->connect().wait(io.waitScope);
    std::vector<uint8_t> junk(4096);
    std::mt19937 rng(3);
    for (auto& x : junk) x = uint8_t(rng());
    conn->write(junk.data(), junk.size()).wait(io.waitScope);
    char buf[16];
    // psd closes the connection (or errors) instead of crashing.
    try {
      conn->tryRead(buf, 1, sizeof(buf)).wait(io.waitScope);
    } catch (const kj::Exception&) {
    }
    CHECK(client.pull("w") == original);
  }
  CHECK(client.pull("w") == original);
  CHECK(psd.alive());
}

TEST_CASE("a buffer or gradient of the wrong size is a RequestError, for pulls and pushes alike") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  client.create({sgd_tensor("w", {4})});
  std::vector<float> three(3);
  CHECK_THROWS_AS(client.pull({"w"}, {std::span<float>(three)}), RequestError);  // was ConfigError
  CHECK_THROWS_AS(client.push("w", three), RequestError);
  CHECK(client.pull("w") == std::vector<float>(4, 0.0f));
}

TEST_CASE("push_and_step that psd would refuse is refused before anything is sent") {
  // Its step report rides on one message per shard: psd would refuse that
  // one and apply the others, so the Client must refuse the whole call.
  PsdProcess psd;
  ClientOptions o = options_for({&psd});
  o.max_request_bytes = 64 << 10;  // the push goes out as several messages
  o.part_bytes = 16 << 10;
  Client tool(o);  // no worker index
  tool.create({sgd_tensor("w", {100'000})});
  const std::vector<float> g(100'000, 1.0f);
  CHECK_THROWS_WITH(tool.push_and_step({"w"}, {g}, 0, 0),
                    Catch::Contains("only workers report steps"));
  o.worker_index = 0;
  Client worker(o);
  worker.declare({sgd_tensor("w", {100'000})});
  CHECK_THROWS_WITH(worker.push_and_step({"w"}, {g}, 0, std::numeric_limits<int64_t>::max()),
                    Catch::Contains("doneStep") && Catch::Contains("nothing was sent"));
  CHECK(tool.pull("w") == std::vector<float>(100'000, 0.0f));
}

TEST_CASE("the rejected count is visible in stats") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  client.create({sgd_tensor("w", {2})});
  CHECK_THROWS(client.push("w", std::vector<float>{NAN, 1}));
  CHECK(client.stats()[0].rejected == 1);
}

TEST_CASE("an unreachable psd gives a clear error after a bounded wait") {
  int port;
  {
    PsdProcess gone;  // learn a free port, then free it
    port = gone.port();
  }
  ClientOptions o;
  o.ps_hosts = {"127.0.0.1:" + std::to_string(port)};
  o.connect_timeout = std::chrono::milliseconds(500);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(Client(o),
                    Catch::Contains("could not connect") && Catch::Contains(o.ps_hosts[0]));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));

  o.ps_hosts = {"no-such-host.invalid:1"};
  CHECK_THROWS_AS(Client(o), ConnectionError);
  o.ps_hosts = {};
  CHECK_THROWS_AS(Client(o), ConfigError);
}

TEST_CASE("a client started before psd connects once it listens") {
  ps::test::TempDir dir;
  const std::string sock = dir.path() + "/psd.sock";
  std::unique_ptr<PsdProcess> psd;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    psd = std::make_unique<PsdProcess>(std::vector<std::string>{"--unix_socket", sock});
  });
  ClientOptions o;
  o.ps_hosts = {"unix:" + sock};
  o.connect_timeout = std::chrono::milliseconds(10000);
  Client client(o);
  starter.join();
  client.create({sgd_tensor("x", {3}, InitConfig::constant(2))});
  CHECK(client.pull("x") == std::vector<float>{2, 2, 2});
}

TEST_CASE("psd exits cleanly on SIGTERM") {
  PsdProcess psd;
  {
    Client client(options_for({&psd}));
    client.create({sgd_tensor("w", {2})});
  }
  CHECK(psd.stop() == 0);
  CHECK_THAT(psd.log(), Catch::Contains("exited cleanly"));
}
