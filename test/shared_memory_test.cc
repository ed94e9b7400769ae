// The same-host path through shared memory (ClientOptions::
// shared_memory_bytes, psd --max_shared_memory_mb) against real psd
// processes: values bit-exact, exact sums under concurrency, and every bad
// slice or region refused with the tensor unchanged.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include <capnp/ez-rpc.h>

#include "schema/ps.capnp.h"
#include "ps/client.h"
#include "ps/embedding.h"
#include "test/psd_process.h"
#include "common/net/shared_region.h"

using namespace ps;
using ps::test::PsdProcess;

namespace {

// A psd with a Unix socket, and clients that reach it through it.
struct LocalPsd {
  explicit LocalPsd(std::vector<std::string> extra = {})
      : sock(dir.path() + "/psd.sock"), psd(args(extra)) {}
  std::vector<std::string> args(std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--unix_socket", sock});
    return extra;
  }
  ClientOptions options(std::size_t shared_bytes = ClientOptions{}.shared_memory_bytes) const {
    ClientOptions o;
    o.ps_hosts = {psd.address()};
    o.shared_memory_bytes = shared_bytes;
    return o;
  }
  uint64_t shared_bytes() const { return Client(options(0)).stats().at(0).shared_bytes; }
  ps::test::TempDir dir;
  std::string sock;
  PsdProcess psd;
};

TensorSpec sgd_tensor(std::string name, std::vector<uint64_t> shape, InitConfig init = {}) {
  return TensorSpec{.name = std::move(name),
                    .shape = std::move(shape),
                    .optimizer = OptimizerConfig::sgd(1.0f),
                    .init = std::move(init)};
}

// A raw Cap'n Proto connection over psd's Unix socket, with a region of its
// own: sends what libpsclient never would.
struct RawLocal {
  explicit RawLocal(const std::string& address) : rpc(address), shard(rpc.getMain<wire::Shard>()) {
    auto req = shard.helloRequest();
    req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
    req.setWorkerIndex(-1);
    req.send().wait(ws());
  }
  kj::WaitScope& ws() { return rpc.getWaitScope(); }
  uint32_t attach(SharedRegion& r) {
    const auto token = r.stamp_token();
    auto req = shard.attachMemoryRequest();
    req.setFd(r.fd());
    req.setBytes(r.size());
    req.setToken(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(token.data()), token.size()));
    return req.send().wait(ws()).getRegion();
  }
  void push(const std::string& name, uint32_t region, uint64_t offset, uint64_t bytes) {
    auto req = shard.pushRequest();
    auto g = req.initGrads(1);
    g[0].setName(name);
    auto s = g[0].initShared();
    s.setRegion(region);
    s.setOffset(offset);
    s.setBytes(bytes);
    req.send().wait(ws());
  }
  void pull(const std::string& name, uint32_t region, uint64_t offset, uint64_t bytes,
            unsigned slices = 1) {
    auto req = shard.pullRequest();
    req.initNames(1).set(0, name);
    auto into = req.initInto(slices);
    for (unsigned i = 0; i < slices; ++i) {
      into[i].setRegion(region);
      into[i].setOffset(offset);
      into[i].setBytes(bytes);
    }
    req.send().wait(ws());
  }
  static void slice(wire::SharedSlice::Builder s, uint32_t region, uint64_t offset,
                    uint64_t bytes) {
    s.setRegion(region);
    s.setOffset(offset);
    s.setBytes(bytes);
  }
  // pushRows of `ids` with their gradients in the slice (and `inline_floats`
  // more in the message, which psd must refuse alongside a slice).
  void push_rows(const std::string& table, const std::vector<uint64_t>& ids, uint32_t region,
                 uint64_t offset, uint64_t bytes, std::size_t inline_floats = 0) {
    auto req = shard.pushRowsRequest();
    req.setTable(table);
    req.setIds(kj::arrayPtr(ids.data(), ids.size()));
    if (inline_floats > 0) req.initGrads(inline_floats * sizeof(float));
    slice(req.initSharedGrads(), region, offset, bytes);
    req.send().wait(ws());
  }
  // pullRows of `ids` into the slice; whether psd said the rows are there.
  bool pull_rows(const std::string& table, const std::vector<uint64_t>& ids, uint32_t region,
                 uint64_t offset, uint64_t bytes) {
    auto req = shard.pullRowsRequest();
    req.setTable(table);
    req.setIds(kj::arrayPtr(ids.data(), ids.size()));
    slice(req.initInto(), region, offset, bytes);
    auto reply = req.send().wait(ws());
    return reply.getInShared() && reply.getRows().size() == 0;
  }
  capnp::EzRpcClient rpc;
  wire::Shard::Client shard;
};

// A batch of `n` ids drawn from `distinct` ids (so most repeat), and
// gradients that are multiples of 1/64: sums and SGD steps are exact in float.
struct RowBatch {
  std::vector<int64_t> ids;
  std::vector<float> grads;
  std::size_t unique = 0;
};

RowBatch row_batch(std::vector<int64_t> pool, std::size_t n, uint32_t dim, uint32_t seed) {
  std::mt19937_64 rng(seed);
  RowBatch b;
  std::map<int64_t, int> seen;
  for (std::size_t i = 0; i < n; ++i) {
    b.ids.push_back(pool[rng() % pool.size()]);
    ++seen[b.ids.back()];
  }
  for (std::size_t i = 0; i < n * dim; ++i) b.grads.push_back(float(int(rng() % 129) - 64) / 64.0f);
  b.unique = seen.size();
  return b;
}

// What each id's row holds after SGD (lr 1) from `start` with these batches, in float64.
std::map<int64_t, std::vector<double>> sgd_reference(
    const std::vector<const RowBatch*>& batches, uint32_t dim, double start,
    std::map<int64_t, std::vector<double>> rows = {}) {
  for (const RowBatch* b : batches) {
    for (std::size_t i = 0; i < b->ids.size(); ++i) {
      auto [it, fresh] = rows.try_emplace(b->ids[i], std::vector<double>(dim, start));
      for (uint32_t j = 0; j < dim; ++j) it->second[j] -= b->grads[i * dim + j];
    }
  }
  return rows;
}

// Rows of `ids` pulled by `client` equal `want` exactly.
void check_rows(Client& client, const std::string& table, const std::vector<int64_t>& ids,
                uint32_t dim, const std::map<int64_t, std::vector<double>>& want) {
  std::vector<float> out(ids.size() * dim, -1234.0f);
  client.pull_rows(table, ids, out);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& w = want.at(ids[i]);
    for (uint32_t j = 0; j < dim; ++j) wrong += out[i * dim + j] != static_cast<float>(w[j]);
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("a client on psd's host moves large tensors through shared memory, bit-exactly") {
  LocalPsd local;
  Client client(local.options());
  REQUIRE(client.connection_addresses() == std::vector<std::string>{"unix:" + local.sock});
  // Three parts of 1 MiB through shared memory and a last one of 20 bytes
  // in the message, in one batch.
  const std::size_t n = 3 * (1 << 18) + 5;
  std::mt19937 rng(5);
  std::vector<float> init(n), g(n), expected(n), out(n);
  for (std::size_t i = 0; i < n; ++i) {
    init[i] = float(int(rng() % 2001) - 1000) / 32.0f;
    g[i] = float(int(rng() % 2001) - 1000) / 64.0f;
    expected[i] = init[i] - g[i];
  }
  client.create({sgd_tensor("big", {n}, InitConfig::from_values(init))});
  client.pull("big", out);
  CHECK(std::memcmp(out.data(), init.data(), n * 4) == 0);
  const uint64_t part_bytes = 3u << 20;
  CHECK(local.shared_bytes() == part_bytes);
  client.push("big", g);
  CHECK(local.shared_bytes() == 2 * part_bytes);
  client.pull("big", out);
  CHECK(std::memcmp(out.data(), expected.data(), n * 4) == 0);
  CHECK(local.shared_bytes() == 3 * part_bytes);

  // A client without shared memory sees the same values over the socket.
  Client plain(local.options(0));
  plain.declare({sgd_tensor("big", {n})});
  std::vector<float> via_socket(n);
  plain.pull("big", via_socket);
  CHECK(std::memcmp(via_socket.data(), expected.data(), n * 4) == 0);
  CHECK(local.shared_bytes() == 3 * part_bytes);

  // Many tensors in one call, some small enough to stay in the message.
  const std::vector<std::string> names = {"t0", "t1", "t2", "t3", "t4", "t5"};
  std::vector<std::vector<float>> values;
  for (int t = 0; t < 6; ++t) {
    values.emplace_back(std::size_t(1000) << t, float(t + 1));
    client.create({sgd_tensor(names[t], {values.back().size()}, InitConfig::constant(100.0f))});
  }
  std::vector<std::span<const float>> grads(values.begin(), values.end());
  client.push(names, grads);
  std::vector<std::vector<float>> got;
  for (auto& v : values) got.emplace_back(v.size(), -1.0f);
  std::vector<std::span<float>> outs(got.begin(), got.end());
  client.pull(names, outs);
  for (int t = 0; t < 6; ++t) {
    INFO("tensor " << t);
    CHECK(std::count(got[t].begin(), got[t].end(), 100.0f - float(t + 1)) ==
          std::ptrdiff_t(got[t].size()));
  }
}

TEST_CASE("pushes through shared memory from threads and processes sum exactly") {
  LocalPsd local;
  const int threads = 3, pushes = 60;
  const std::size_t n = 64 << 10;  // 256 KiB: every push through shared memory
  Client(local.options()).create({sgd_tensor("acc", {n})});
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      Client c(local.options());
      c.declare({sgd_tensor("acc", {n})});
      std::vector<float> g(n, float(t + 1));
      for (int i = 0; i < pushes; i += 4) {
        // Four in flight at once: four blocks of the region in use together.
        std::vector<std::future<PushResult>> inflight;
        for (int k = 0; k < 4; ++k)
          inflight.push_back(c.push_async({"acc"}, {std::span<const float>(g)}));
        for (auto& f : inflight) f.get();
      }
    });
  }
  for (auto& w : workers) w.join();
  // And from processes (push_worker: a 16 KiB tensor, just at the threshold).
  CHECK(ps::test::run_push_workers(local.psd.address(), 2, 100) == 2);
  Client check(local.options());
  check.declare({sgd_tensor("acc", {n}), sgd_tensor("shared", {4096})});
  auto acc = check.pull("acc");
  CHECK(std::count(acc.begin(), acc.end(), -float(pushes * (1 + 2 + 3))) == std::ptrdiff_t(n));
  auto shared = check.pull("shared");
  CHECK(std::count(shared.begin(), shared.end(), -300.0f) == 4096);
  // Every push and both pulls went through shared memory.
  CHECK(local.shared_bytes() == threads * pushes * n * 4 + 200 * 4096 * 4 + n * 4 + 4096 * 4);
}

TEST_CASE("psd serves on when clients sharing memory with it are killed mid-transfer") {
  LocalPsd local;
  const std::string worker = ps::test::program_path("PUSH_WORKER_BIN");
  // A tensor of 4096 floats, or 512 table rows of 8 floats: 16 KiB a push either way.
  const bool rows = GENERATE(false, true);
  INFO((rows ? "table rows" : "a tensor"));
  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p) {
    std::vector<std::string> args = {
        worker, "--ps_hosts", local.psd.address(), "--pushes", "100000000", "--value", "1"};
    if (rows) args.push_back("--rows");
    pids.push_back(
        ps::test::spawn_logged(args, local.dir.path() + "/worker" + std::to_string(p) + ".log"));
  }
  // Until every worker is pushing, so the kills land mid-stream.
  Client watcher(local.options(0));
  for (int i = 0; i < 200 && watcher.stats().at(0).shared_bytes < 3 * 100 * 4096 * 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(watcher.stats().at(0).shared_bytes >= 3 * 100 * 4096 * 4);
  for (pid_t pid : pids) kill(pid, SIGKILL);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  REQUIRE(local.psd.alive());
  // Every push was applied whole or not at all.
  std::vector<float> v(4096);
  if (rows) {
    watcher.declare_tables(
        {{.name = "rows", .dim = 8, .rows = 512, .optimizer = RowOptimizerConfig::sgd(1.0f)}});
    std::vector<int64_t> ids(512);
    std::iota(ids.begin(), ids.end(), 0);
    watcher.pull_rows("rows", ids, v);
  } else {
    watcher.declare({sgd_tensor("shared", {4096})});
    v = watcher.pull("shared");
  }
  CHECK(v[0] < 0.0f);
  CHECK(std::count(v.begin(), v.end(), v[0]) == 4096);
  // And a new client shares memory with it as before.
  Client fresh(local.options());
  fresh.create({sgd_tensor("after", {1 << 18}, InitConfig::constant(3.0f))});
  fresh.push("after", std::vector<float>(1 << 18, 1.0f));
  auto after = fresh.pull("after");
  CHECK(std::count(after.begin(), after.end(), 2.0f) == 1 << 18);
  // The killed workers' connections end (the watcher and this one stay).
  for (int i = 0; i < 100 && fresh.stats().at(0).connections != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(fresh.stats().at(0).connections == 2);
}

TEST_CASE("bad shared memory requests get clear errors and change nothing") {
  LocalPsd local({"--max_shared_memory_mb", "4"});
  Client client(local.options(1 << 20));
  client.create({sgd_tensor("w", {8192}, InitConfig::constant(1.0f))});  // 32 KiB
  const std::vector<float> original(8192, 1.0f);
  const uint64_t bytes = 8192 * 4;
  const uint64_t before = local.shared_bytes();
  auto region = SharedRegion::create(1 << 20);
  auto* floats = reinterpret_cast<float*>(region->data());
  std::fill(floats, floats + 8192, 0.5f);
  RawLocal raw("unix:" + local.sock);

  SECTION("slices before any region is attached") {
    CHECK_THROWS_WITH(raw.push("w", 1, 0, bytes), Catch::Contains("attachMemory first"));
    CHECK_THROWS_WITH(raw.pull("w", 1, 0, bytes), Catch::Contains("attachMemory first"));
  }
  SECTION("slices that do not fit the region or the tensor") {
    const uint32_t id = raw.attach(*region);
    std::fill(floats, floats + 4, 0.5f);  // where attach() put its token
    CHECK_THROWS_WITH(raw.push("w", id, (1 << 20) - 4096, bytes),
                      Catch::Contains("lies outside the region"));
    CHECK_THROWS_WITH(raw.push("w", id, ~uint64_t{0} - 8, bytes),
                      Catch::Contains("lies outside the region"));
    CHECK_THROWS_WITH(raw.push("w", id, 0, bytes - 4), Catch::Contains("expects 8192 floats"));
    CHECK_THROWS_WITH(raw.push("w", id + 6, 0, bytes), Catch::Contains("no shared memory region"));
    CHECK_THROWS_WITH(raw.pull("w", id, (1 << 20) - 4096, bytes),
                      Catch::Contains("lies outside the region"));
    CHECK_THROWS_WITH(raw.pull("w", id, 0, bytes + 4), Catch::Contains("holds 32772 bytes"));
    CHECK_THROWS_WITH(raw.pull("w", id, 0, bytes, 2),
                      Catch::Contains("2 shared slices for 1 tensors"));
    floats[17] = NAN;
    CHECK_THROWS_WITH(raw.push("w", id, 0, bytes), Catch::Contains("NaN or Inf"));
    floats[17] = 0.5f;
    CHECK_THROWS_WITH(raw.attach(*SharedRegion::create(1 << 20)),
                      Catch::Contains("already has a shared memory region"));
    // A good slice still works on this connection afterwards.
    raw.push("w", id, 0, bytes);
    raw.pull("w", id, 4096, bytes);
    CHECK(std::count(floats + 1024, floats + 1024 + 8192, 0.5f) == 8192);
    CHECK(client.pull("w") == std::vector<float>(8192, 0.5f));
    client.push("w", std::vector<float>(8192, -0.5f));  // back to the original
  }
  SECTION("regions psd will not map") {
    auto too_big = SharedRegion::create(8 << 20);
    CHECK_THROWS_WITH(raw.attach(*too_big), Catch::Contains("--max_shared_memory_mb"));
    const int plain = memfd_create("unsealed", MFD_CLOEXEC);
    REQUIRE(plain >= 0);
    REQUIRE(ftruncate(plain, 1 << 20) == 0);
    auto req = raw.shard.attachMemoryRequest();
    req.setFd(plain);
    req.setBytes(1 << 20);
    CHECK_THROWS_WITH(req.send().wait(raw.ws()), Catch::Contains("sealed with F_SEAL_SHRINK"));
    close(plain);
    auto wrong_size = raw.shard.attachMemoryRequest();
    wrong_size.setFd(region->fd());
    wrong_size.setBytes(4096);
    const auto token = region->stamp_token();
    wrong_size.setToken(
        kj::arrayPtr(reinterpret_cast<const capnp::byte*>(token.data()), token.size()));
    CHECK_THROWS_WITH(wrong_size.send().wait(raw.ws()), Catch::Contains("not 4096"));
    // A region that does not hold the token sent with it: another process's
    // memory, reached through a reused pid.
    auto stranger = SharedRegion::create(1 << 20);
    stranger->stamp_token();
    for (const bool sent : {true, false}) {
      INFO((sent ? "another token" : "no token"));
      auto req = raw.shard.attachMemoryRequest();
      req.setFd(stranger->fd());
      req.setBytes(stranger->size());
      if (sent) {
        const std::array<capnp::byte, SharedRegion::kTokenBytes> guess{};
        req.setToken(kj::arrayPtr(guess.data(), guess.size()));
      }
      CHECK_THROWS_WITH(req.send().wait(raw.ws()),
                        Catch::Contains(sent ? "does not hold the token" : "token of 16 bytes"));
    }
  }
  SECTION("over TCP") {
    RawLocal tcp(local.psd.address());
    CHECK_THROWS_WITH(tcp.attach(*region), Catch::Contains("only over psd's Unix socket"));
  }
  CHECK(client.pull("w") == original);
  CHECK(local.psd.alive());
  CHECK(local.shared_bytes() >= before);
}

TEST_CASE("a psd that shares no memory leaves a local client on its Unix socket") {
  LocalPsd local({"--max_shared_memory_mb", "0"});
  Client client(local.options());
  CHECK(client.connection_addresses() == std::vector<std::string>{"unix:" + local.sock});
  client.create({sgd_tensor("w", {1 << 16}, InitConfig::constant(2.0f))});
  client.push("w", std::vector<float>(1 << 16, 1.0f));
  auto v = client.pull("w");
  CHECK(std::count(v.begin(), v.end(), 1.0f) == 1 << 16);
  CHECK(local.shared_bytes() == 0);
}

TEST_CASE("a region larger than psd allows leaves the client on the socket") {
  LocalPsd local({"--max_shared_memory_mb", "1"});
  Client client(local.options(2 << 20));
  client.create({sgd_tensor("w", {1 << 16}, InitConfig::constant(2.0f))});
  client.push("w", std::vector<float>(1 << 16, 1.0f));
  auto v = client.pull("w");
  CHECK(std::count(v.begin(), v.end(), 1.0f) == 1 << 16);
  CHECK(local.shared_bytes() == 0);
  CHECK(local.psd.alive());
}

TEST_CASE("table rows move through shared memory exactly, and over the socket without it") {
  LocalPsd local;
  Client client(local.options());
  REQUIRE(client.connection_addresses() == std::vector<std::string>{"unix:" + local.sock});
  const uint32_t dim = 32;
  const bool dynamic = GENERATE(false, true);
  INFO((dynamic ? "dynamic table" : "fixed table"));
  TableSpec spec{.name = "emb",
                 .dim = dim,
                 .rows = dynamic ? uint64_t{0} : uint64_t{100000},
                 .dynamic = dynamic,
                 .placement = dynamic ? TablePlacement::kHash : TablePlacement::kMod,
                 .optimizer = RowOptimizerConfig::sgd(1.0f),
                 .init = InitConfig::constant(0.25f)};
  client.create_tables({spec});
  std::vector<int64_t> pool;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 1000; ++i)
    pool.push_back(dynamic ? int64_t(rng() >> 1) * (i % 2 ? -1 : 1) : int64_t(rng() % 100000));
  // 3000 ids, about 950 distinct: one request of about 120 KiB of rows.
  const RowBatch a = row_batch(pool, 3000, dim, 1), b = row_batch(pool, 3000, dim, 2);
  REQUIRE(a.unique * dim * 4 > (64u << 10));
  const uint64_t before = local.shared_bytes();

  client.push_rows("emb", a.ids, a.grads);
  CHECK(local.shared_bytes() - before == a.unique * dim * 4);  // the gradients went through it
  auto want = sgd_reference({&a}, dim, 0.25);
  check_rows(client, "emb", a.ids, dim, want);
  CHECK(local.shared_bytes() - before == 2 * a.unique * dim * 4);  // and the rows came back so

  // The same through a client on the Unix socket without shared memory: nothing through it.
  Client plain(local.options(0));
  plain.declare_tables({spec});
  const uint64_t shared_then = local.shared_bytes();
  plain.push_rows("emb", b.ids, b.grads);
  want = sgd_reference({&b}, dim, 0.25, want);
  check_rows(plain, "emb", a.ids, dim, want);
  check_rows(plain, "emb", b.ids, dim, want);
  CHECK(local.shared_bytes() == shared_then);
  // Both see the same rows; a batch under the threshold (16 KiB) stays in the message.
  check_rows(client, "emb", b.ids, dim, want);
  const uint64_t large_done = local.shared_bytes();
  const std::vector<int64_t> few(pool.begin(), pool.begin() + 20);
  const RowBatch small{few, std::vector<float>(few.size() * dim, 0.5f), few.size()};
  client.push_rows("emb", small.ids, small.grads);
  want = sgd_reference({&small}, dim, 0.25, want);
  check_rows(client, "emb", few, dim, want);
  CHECK(local.shared_bytes() == large_done);

  // A lookup comes through shared memory as a pull does, and creates no row:
  // held ids read their rows, the others the initializer's 0.25.
  const uint64_t rows_then = client.list_tables().at(0).rows;
  std::vector<int64_t> mixed(b.ids.begin(), b.ids.begin() + 1000);
  for (int i = 0; i < 2000; ++i)
    mixed.push_back(dynamic ? int64_t(rng() >> 1) : int64_t(rng() % 100000));
  std::vector<float> out(mixed.size() * dim, -1234.0f);
  client.lookup_rows("emb", mixed, out);
  CHECK(local.shared_bytes() > large_done);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    const auto w = want.find(mixed[i]);
    for (uint32_t j = 0; j < dim; ++j)
      wrong += out[i * dim + j] != (w == want.end() ? 0.25f : static_cast<float>(w->second[j]));
  }
  CHECK(wrong == 0);
  CHECK(client.list_tables().at(0).rows == rows_then);
  CHECK(local.psd.alive());
}

TEST_CASE("sync steps of table rows through shared memory count once and apply exactly") {
  LocalPsd local;
  ClientOptions o = local.options();
  o.worker_index = 0;
  o.is_chief = true;
  Client chief(o);
  const uint32_t dim = 32;
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 1});
  const bool dynamic = GENERATE(false, true);
  INFO((dynamic ? "dynamic table" : "fixed table"));
  const TableSpec spec{.name = "emb",
                       .dim = dim,
                       .rows = dynamic ? uint64_t{0} : uint64_t{5000},
                       .dynamic = dynamic,
                       .placement = dynamic ? TablePlacement::kHash : TablePlacement::kMod,
                       .optimizer = RowOptimizerConfig::sgd(1.0f),
                       .init = InitConfig::constant(-1.0f)};
  chief.create_tables({spec});
  chief.set_ready();
  std::vector<int64_t> pool;
  for (int i = 0; i < 800; ++i)
    pool.push_back(dynamic ? int64_t(i) * 7919 + (int64_t{1} << 40) : i * 6);
  std::map<int64_t, std::vector<double>> want;
  const uint64_t before = local.shared_bytes();
  uint64_t through = 0;
  for (int64_t step = 0; step < 4; ++step) {
    INFO("step " << step);
    const RowBatch batch = row_batch(pool, 2500, dim, 100 + uint32_t(step));
    std::vector<float> rows(batch.ids.size() * dim);
    // Even steps: pull_rows and push_rows; odd ones: pull_with_rows and push_and_step.
    if (step % 2 == 0) {
      CHECK(chief.pull_rows("emb", batch.ids, rows, step) == step);
      CHECK(chief.push_rows("emb", batch.ids, batch.grads, step) == PushStatus::kAccumulated);
      chief.step_done(step);
    } else {
      CHECK(chief.pull_with_rows({}, {}, {{"emb", batch.ids, rows}}, step).step == step);
      PushResult p = chief.push_and_step({}, {}, {{"emb", batch.ids, batch.grads}}, step, step);
      CHECK(p.row_status == std::vector<PushStatus>{PushStatus::kAccumulated});
      CHECK(p.global_step == step + 1);
    }
    // What was pulled is the rows before this step.
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < batch.ids.size(); ++i) {
      auto it = want.find(batch.ids[i]);
      for (uint32_t j = 0; j < dim; ++j)
        wrong += rows[i * dim + j] != (it == want.end() ? -1.0f : float(it->second[j]));
    }
    CHECK(wrong == 0);
    want = sgd_reference({&batch}, dim, -1.0, want);
    through += 2 * batch.unique * dim * 4;
    // A push for a finished step is stale, and its gradients change nothing.
    CHECK(chief.push_rows("emb", batch.ids, batch.grads, step) == PushStatus::kStale);
    through += batch.unique * dim * 4;
  }
  std::vector<int64_t> all;
  for (const auto& [id, row] : want) all.push_back(id);
  check_rows(chief, "emb", all, dim, want);
  through += all.size() * dim * 4;
  CHECK(local.shared_bytes() - before == through);
}

TEST_CASE("bad shared slices in row requests get clear errors, change nothing, psd serves on") {
  LocalPsd local({"--max_shared_memory_mb", "4"});
  Client client(local.options(1 << 20));
  const uint32_t dim = 8;
  const TableSpec spec{.name = "emb",
                       .dim = dim,
                       .rows = 1024,
                       .optimizer = RowOptimizerConfig::sgd(1.0f),
                       .init = InitConfig::constant(1.0f)};
  client.create_tables({spec});
  std::vector<uint64_t> ids(600);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  const std::vector<int64_t> signed_ids(ids.begin(), ids.end());
  const uint64_t bytes = ids.size() * dim * 4;  // 19,200
  Client plain(local.options(0));  // reads the rows over the socket: counts nothing shared
  plain.declare_tables({spec});
  auto original = [&] {
    std::vector<float> out(ids.size() * dim);
    plain.pull_rows("emb", signed_ids, out);
    return out;
  };
  const std::vector<float> ones(ids.size() * dim, 1.0f);
  REQUIRE(original() == ones);
  auto region = SharedRegion::create(1 << 20);
  auto* floats = reinterpret_cast<float*>(region->data());
  RawLocal raw("unix:" + local.sock);
  const uint64_t before = local.shared_bytes();

  SECTION("slices before any region is attached") {
    CHECK_THROWS_WITH(raw.push_rows("emb", ids, 1, 0, bytes),
                      Catch::Contains("attachMemory first"));
    CHECK_THROWS_WITH(raw.pull_rows("emb", ids, 1, 0, bytes),
                      Catch::Contains("attachMemory first"));
  }
  SECTION("slices that do not fit the region, the rows or float32s") {
    const uint32_t id = raw.attach(*region);
    std::fill(floats, floats + (1 << 18), 0.5f);  // over the token attach() wrote
    for (auto offset : {uint64_t(1 << 20) - 4096, ~uint64_t{0} - 7, uint64_t{1} << 62}) {
      INFO("offset " << offset);
      CHECK_THROWS_WITH(raw.push_rows("emb", ids, id, offset, bytes),
                        Catch::Contains("pushRows: shared slice of 19200 bytes") &&
                            Catch::Contains("lies outside the region of 1048576 bytes"));
      CHECK_THROWS_WITH(
          raw.pull_rows("emb", ids, id, offset, bytes),
          Catch::Contains("pullRows: shared slice") && Catch::Contains("lies outside the region"));
    }
    CHECK_THROWS_WITH(raw.push_rows("emb", ids, id, 0, ~uint64_t{0} - 3),
                      Catch::Contains("lies outside the region"));
    CHECK_THROWS_WITH(raw.push_rows("emb", ids, id, 2, bytes),
                      Catch::Contains("not whole float32s at a float32 boundary"));
    CHECK_THROWS_WITH(raw.pull_rows("emb", ids, id, 0, bytes - 2),
                      Catch::Contains("not whole float32s at a float32 boundary"));
    CHECK_THROWS_WITH(raw.push_rows("emb", ids, id, 0, bytes - 4),
                      Catch::Contains("600 ids need 4800 gradient floats, got 4799"));
    CHECK_THROWS_WITH(raw.pull_rows("emb", ids, id, 0, bytes + 4),
                      Catch::Contains("the shared slice holds 19204 bytes, the rows 19200"));
    CHECK_THROWS_WITH(raw.push_rows("emb", ids, id + 6, 0, bytes),
                      Catch::Contains("no shared memory region 7"));
    CHECK_THROWS_WITH(raw.pull_rows("emb", ids, id + 6, 0, bytes),
                      Catch::Contains("no shared memory region 7"));
    CHECK_THROWS_WITH(raw.push_rows("emb", ids, id, 0, bytes, 4800),
                      Catch::Contains("both in the message and in a shared slice"));
    floats[17] = NAN;
    CHECK_THROWS_WITH(raw.push_rows("emb", ids, id, 0, bytes), Catch::Contains("NaN or Inf"));
    floats[17] = 0.5f;
    std::vector<uint64_t> outside = ids;
    outside[3] = 5000;
    CHECK_THROWS_WITH(raw.push_rows("emb", outside, id, 0, bytes), Catch::Contains("5000"));
    CHECK_THROWS_WITH(raw.pull_rows("emb", outside, id, 0, bytes), Catch::Contains("5000"));
    CHECK(original() == ones);  // nothing of those was applied
    CHECK(local.shared_bytes() == before);
    // Good slices still work on this connection afterwards.
    raw.push_rows("emb", ids, id, 0, bytes);
    CHECK(raw.pull_rows("emb", ids, id, 1 << 19, bytes));
    CHECK(std::count(floats + (1 << 17), floats + (1 << 17) + 4800, 0.5f) == 4800);
    CHECK(original() == std::vector<float>(ids.size() * dim, 0.5f));
    CHECK(local.shared_bytes() == before + 2 * bytes);
    std::fill(floats, floats + 4800, -0.5f);
    raw.push_rows("emb", ids, id, 0, bytes);  // back to the original
  }
  SECTION("random slices: accepted exactly when they fit, the table unchanged") {
    const uint32_t id = raw.attach(*region);
    const uint64_t size = region->size();
    std::mt19937_64 rng(29);
    auto pick = [&rng](std::initializer_list<uint64_t> from) {
      return *(from.begin() + rng() % from.size());
    };
    int accepted = 0;
    for (int round = 0; round < 400; ++round) {
      std::memset(region->data(), 0, size);  // zero gradients: an accepted push changes nothing
      const uint32_t r = static_cast<uint32_t>(pick({id, id, id, id + 1, 0}));
      const uint64_t b =
          pick({bytes, bytes, bytes, 0, bytes - 4, bytes + 4, bytes - 2, ~uint64_t{0} - 3});
      const uint64_t at =
          pick({0, 64, 2, 4, size - bytes, size - bytes + 4, size, uint64_t{1} << 63,
                ~uint64_t{0} - 3, rng() % size, (rng() % (size / 4)) * 4});
      const bool fits = r == id && at % 4 == 0 && b % 4 == 0 && at <= size && b <= size - at;
      const bool push = rng() % 2 == 0;
      const bool want = push ? fits && b == bytes : b == 0 || (fits && b == bytes);
      bool got = true;
      try {
        if (push)
          raw.push_rows("emb", ids, r, at, b);
        else
          raw.pull_rows("emb", ids, r, at, b);
      } catch (const kj::Exception&) {
        got = false;
        raw.pull_rows("emb", ids, id, 0, 0);  // a good call: no cut-off after refusals in a row
      }
      INFO("round " << round << (push ? " push" : " pull") << " region " << r << " at " << at
                    << " bytes " << b);
      CHECK(got == want);
      accepted += got;
    }
    CHECK(accepted > 50);
    CHECK(local.shared_bytes() > before);
  }
  SECTION("over TCP") {
    RawLocal tcp(local.psd.address());
    CHECK_THROWS_WITH(tcp.push_rows("emb", ids, 1, 0, bytes),
                      Catch::Contains("attachMemory first"));
  }
  CHECK(original() == ones);
  CHECK(local.psd.alive());
}

// psd opens what a client's descriptor names: a terminal must not become
// psd's controlling terminal, whose hangup would end psd (SIGHUP).
TEST_CASE("a terminal handed to attachMemory cannot end psd") {
  ps::test::TempDir dir;
  const std::string sock = dir.path() + "/psd.sock", log = dir.path() + "/psd.log";
  // A session leader without a terminal, as psd is under systemd or in a container.
  const pid_t pid = ps::test::spawn_logged(
      {ps::test::program_path("PSD_BIN"), "--port", "0", "--unix_socket", sock}, log,
      [] { return setsid() > 0; });
  for (int i = 0; i < 100 && !std::filesystem::exists(sock); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(std::filesystem::exists(sock));
  const int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  const int terminal = open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(terminal >= 0);
  {
    RawLocal raw("unix:" + sock);
    auto req = raw.shard.attachMemoryRequest();
    req.setFd(terminal);
    req.setBytes(4096);
    CHECK_THROWS_WITH(req.send().wait(raw.ws()), Catch::Contains("attachMemory:"));
  }
  ::close(terminal);
  ::close(master);  // hangs the terminal up
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int status = 0;
  const pid_t gone = waitpid(pid, &status, WNOHANG);
  if (gone == pid) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO("psd exited; signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << "\n" << text);
    CHECK(gone == 0);
  } else {
    CHECK(gone == 0);
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
  }
}
