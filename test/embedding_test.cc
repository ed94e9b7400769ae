// Embedding tables end to end: libpsclient against real psd processes on
// loopback ports; a raw Cap'n Proto connection sends what libpsclient would
// refuse to, and every refusal is followed by a check that nothing changed
// and psd still serves.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <map>
#include <random>
#include <thread>

#include <capnp/ez-rpc.h>

#include "common/embedding_placement.h"
#include "common/checkpoint/checkpoint_file.h"
#include "common/embedding_wire.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "schema/ps.capnp.h"
#include "test/colliding_ids.h"
#include "test/psd_process.h"

using namespace ps;
using namespace std::chrono_literals;
using ps::test::PsdProcess;

namespace {

ClientOptions options_for(std::initializer_list<const PsdProcess*> shards, int worker = -1) {
  ClientOptions o;
  for (auto* s : shards) o.ps_hosts.push_back(s->address());
  o.worker_index = worker;
  o.is_chief = worker == 0;
  return o;
}

TableSpec fixed(std::string name, uint64_t rows, uint32_t dim, float lr = 1.0f,
                InitConfig init = {}, TablePlacement p = TablePlacement::kMod) {
  return TableSpec{.name = std::move(name),
                   .dim = dim,
                   .rows = rows,
                   .placement = p,
                   .optimizer = RowOptimizerConfig::sgd(lr),
                   .init = std::move(init)};
}

TableSpec dynamic(std::string name, uint32_t dim, uint64_t limit = 0,
                  OnRowLimit on_limit = OnRowLimit::kRefuse) {
  return TableSpec{.name = std::move(name),
                   .dim = dim,
                   .dynamic = true,  // placed by hash: no placement named (the default kMod)
                   .optimizer = RowOptimizerConfig::sgd(1.0f),
                   .row_limit = limit,
                   .on_limit = on_limit};
}

std::vector<float> pull_rows(Client& c, const std::string& table, const std::vector<int64_t>& ids,
                             uint32_t dim) {
  std::vector<float> out(ids.size() * dim);
  c.pull_rows(table, ids, out);
  return out;
}

// A Text field holding every byte of `s`, NULs included.
capnp::Text::Reader text(const std::string& s) { return capnp::Text::Reader(s.c_str(), s.size()); }

// A raw connection to one psd, for requests libpsclient would not send.
struct RawShard {
  explicit RawShard(const PsdProcess& psd, int32_t worker_index = -1)
      : rpc(psd.address()), shard(rpc.getMain<wire::Shard>()) {
    auto req = shard.helloRequest();
    req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
    req.setWorkerIndex(worker_index);
    req.send().wait(ws());
  }
  kj::WaitScope& ws() { return rpc.getWaitScope(); }

  void create(const TableSpec& spec, uint32_t shard_index = 0, uint32_t shards = 1) {
    auto req = shard.createTablesRequest();
    to_wire(spec, shard_index, shards, req.initTables(1)[0]);
    req.send().wait(ws());
  }
  std::vector<float> pull(const std::string& table, const std::vector<uint64_t>& ids) {
    auto req = shard.pullRowsRequest();
    req.setTable(text(table));
    req.setIds(kj::arrayPtr(ids.data(), ids.size()));
    auto reply = req.send().wait(ws());
    auto rows = reply.getRows();
    std::vector<float> out(rows.size() / 4);
    std::memcpy(out.data(), rows.begin(), rows.size());
    return out;
  }
  wire::PushStatus push(const std::string& table, const std::vector<uint64_t>& ids,
                        const std::vector<float>& grads, uint64_t request_id = 0, int64_t step = 0,
                        bool ids_distinct = false) {
    auto req = shard.pushRowsRequest();
    req.setIdsDistinct(ids_distinct);
    req.setStep(step);
    req.setTable(text(table));
    req.setIds(kj::arrayPtr(ids.data(), ids.size()));
    req.setGrads(kj::arrayPtr(reinterpret_cast<const kj::byte*>(grads.data()),
                              grads.size() * sizeof(float)));
    req.setRequestId(request_id);
    return req.send().wait(ws()).getStatus();
  }

  capnp::EzRpcClient rpc;
  wire::Shard::Client shard;
};

}  // namespace

TEST_CASE("pull and push rows: exact SGD values, repeated ids summed, rows in the caller's order") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  client.create_tables({fixed("emb", 10, 2, 0.5f, InitConfig::constant(1))});
  CHECK(pull_rows(client, "emb", {3, 1, 3, 0}, 2) == std::vector<float>(8, 1.0f));
  const std::vector<int64_t> ids = {3, 1, 3, 9};
  const std::vector<float> grads = {2, 4, 6, 8, -2, 0, 1, 1};
  CHECK(client.push_rows("emb", ids, grads) == PushStatus::kApplied);
  // Row 3: 1 - 0.5 * ((2, 4) + (-2, 0)) = (1, -1); row 1: 1 - 0.5 * (6, 8); row 9: 1 - 0.5 * (1,
  // 1).
  CHECK(pull_rows(client, "emb", {9, 3, 1, 0, 3}, 2) ==
        std::vector<float>{0.5f, 0.5f, 1, -1, -2, -3, 1, 1, 1, -1});
  // Created again with the same spec: kept as it is.
  client.create_tables({fixed("emb", 10, 2, 0.5f, InitConfig::constant(1))});
  CHECK(pull_rows(client, "emb", {3}, 2) == std::vector<float>{1, -1});
  auto tables = client.list_tables();
  REQUIRE(tables.size() == 1);
  CHECK(tables[0].rows == 10);
  // The rows only: a fixed table keeps nothing per row beside them.
  CHECK(tables[0].bytes == 10 * 2 * 4);
}

TEST_CASE("pushes of rows from several clients at once sum exactly") {
  PsdProcess psd;
  const int clients = 3, pushes = 50;
  const uint32_t dim = 4;
  {
    Client setup(options_for({&psd}));
    setup.create_tables({fixed("emb", 100, dim)});
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      Client c(options_for({&psd}));
      c.declare_tables({fixed("emb", 100, dim)});
      // Client t pushes (t + 1) to rows t, t + 10, ... (with row 99 twice per push).
      std::vector<int64_t> ids;
      for (int64_t id = t; id < 100; id += 10) ids.push_back(id);
      ids.push_back(99);
      ids.push_back(99);
      std::vector<float> g(ids.size() * dim, float(t + 1));
      for (int i = 0; i < pushes; ++i) c.push_rows("emb", ids, g);
    });
  }
  for (auto& t : threads) t.join();
  Client check(options_for({&psd}));
  check.declare_tables({fixed("emb", 100, dim)});
  std::vector<int64_t> all(100);
  for (int64_t i = 0; i < 100; ++i) all[i] = i;
  auto rows = pull_rows(check, "emb", all, dim);
  for (int64_t id = 0; id < 100; ++id) {
    float want = 0;
    if (id % 10 < clients) want -= float(pushes * (id % 10 + 1));
    if (id == 99) want = -float(pushes * 2 * (1 + 2 + 3));
    INFO("id " << id);
    CHECK(rows[id * dim] == want);
    CHECK(rows[id * dim + dim - 1] == want);
  }
}

TEST_CASE("rows spread over three shards by mod, div and hash; large batches in several requests") {
  PsdProcess ps0, ps1, ps2;
  ClientOptions o = options_for({&ps0, &ps1, &ps2});
  o.max_request_bytes = 4096;  // a few hundred ids per request: many requests per shard
  Client client(o);
  const uint64_t rows = 1000;
  const uint32_t dim = 3;
  client.create_tables(
      {fixed("m", rows, dim, 1, InitConfig::uniform(-1, 1, 5), TablePlacement::kMod),
       fixed("d", rows, dim, 1, InitConfig::uniform(-1, 1, 5), TablePlacement::kDiv),
       dynamic("h", dim)});
  std::mt19937_64 rng(9);
  std::vector<int64_t> ids(5000);
  for (auto& id : ids) id = int64_t(rng() % rows);  // many repeats
  std::vector<float> grads(ids.size() * dim);
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(i % 7) - 3;
  // Reference: sum per id (small integers: exact in float).
  std::map<int64_t, std::vector<float>> sums;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto& s = sums[ids[i]];
    s.resize(dim);
    for (uint32_t j = 0; j < dim; ++j) s[j] += grads[i * dim + j];
  }
  // The same id starts the same in both fixed tables (rows drawn from (seed, id)).
  CHECK(pull_rows(client, "d", ids, dim) == pull_rows(client, "m", ids, dim));
  for (const char* name : {"m", "d", "h"}) {
    INFO("table " << name);
    auto before = pull_rows(client, name, ids, dim);
    client.push_rows(name, ids, grads);
    auto after = pull_rows(client, name, ids, dim);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (uint32_t j = 0; j < dim; ++j) {
        REQUIRE(after[i * dim + j] == before[i * dim + j] - sums[ids[i]][j]);
      }
    }
  }
  for (const auto& t : client.list_tables()) {
    INFO("table " << t.name);
    REQUIRE(t.rows_per_shard.size() == 3);
    const TablePlacement kind = t.name == "m"   ? TablePlacement::kMod
                                : t.name == "d" ? TablePlacement::kDiv
                                                : TablePlacement::kHash;
    RowPlacement place(kind, rows, 3);
    for (uint32_t s = 0; s < 3; ++s) {
      uint64_t want = place.rows_on(s);
      if (t.name == "h") {
        want = 0;
        for (const auto& [id, sum] : sums) want += place.shard_of(uint64_t(id)) == s;
      }
      CHECK(t.rows_per_shard[s] == want);
    }
  }
  auto stats = client.stats();
  CHECK(stats[0].rejected == 0);
}

TEST_CASE("a large pull goes in parts, each sent once planned; in sync mode as one plan") {
  // One id, many times over: one plan fetches it once, each part once more.
  // psd's bytes_out counts what was fetched.
  PsdProcess ps;
  ClientOptions o = options_for({&ps}, 0);
  o.max_request_bytes = 64;  // 4 ids of dim 2 a request, so a part is 8 ids
  const uint32_t dim = 2;
  const std::vector<int64_t> same(100, 3);  // 13 parts of at most 8
  std::vector<int64_t> mixed(100);
  for (std::size_t i = 0; i < mixed.size(); ++i) mixed[i] = int64_t((i * 7) % 23);
  auto fetched = [&](Client& c, const std::vector<int64_t>& ids) {
    const uint64_t before = c.stats().at(0).bytes_out;
    const auto rows = pull_rows(c, "t", ids, dim);
    for (std::size_t i = 0; i < ids.size(); ++i) {  // row id holds (id, -id) after the push below
      REQUIRE(rows[i * dim] == -float(ids[i]));
      REQUIRE(rows[i * dim + 1] == float(ids[i]));
    }
    return (c.stats().at(0).bytes_out - before) / (dim * sizeof(float));
  };
  // A job in `mode` whose table "t" has row id = (id, -id).
  auto job = [&](Client& c, const JobConfig& mode) {
    c.init_job(mode);
    c.create_tables({fixed("t", 30, dim)});
    c.set_ready();
    std::vector<int64_t> all(30);
    std::vector<float> g(30 * dim);
    for (int64_t id = 0; id < 30; ++id) {
      all[id] = id;
      g[id * dim] = float(id);
      g[id * dim + 1] = -float(id);
    }
    c.push_rows("t", all, g, 0);
  };
  SECTION("async: parts") {
    Client c(o);
    job(c, {.mode = SyncMode::kAsync, .total_replicas = 1});
    CHECK(fetched(c, same) == 13);
    CHECK(fetched(c, std::vector<int64_t>(16, 3)) == 1);  // two requests' worth: one plan
    CHECK(fetched(c, mixed) <= 13 * 8);                   // every row right, parts or not
    // A bad id anywhere in a batch that would go in parts: refused before any part is sent.
    std::vector<int64_t> bad = same;
    bad.back() = 30;  // outside the table
    std::vector<float> out(bad.size() * dim);
    const uint64_t before = c.stats().at(0).bytes_out;
    CHECK_THROWS_WITH(c.pull_rows("t", bad, out), Catch::Contains("outside table 't'"));
    CHECK(c.stats().at(0).bytes_out == before);
  }
  SECTION("sync: one plan") {
    Client c(o);
    job(c, {.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 1});
    CHECK(fetched(c, same) == 1);
    CHECK(fetched(c, mixed) == 23);
  }
}

TEST_CASE("large batches: rows sent from psd's reused buffers, gradients without a copy, exact") {
  // Requests of about 1 MiB (ClientOptions' default): psd sends each reply's
  // rows from a buffer it reuses, the client sends summed gradients from its
  // own memory, and the rows go from the replies straight to the caller's
  // positions. An odd dim makes some requests' rows end off a word boundary
  // (those are copied instead). psd on one thread a request, then with each
  // request's rows spread over three (--table_threads).
  for (const char* table_threads : {"1", "3"}) {
    INFO("--table_threads " << table_threads);
    const std::vector<std::string> flags{"--threads", "3", "--table_threads", table_threads};
    PsdProcess ps0(flags), ps1(flags);
    Client client(options_for({&ps0, &ps1}));
    const uint64_t rows = 50000;
    client.create_tables(
        {fixed("w32", rows, 32, 1, InitConfig::uniform(-1, 1, 3)),
         fixed("w5", rows, 5, 1, InitConfig::uniform(-1, 1, 4), TablePlacement::kDiv),
         dynamic("h", 32)});
    std::mt19937_64 rng(11);
    std::vector<int64_t> ids(40000);
    for (auto& id : ids) id = int64_t(rng() % rows);  // about a third repeat an earlier id
    for (const auto& [name, dim] :
         std::vector<std::pair<std::string, uint32_t>>{{"w32", 32}, {"w5", 5}, {"h", 32}}) {
      INFO("table " << name);
      std::vector<int64_t> batch = ids;
      if (name == "h") {
        for (auto& id : batch) id = int64_t(uint64_t(id) * 0x9e3779b97f4a7c15ull);
      }
      std::vector<float> grads(batch.size() * dim);
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(int(i % 7) - 3);
      std::map<int64_t, std::vector<float>> sums;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        auto& s = sums[batch[i]];
        s.resize(dim);
        for (uint32_t j = 0; j < dim; ++j) s[j] += grads[i * dim + j];
      }
      auto before = pull_rows(client, name, batch, dim);
      // Every position of an id gets the same row.
      std::map<int64_t, std::size_t> first;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        auto [it, fresh] = first.emplace(batch[i], i);
        if (!fresh) {
          REQUIRE(std::equal(before.begin() + i * dim, before.begin() + (i + 1) * dim,
                             before.begin() + it->second * dim));
        }
      }
      REQUIRE(client.push_rows(name, batch, grads) == PushStatus::kApplied);
      auto after = pull_rows(client, name, batch, dim);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        for (uint32_t j = 0; j < dim; ++j) {
          REQUIRE(after[i * dim + j] == before[i * dim + j] - sums[batch[i]][j]);
        }
      }
    }
    // Row i of a fixed table starts as drawn from (seed, i), whichever path brought it.
    std::vector<int64_t> one = {ids[0]};
    auto alone = pull_rows(client, "w5", one, 5);
    auto in_batch = pull_rows(client, "w5", ids, 5);
    CHECK(std::equal(alone.begin(), alone.end(), in_batch.begin()));
    CHECK(client.stats()[0].rejected == 0);
  }
}

TEST_CASE("a dynamic table takes any 64-bit id, and refuses new ones at its row limit") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  client.create_tables({dynamic("d", 2, 3)});
  const std::vector<int64_t> ids = {-1, std::numeric_limits<int64_t>::min(), 12345};
  CHECK(pull_rows(client, "d", ids, 2) == std::vector<float>(6, 0.0f));
  client.push_rows("d", ids, std::vector<float>{1, 1, 2, 2, 3, 3});
  CHECK_THROWS_WITH(client.push_rows("d", std::vector<int64_t>{7}, std::vector<float>{1, 1}),
                    Catch::Contains("at its limit of 3 rows"));
  CHECK_THROWS_WITH(pull_rows(client, "d", {12345, 8}, 2),
                    Catch::Contains("at its limit of 3 rows"));
  CHECK(pull_rows(client, "d", ids, 2) == std::vector<float>{-1, -1, -2, -2, -3, -3});
  CHECK(client.list_tables().at(0).rows == 3);
}

TEST_CASE("a dynamic table evicting its least recently touched rows counts evictions") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  client.create_tables({dynamic("d", 1, 2, OnRowLimit::kEvictLru)});
  client.push_rows("d", std::vector<int64_t>{1, 2}, std::vector<float>{1, 2});
  pull_rows(client, "d", {1}, 1);
  client.push_rows("d", std::vector<int64_t>{3}, std::vector<float>{3});  // evicts 2
  CHECK(pull_rows(client, "d", {1, 3}, 1) == std::vector<float>{-1, -3});
  auto t = client.list_tables().at(0);
  CHECK(t.evictions == 1);
  CHECK(t.rows == 2);
}

TEST_CASE("lookup_rows reads rows as pull_rows would and creates none, on every shard") {
  PsdProcess a, b;
  Client client(options_for({&a, &b}));
  TableSpec spec = dynamic("d", 4, 1000, OnRowLimit::kEvictLru);
  spec.init = InitConfig::uniform(-1, 1, 9);
  client.create_tables({spec});
  std::vector<int64_t> trained(100);
  std::iota(trained.begin(), trained.end(), 0);
  client.push_rows("d", trained, std::vector<float>(trained.size() * 4, 0.5f));
  const auto held = pull_rows(client, "d", trained, 4);

  // 300,000 ids, a third of them trained: large enough to go in parts.
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 300000; ++i) ids.push_back(i % 3 == 0 ? i % 100 : 1000000 + i);
  std::vector<float> seen(ids.size() * 4), seen_async(ids.size() * 4);
  client.lookup_rows("d", ids, seen);
  client.lookup_rows_async("d", ids, seen_async).get();
  CHECK(seen == seen_async);
  auto t = client.list_tables().at(0);
  CHECK(t.rows == 100);
  CHECK(t.evictions == 0);
  for (std::size_t i = 0; i < ids.size(); i += 3) {
    INFO("position " << i);
    REQUIRE(std::equal(seen.begin() + i * 4, seen.begin() + i * 4 + 4, held.begin() + ids[i] * 4));
  }
  // An unseen id read its initial values: a pull now creates it with them.
  const std::vector<int64_t> some(ids.begin() + 1, ids.begin() + 401);
  CHECK(pull_rows(client, "d", some, 4) ==
        std::vector<float>(seen.begin() + 4, seen.begin() + 4 + some.size() * 4));
  const auto unseen = std::count_if(some.begin(), some.end(), [](int64_t id) { return id >= 100; });
  CHECK(unseen == 267);
  CHECK(client.list_tables().at(0).rows == 100 + uint64_t(unseen));

  // A table at its limit that refuses new ids answers lookups of them.
  client.create_tables({dynamic("full", 2, 1)});
  std::vector<float> two(2 * 2);
  const std::vector<int64_t> first{5}, more{6, 7};
  client.pull_rows("full", first, std::span<float>(two).first(2));
  CHECK_THROWS_WITH(client.pull_rows("full", more, two), Catch::Contains("at its limit"));
  client.lookup_rows("full", more, two);
  CHECK(two == std::vector<float>(4, 0.0f));
  CHECK_THROWS_WITH(client.lookup_rows("nope", more, two), Catch::Contains("nope"));
  CHECK(a.alive());
  CHECK(b.alive());
}

TEST_CASE("a table admitting ids by count gives rows at the min_count-th push, on every shard") {
  PsdProcess a, b;
  Client client(options_for({&a, &b}));
  TableSpec spec = dynamic("d", 2);
  spec.min_count = 2;
  spec.init = InitConfig::constant(1);
  client.create_tables({spec});
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 1000);
  client.push_rows("d", ids, std::vector<float>(ids.size() * 2, 1.0f));  // each id's first: dropped
  auto t = client.list_tables().at(0);
  CHECK(t.rows == 0);
  CHECK(t.ids_filtered == 1000);
  CHECK(t.rows_per_shard[0] == 0);
  CHECK(pull_rows(client, "d", ids, 2) == std::vector<float>(ids.size() * 2, 1.0f));
  CHECK(client.list_tables().at(0).rows == 0);  // pulls create nothing

  const std::vector<int64_t> half(ids.begin(), ids.begin() + 500);
  client.push_rows("d", half, std::vector<float>(half.size() * 2, 0.5f));  // admitted, applied
  t = client.list_tables().at(0);
  CHECK(t.rows == 500);
  CHECK(t.ids_filtered == 1000);
  CHECK(t.rows_per_shard[0] > 100);
  CHECK(t.rows_per_shard[1] > 100);
  std::vector<float> want(ids.size() * 2, 1.0f);
  std::fill(want.begin(), want.begin() + 1000, 0.5f);
  CHECK(pull_rows(client, "d", ids, 2) == want);

  // The same spec again is the same table; another min_count is another.
  client.create_tables({spec});
  TableSpec other = spec;
  other.min_count = 3;
  CHECK_THROWS_WITH(client.create_tables({other}),
                    Catch::Contains("exists as a dynamic table of dim 2 (sgd, min_count 2)") &&
                        Catch::Contains("asked for a dynamic table of dim 2 (sgd, min_count 3)"));
  CHECK(a.alive());
  CHECK(b.alive());
}

TEST_CASE("rows untouched for expire_after_steps global steps are dropped, on every shard") {
  PsdProcess a, b;
  Client client(options_for({&a, &b}, 0));
  client.init_job({.mode = SyncMode::kAsync});
  TableSpec spec = dynamic("e", 2);
  spec.expire_after_steps = 2;
  spec.init = InitConfig::constant(1);
  client.create_tables({spec});
  client.set_ready();
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 5000);
  const std::vector<int64_t> kept(ids.begin(), ids.begin() + 500);
  client.push_rows("e", ids, std::vector<float>(ids.size() * 2, 0.5f));  // all touched at step 0
  CHECK(client.step_done(0).global_step == 1);
  pull_rows(client, "e", kept, 2);  // half touched at step 1
  CHECK(client.list_tables().at(0).rows == 1000);
  CHECK(client.step_done(1).global_step == 2);  // the other half, untouched for 2 steps, goes
  auto t = client.list_tables().at(0);
  CHECK(t.rows == 500);
  CHECK(t.rows_expired == 500);
  CHECK(t.evictions == 0);
  CHECK(t.rows_per_shard[0] > 100);
  CHECK(t.rows_per_shard[1] > 100);
  std::vector<float> want(ids.size() * 2, 1.0f);  // the expired rows read as new ones
  std::fill(want.begin(), want.begin() + 1000, 0.5f);
  std::vector<float> rows(ids.size() * 2);
  client.lookup_rows("e", ids, rows);
  CHECK(rows == want);
  client.step_done(2);
  CHECK(client.step_done(3).global_step == 4);
  CHECK(client.list_tables().at(0).rows_expired == 1000);
  // A table created at step 4 stamps its rows from there: they last until step 6.
  TableSpec late = spec;
  late.name = "late";
  client.create_tables({late});
  pull_rows(client, "late", kept, 2);
  CHECK(client.step_done(4).global_step == 5);
  CHECK(client.list_tables().at(1).name == "late");
  CHECK(client.list_tables().at(1).rows == kept.size());
  client.step_done(5);
  CHECK(client.list_tables().at(1).rows_expired == kept.size());

  // The same spec again is the same table; another expire_after_steps is another.
  client.create_tables({spec});
  TableSpec other = spec;
  other.expire_after_steps = 3;
  CHECK_THROWS_WITH(
      client.create_tables({other}),
      Catch::Contains("exists as a dynamic table of dim 2 (sgd, expire_after_steps 2)") &&
          Catch::Contains("(sgd, expire_after_steps 3)"));
  TableSpec fixed_expiring = fixed("f", 10, 2);
  fixed_expiring.expire_after_steps = 2;
  CHECK_THROWS_WITH(client.create_tables({fixed_expiring}),
                    Catch::Contains("rows expire (expire_after_steps) in dynamic tables only"));
  CHECK(a.alive());
  CHECK(b.alive());
}

TEST_CASE("a job that starts at a later step stamps the rows of tables created before it there") {
  PsdProcess psd;
  Client chief(options_for({&psd}, 0));
  TableSpec spec = dynamic("e", 1);
  spec.expire_after_steps = 100;
  chief.create_tables({spec});
  chief.init_job({.mode = SyncMode::kAsync, .start_step = 5000});
  chief.set_ready();
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> rows(ids.size());
  chief.pull_rows("e", ids, rows);  // touched at step 5000, not 0
  CHECK(chief.step_done(5000).global_step == 5001);
  const auto t = chief.list_tables().at(0);
  CHECK(t.rows == 1000);
  CHECK(t.rows_expired == 0);
}

TEST_CASE("rows in slots that expiry freed take no more of --max_memory_mb") {
  // Each step brings 3,500 new rows of 64 floats (0.95 MiB with their index; one request, so no
  // other reply is held while psd checks it); eight steps' rows would take 7.6 MiB, but those of
  // the step before last expire, so two steps' rows (2.2 MiB) stay and their slots are reused. A
  // charge for the reused slots would take psd past its 3 MiB from the third step on.
  PsdProcess psd({"--max_memory_mb", "3"});
  Client chief(options_for({&psd}, 0));
  chief.init_job({.mode = SyncMode::kAsync});
  TableSpec spec = dynamic("e", 64);
  spec.expire_after_steps = 2;
  chief.create_tables({spec});
  chief.set_ready();
  std::vector<int64_t> ids(3500);
  std::vector<float> rows(ids.size() * 64);
  for (int64_t step = 0; step < 8; ++step) {
    std::iota(ids.begin(), ids.end(), step * 3500);
    INFO("step " << step);
    CHECK_NOTHROW(chief.pull_rows("e", ids, rows));
    chief.step_done(step);
  }
  const auto t = chief.list_tables().at(0);
  CHECK(t.rows_expired >= 6 * 3500);
  CHECK(t.rows <= 2 * 3500);
  CHECK(t.bytes < 3u << 20);
  // New rows beyond the free slots are still charged: 20,000 more at once do not fit.
  std::vector<int64_t> many(20000);
  std::iota(many.begin(), many.end(), 1000000);
  std::vector<float> out(many.size() * 64);
  CHECK_THROWS_WITH(chief.pull_rows("e", many, out), Catch::Contains("memory"));
}

TEST_CASE("new rows of an LRU table at its row limit take evicted rows' slots, not more memory") {
  // 4,000 rows of 64 floats (about 1.2 MiB with their index and links) fill the limit; each later
  // batch of 3,500 new ids (one request) evicts as many rows and takes their slots. A charge for
  // them as new memory (0.96 MiB) would take psd past its 2 MiB.
  PsdProcess psd({"--max_memory_mb", "2"});
  Client client(options_for({&psd}));
  client.create_tables({dynamic("lru", 64, 4000, OnRowLimit::kEvictLru)});
  std::vector<int64_t> ids(4000);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> rows(ids.size() * 64);
  client.pull_rows("lru", ids, rows);
  const uint64_t full = client.list_tables().at(0).bytes;
  ids.resize(3500);
  rows.resize(ids.size() * 64);
  for (int64_t batch = 1; batch <= 4; ++batch) {
    INFO("batch " << batch);
    std::iota(ids.begin(), ids.end(), batch * 10000);
    CHECK_NOTHROW(client.pull_rows("lru", ids, rows));
  }
  const auto t = client.list_tables().at(0);
  CHECK(t.rows == 4000);
  CHECK(t.evictions == 4 * 3500);
  CHECK(t.bytes == full);
  // Below the limit new rows are charged: another table's 20,000 rows do not fit.
  client.create_tables({dynamic("other", 64)});
  std::vector<int64_t> many(20000);
  std::iota(many.begin(), many.end(), 0);
  std::vector<float> out(many.size() * 64);
  CHECK_THROWS_WITH(client.pull_rows("other", many, out), Catch::Contains("memory"));
}

TEST_CASE("a restarted psd's expiring rows keep the steps since their last touch") {
  ps::test::TempDir dir;
  const std::vector<std::string> args = {"--checkpoint_dir", dir.path(), "--checkpoint_secs", "0"};
  TableSpec spec = dynamic("e", 1);
  spec.expire_after_steps = 3;
  {
    PsdProcess psd(args);
    Client chief(options_for({&psd}, 0));
    chief.init_job({.mode = SyncMode::kAsync});
    chief.create_tables({spec});
    chief.set_ready();
    // Id 3 is last touched at step 3, 4 at step 4, 5 at step 5.
    for (int64_t step = 0; step <= 5; ++step) {
      std::vector<int64_t> ids;
      for (int64_t id = std::max<int64_t>(3, step); id <= 5; ++id) ids.push_back(id);
      pull_rows(chief, "e", ids, 1);
      if (step < 5) chief.step_done(step);
    }
    REQUIRE(chief.checkpoint().step == 5);
    psd.kill();
  }
  PsdProcess psd(args);
  Client chief(options_for({&psd}, 0));
  chief.declare_tables({spec});
  CHECK(chief.list_tables().at(0).rows == 3);
  // One a step, as they would have gone without the restart.
  CHECK(chief.step_done(5).global_step == 6);
  CHECK(chief.list_tables().at(0).rows == 2);  // 3 went: untouched since step 3
  CHECK(chief.step_done(6).global_step == 7);
  CHECK(chief.list_tables().at(0).rows == 1);
  chief.step_done(7);
  const auto t = chief.list_tables().at(0);
  CHECK(t.rows == 0);
  CHECK(t.rows_expired == 3);
}

TEST_CASE("a restarted psd keeps the admission counts of ids not yet admitted") {
  ps::test::TempDir dir;
  const std::vector<std::string> args = {"--checkpoint_dir", dir.path(), "--checkpoint_secs", "0"};
  TableSpec spec = dynamic("a", 2);
  spec.min_count = 3;
  spec.count_sketch_width = 1 << 16;
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 0);
  const std::vector<float> grads(ids.size() * 2, 1.0f);
  {
    PsdProcess psd(args);
    Client chief(options_for({&psd}, 0));
    chief.create_tables({spec});
    chief.push_rows("a", ids, grads);
    chief.push_rows("a", ids, grads);  // each id counted twice
    CHECK(chief.list_tables().at(0).rows == 0);
    chief.checkpoint();
    psd.kill();
  }
  PsdProcess psd(args);
  Client chief(options_for({&psd}, 0));
  chief.declare_tables({spec});
  chief.push_rows("a", ids, grads);  // the third push admits them all
  CHECK(chief.list_tables().at(0).rows == ids.size());
  CHECK_THAT(psd.log(), !Catch::Contains("admission counts start again"));
}

TEST_CASE("a restore into a table at its limit evicts none of the rows it restores") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  client.create_tables({dynamic("d", 1, 2, OnRowLimit::kEvictLru)});
  client.push_rows("d", std::vector<int64_t>{1, 2}, std::vector<float>{1, 2});
  pull_rows(client, "d", {2}, 1);  // 1 is the least recently used
  // 3 is new, 1 is held: 2 alone makes room, as a pull or push of {3, 1} would.
  client.restore_rows("d", std::vector<int64_t>{3, 1}, std::vector<float>{30, 10}, {}, 1);
  auto t = client.list_tables().at(0);
  CHECK(t.evictions == 1);
  CHECK(t.rows == 2);
  CHECK(pull_rows(client, "d", {3, 1}, 1) == std::vector<float>{30, 10});
  CHECK(client.list_tables().at(0).evictions == 1);
}

TEST_CASE("bad table requests are refused with a clear error, change nothing, and psd serves on") {
  PsdProcess psd({"--max_memory_mb", "1", "--max_message_mb", "2"});
  Client client(options_for({&psd}));
  client.create_tables({fixed("emb", 8, 2, 1, InitConfig::constant(1)), fixed("wide", 8, 64)});
  RawShard raw(psd);
  auto unchanged = [&] {
    CHECK(pull_rows(client, "emb", {0, 1, 7}, 2) == std::vector<float>(6, 1.0f));
    CHECK(raw.pull("emb", {7}) == std::vector<float>{1, 1});
  };
  SECTION("unknown table") {
    CHECK_THROWS_WITH(raw.pull("nope", {1}), Catch::Contains("no table 'nope'"));
    CHECK_THROWS_WITH(raw.push("nope", {1}, {1, 1}), Catch::Contains("no table 'nope'"));
    CHECK_THROWS_WITH(pull_rows(client, "nope", {1}, 2), Catch::Contains("no table 'nope'"));
  }
  SECTION("an id outside a fixed table") {
    CHECK_THROWS_WITH(raw.pull("emb", {1, 8}),
                      Catch::Contains("id 8 is outside table 'emb' of 8 rows"));
    CHECK_THROWS_WITH(raw.push("emb", {1, 8}, {1, 1, 1, 1}), Catch::Contains("id 8 is outside"));
    CHECK_THROWS_WITH(
        client.push_rows("emb", std::vector<int64_t>{1, -1}, std::vector<float>(4, 1.0f)),
        Catch::Contains("id -1 is outside"));
  }
  SECTION("wrong gradient length: ids and rows of different counts") {
    CHECK_THROWS_WITH(raw.push("emb", {1, 2}, {1, 1, 1}),
                      Catch::Contains("2 ids need 4 gradient floats, got 3"));
    CHECK_THROWS_WITH(raw.push("emb", {1}, {1, 1, 1, 1}),
                      Catch::Contains("1 ids need 2 gradient floats, got 4"));
    CHECK_THROWS_WITH(client.push_rows("emb", std::vector<int64_t>{1}, std::vector<float>{1}),
                      Catch::Contains("has dim 2"));
  }
  SECTION("NaN and Inf rows") {
    const float nan = std::numeric_limits<float>::quiet_NaN(),
                inf = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH(raw.push("emb", {1, 2}, {1, 1, nan, 1}), Catch::Contains("NaN"));
    CHECK_THROWS_WITH(raw.push("emb", {1, 2}, {1, 1, 1, -inf}), Catch::Contains("Inf"));
  }
  SECTION("a table another way than it exists, or larger than --max_memory_mb") {
    CHECK_THROWS_WITH(client.create_tables({fixed("emb", 9, 2)}),
                      Catch::Contains("exists as a fixed 8-row table"));
    CHECK_THROWS_WITH(client.create_tables({fixed("big", 1 << 20, 1)}),
                      Catch::Contains("--max_memory_mb"));
    // A count sketch's counters are the table's memory too (16 MiB by default).
    TableSpec admitting = dynamic("admitting", 2);
    admitting.min_count = 2;
    CHECK_THROWS_WITH(client.create_tables({admitting}), Catch::Contains("--max_memory_mb"));
    admitting.count_sketch_width = 1u << 29;
    CHECK_THROWS_WITH(client.create_tables({admitting}), Catch::Contains("at most 268435456"));
    admitting.count_sketch_width = 0;
    admitting.min_count = 300;
    CHECK_THROWS_WITH(client.create_tables({admitting}), Catch::Contains("at most 255"));
    CHECK(client.list_tables().size() == 2);  // nothing created by the refusals
    admitting.min_count = 2;
    admitting.count_sketch_width = 1024;  // 4 KiB: within the budget
    client.create_tables({admitting});
    client.push_rows("admitting", std::vector<int64_t>{5}, std::vector<float>{1, 1});
    for (const auto& t : client.list_tables())
      CHECK(t.ids_filtered == (t.name == "admitting" ? 1u : 0u));
    CHECK_THROWS_WITH(client.create_tables({fixed("zero", 0, 1)}), Catch::Contains("0 rows"));
    CHECK_THROWS_WITH(client.create_tables({fixed("hashed", 100, 64, 1, {}, TablePlacement::kHash)}),
                      Catch::Contains("placed by 'mod' or 'div'"));
    CHECK(client.list_tables().size() == 3);
  }
  SECTION("a pull whose reply is over the message limit") {
    std::vector<uint64_t> many(10000, 1);  // 2.56 MB of rows asked for in 80 kB: over 2 MiB
    CHECK_THROWS_WITH(raw.pull("wide", many), Catch::Contains("over this psd's message limit"));
    std::vector<int64_t> split(many.begin(), many.end());
    std::vector<float> rows(split.size() * 64, 1.0f);
    client.pull_rows("wide", split, rows);  // the client sends it in several requests
    CHECK(rows == std::vector<float>(rows.size(), 0.0f));
  }
  SECTION("a batch too big for one message is split by the client") {
    std::vector<int64_t> many(300000);
    for (std::size_t i = 0; i < many.size(); ++i) many[i] = int64_t(i % 8);
    std::vector<float> g(many.size() * 2, 0.0f);
    client.push_rows("emb", many, g);
    auto rows = pull_rows(client, "emb", many, 2);
    CHECK(rows == std::vector<float>(many.size() * 2, 1.0f));
  }
  unchanged();
  CHECK(psd.alive());
}

TEST_CASE("pull_rows refuses an out that shares memory with its ids, before anything is sent") {
  // A large pull plans later parts from the ids while rows land in out:
  // rows written over the ids would be ids never checked.
  PsdProcess psd;
  Client c(options_for({&psd}));
  c.create_tables({fixed("t", 8, 1)});
  std::vector<int64_t> buffer{1, 2, 3, 4, 0, 0};
  const std::span<const int64_t> ids(buffer.data(), 4);
  auto* floats = reinterpret_cast<float*>(buffer.data());
  CHECK_THROWS_WITH(c.pull_rows("t", ids, std::span<float>(floats + 6, 4)),
                    Catch::Contains("shares memory with the ids"));
  CHECK(buffer == std::vector<int64_t>{1, 2, 3, 4, 0, 0});
  // Right after the ids, not over them: pulled.
  c.pull_rows("t", ids, std::span<float>(floats + 8, 4));
  CHECK(std::vector<float>(floats + 8, floats + 12) == std::vector<float>(4, 0.0f));
  CHECK(c.stats()[0].pulls > 0);
}

TEST_CASE("table names are checked as tensor names are: at create and on every request") {
  PsdProcess psd;
  RawShard raw(psd, 0);
  raw.create(fixed("a", 4, 1));
  const std::string nul("a\0b", 3);
  CHECK_THROWS_WITH(
      raw.create(fixed(nul, 4, 1)),
      Catch::Contains("createTables: table name holds control character 0x00 at byte 1"));
  CHECK_THROWS_WITH(raw.create(fixed("tab\there", 4, 1)),
                    Catch::Contains("control character 0x09"));
  CHECK_THROWS_WITH(raw.create(fixed("del\x7f", 4, 1)), Catch::Contains("control character 0x7f"));
  CHECK_THROWS_WITH(raw.create(fixed(std::string(513, 'x'), 4, 1)),
                    Catch::Contains("1 to 512 bytes, got 513"));
  // A request naming "a\0b" does not reach "a", and says why.
  CHECK_THROWS_WITH(raw.pull(nul, {1}),
                    Catch::Contains("pullRows: table name holds control character"));
  CHECK_THROWS_WITH(raw.push(nul, {1}, {5}),
                    Catch::Contains("pushRows: table name holds control character"));
  auto restore = raw.shard.restoreRowsRequest();
  restore.setTable(text(nul));
  restore.initIds(1).set(0, 1);
  const float value = 7;
  restore.setValues(kj::arrayPtr(reinterpret_cast<const kj::byte*>(&value), sizeof(value)));
  CHECK_THROWS_WITH(restore.send().wait(raw.ws()),
                    Catch::Contains("restoreRows: table name holds control character"));
  CHECK(raw.pull("a", {1}) == std::vector<float>{0});
  // libpsclient refuses such a name before sending it (Text would cut it at the NUL).
  Client client(options_for({&psd}));
  CHECK_THROWS_WITH(client.create_tables({fixed(nul, 4, 1)}), Catch::Contains("control character"));
  CHECK_THROWS_WITH(client.declare_tables({fixed(nul, 4, 1)}),
                    Catch::Contains("control character"));
  std::vector<float> row(1);
  CHECK_THROWS_WITH(client.pull_rows(nul, std::vector<int64_t>{1}, row),
                    Catch::Contains("no table"));
  const auto tables = client.list_tables();
  REQUIRE(tables.size() == 1);
  CHECK(tables[0].name == "a");
  CHECK(psd.alive());
}

TEST_CASE("a push of rows that would store NaN or Inf is refused whole, as a dense update is") {
  PsdProcess psd;
  RawShard raw(psd, 0);
  // Next to FLT_MAX: one SGD step at learning rate 1e38 overflows.
  raw.create(fixed("hot", 4, 2, 1e38f, InitConfig::constant(3e38f)));
  // Adagrad: a large finite gradient overflows the accumulator (g^2).
  raw.create(TableSpec{.name = "acc",
                       .dim = 1,
                       .rows = 4,
                       .optimizer = RowOptimizerConfig::adagrad(0.1f),
                       .init = InitConfig::constant(1)});
  CHECK_THROWS_WITH(raw.push("hot", {1, 2}, {0, 0, -3, 0}), Catch::Contains("NaN or Inf"));
  CHECK_THROWS_WITH(raw.push("acc", {0, 3}, {1, 1e20f}), Catch::Contains("NaN or Inf"));
  // Repeated ids are summed first: each half passes alone, not their sum.
  CHECK_THROWS_WITH(raw.push("hot", {1, 1}, {-1.5f, 0, -1.5f, 0}), Catch::Contains("NaN or Inf"));
  CHECK(raw.pull("hot", {1, 2}) == std::vector<float>(4, 3e38f));  // nothing applied
  CHECK(raw.pull("acc", {0, 3}) == std::vector<float>{1, 1});
  CHECK(raw.push("hot", {2}, {1, 1}) == wire::PushStatus::APPLIED);  // a step that fits
  for (float v : raw.pull("hot", {2})) CHECK(v == Approx(2e38f).epsilon(1e-6));
  // LazyAdam and FTRL: a larger one overflows the second moment ((1 - b2) g^2)
  // and the accumulator; row 0's update alone would fit.
  for (const auto& [name, optimizer] : {std::pair{"adam", RowOptimizerConfig::lazy_adam(0.1f)},
                                        std::pair{"ftrl", RowOptimizerConfig::ftrl(0.1f)}}) {
    INFO(name);
    raw.create(TableSpec{.name = name,
                         .dim = 1,
                         .rows = 4,
                         .optimizer = optimizer,
                         .init = InitConfig::constant(1)});
    CHECK_THROWS_WITH(raw.push(name, {0, 3}, {1, 1e22f}), Catch::Contains("NaN or Inf"));
    CHECK(raw.pull(name, {0, 3}) == std::vector<float>{1, 1});
    CHECK(raw.push(name, {0}, {1}) == wire::PushStatus::APPLIED);
    CHECK(raw.pull(name, {0})[0] != 1.0f);
  }
  CHECK(psd.alive());
}

TEST_CASE("a push split over requests is checked as psd gets it: repeated ids' sums included") {
  PsdProcess psd;
  ClientOptions o = options_for({&psd});
  o.max_request_bytes = 4096;  // a few hundred rows per request: the push below takes several
  Client client(o);
  client.create_tables({fixed("emb", 2000, 2, 1.0f, InitConfig::constant(1))});
  std::vector<int64_t> ids(1500);
  std::iota(ids.begin(), ids.end(), 0);
  ids.back() = 0;  // id 0 twice, at the start and at the end
  std::vector<float> g(ids.size() * 2, 0.5f);
  g[0] = g[g.size() - 2] = 3e38f;  // each finite; their sum is Inf
  CHECK_THROWS_WITH(client.push_rows("emb", ids, g),
                    Catch::Contains("more than once") && Catch::Contains("nothing was sent"));
  std::vector<int64_t> all(2000);
  std::iota(all.begin(), all.end(), 0);
  CHECK(pull_rows(client, "emb", all, 2) == std::vector<float>(4000, 1.0f));  // none applied
  g[0] = 1.0f;  // the same push with a finite sum goes through, whole
  client.push_rows("emb", ids, g);
  CHECK(pull_rows(client, "emb", {1, 1498}, 2) == std::vector<float>(4, 0.5f));
  CHECK(psd.alive());
}

TEST_CASE("a push that says its ids are distinct and repeats one is applied as separate pushes") {
  // libpsclient sums repeats and says so (idsDistinct), and psd skips its
  // search for them. A sender that says so wrongly gets each of a repeated
  // id's gradients as its own update, as if it had pushed them one by one;
  // where that could hurt the table (a request psd spreads over threads) the
  // repeats are summed as for any push. psd serves on either way.
  for (const char* threads : {"1", "3"}) {
    INFO("--table_threads " << threads);
    PsdProcess psd({"--table_threads", threads});
    RawShard raw(psd, 0);
    TableSpec spec = fixed("lied", 5000, 2, 1.0f, InitConfig::constant(1));
    spec.optimizer = RowOptimizerConfig::adagrad(0.5f, 0.1f);
    raw.create(spec);
    spec.name = "separate";
    raw.create(spec);
    spec.name = "summed";
    raw.create(spec);
    // 4,000 ids (psd with 3 table threads cuts them in parts), id 7 twice.
    std::vector<uint64_t> ids(4000);
    std::iota(ids.begin(), ids.end(), 0);
    ids[3999] = 7;
    std::vector<float> g(ids.size() * 2, 0.25f);
    g[2 * 3999] = g[2 * 3999 + 1] = 2.0f;
    CHECK(raw.push("lied", ids, g, 0, 0, /*ids_distinct=*/true) == wire::PushStatus::APPLIED);
    CHECK(raw.push("summed", ids, g) == wire::PushStatus::APPLIED);
    raw.push("separate", std::vector<uint64_t>(ids.begin(), ids.end() - 1),
             std::vector<float>(g.begin(), g.end() - 2));
    raw.push("separate", {7}, {2.0f, 2.0f});
    const std::vector<uint64_t> some = {0, 7, 3998};
    const auto lied = raw.pull("lied", some), separate = raw.pull("separate", some),
               summed = raw.pull("summed", some);
    if (std::string(threads) == "1") {
      CHECK(lied == separate);
    } else {
      CHECK(lied == summed);
    }
    CHECK(separate != summed);  // Adagrad: two updates are not one of their sum
    CHECK(lied[0] == summed[0]);
    CHECK(psd.alive());
  }
}

TEST_CASE("a split push of rows to a psd that allows NaN/Inf is sent, as a dense one is") {
  PsdProcess psd({"--allow_nonfinite"});
  ClientOptions o = options_for({&psd});
  o.max_request_bytes = 4096;  // several requests
  Client client(o);
  client.create_tables({fixed("emb", 2000, 2, 1.0f, InitConfig::constant(1))});
  std::vector<int64_t> ids(1500);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> g(ids.size() * 2, 0.5f);
  g[2 * 700] = std::numeric_limits<float>::quiet_NaN();
  client.push_rows("emb", ids, g);  // psd takes NaN: the client does not refuse it for psd
  const std::vector<float> rows = pull_rows(client, "emb", {1, 700, 1499}, 2);
  CHECK(rows[0] == 0.5f);
  CHECK(std::isnan(rows[2]));
  CHECK(rows[3] == 0.5f);
  CHECK(rows[4] == 0.5f);
}

TEST_CASE("ids a client picks to collide in psd's hash tables are served as fast as any") {
  // 200,000 new ids of a dynamic table in one push, chosen to share one home
  // under the fixed key psd's index used (and under none, as its request
  // set did): in one cluster, some 2e10 probes (minutes of psd's loop).
  PsdProcess psd;
  RawShard raw(psd, 0);
  raw.create(dynamic("d", 1));
  for (uint64_t fixed_key : {uint64_t{0x5bd1e995u}, uint64_t{0}}) {
    INFO("fixed key " << fixed_key);
    const std::vector<uint64_t> ids = ps::test::colliding_ids(200000, fixed_key);
    const auto start = std::chrono::steady_clock::now();
    CHECK(raw.push("d", ids, std::vector<float>(ids.size(), 0.5f)) == wire::PushStatus::APPLIED);
    CHECK(raw.pull("d", {ids.front(), ids[123456], ids.back()}) == std::vector<float>(3, -0.5f));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  }
  CHECK(psd.alive());
}

TEST_CASE("a sync step's rows are applied without a check only when every push was within bound") {
  // SGD at learning rate 1e38 from 3e38: a step of -1 overflows; one of
  // -1e-9 (under half the safe bound of 2^102 / 1e38, about 5e-8) cannot.
  PsdProcess psd;
  Client chief(options_for({&psd}, 0));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create_tables({fixed("hot", 4, 1, 1e38f, InitConfig::constant(3e38f))});
  chief.set_ready();
  RawShard w0(psd, 0), w1(psd, 1);
  // Step 0: two small gradients for id 1 (and a repeat of it in one push),
  // applied: 3e38 - 1e38 * (-1e-9 - 2e-9) / 2.
  CHECK(w0.push("hot", {1}, {-1e-9f}) == wire::PushStatus::ACCUMULATED);
  CHECK(w1.push("hot", {1, 1}, {-1e-9f, -1e-9f}) == wire::PushStatus::ACCUMULATED);
  const float after = 3e38f - 1e38f * ((-1e-9f + (-1e-9f + -1e-9f)) * 0.5f);
  CHECK(w0.pull("hot", {1, 2}) == std::vector<float>{after, 3e38f});
  // Step 1: each gradient finite, their average overflows: nothing applied.
  CHECK(w0.push("hot", {1, 2}, {-1e-9f, -1.0f}, 0, 1) == wire::PushStatus::ACCUMULATED);
  CHECK(w1.push("hot", {2}, {-1.0f}, 0, 1) == wire::PushStatus::ACCUMULATED);
  CHECK(w0.pull("hot", {1, 2}) == std::vector<float>{after, 3e38f});
  CHECK_THAT(psd.log(), Catch::Contains("table 'hot' not updated"));
  CHECK(psd.alive());
}

TEST_CASE("a sync step's new rows are charged against --max_memory_mb as its pushes come") {
  // 3,000 new rows of 64 floats map 1.1 MB (slabs and index), and the step's sums 0.9 MB; each
  // push is a 0.8 MB request. Until the step commits, its rows count as held: a second worker's
  // 3,000 other new ids (1.2 MB more rows, 0.6 MB more sums) would take psd to 4.5 MB, past its
  // 4 MiB, and are refused before they are summed (counted from the rows held alone, 3.4 MB, they
  // would pass). The same ids as the first push's add no rows: the step commits within budget.
  PsdProcess psd({"--max_memory_mb", "4"});
  Client chief(options_for({&psd}, 0));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create_tables({dynamic("a", 64)});
  chief.set_ready();
  RawShard w0(psd, 0), w1(psd, 1);
  std::vector<uint64_t> first(3000), other(3000);
  std::iota(first.begin(), first.end(), 0);
  std::iota(other.begin(), other.end(), 3000);
  const std::vector<float> g0(first.size() * 64, 1.0f), g1(first.size() * 64, 3.0f);
  CHECK(w0.push("a", first, g0) == wire::PushStatus::ACCUMULATED);
  CHECK_THROWS_WITH(w1.push("a", other, g1),
                    Catch::Contains("3000 new rows of table 'a'") && Catch::Contains("memory"));
  CHECK(chief.list_tables().at(0).rows == 0);
  CHECK(w1.push("a", first, g1) == wire::PushStatus::ACCUMULATED);  // the step commits
  const auto t = chief.list_tables().at(0);
  CHECK(t.rows == 3000);
  CHECK(t.bytes < 4u << 20);
  CHECK(w0.pull("a", {0, 2999}) == std::vector<float>(2 * 64, -2.0f));  // sgd(1) of the average
  CHECK(psd.alive());
}

TEST_CASE("a sync push in parts, from a client that took the job for async, is refused whole") {
  // The worker connects before the chief configures a sync job, so it sends a large push in
  // parts, as to an async job. Counted, the first part would stand for the worker's whole push
  // and the others come too late for the step: psd refuses each part instead, changing nothing.
  PsdProcess psd;
  Client worker(options_for({&psd}, 1));
  Client chief(options_for({&psd}, 0));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create_tables({dynamic("d", 64)});
  chief.set_ready();
  worker.declare_tables({dynamic("d", 64)});
  std::vector<int64_t> ids(9000);  // 2.3 MB of gradients: three parts of the default 1 MiB
  std::iota(ids.begin(), ids.end(), 0);
  const std::vector<float> grads(ids.size() * 64, 2.0f);
  CHECK_THROWS_WITH(
      worker.push_rows("d", ids, grads),
      Catch::Contains("came to this shard in 3 requests") && Catch::Contains("call wait_ready"));
  CHECK(chief.list_tables().at(0).rows == 0);
  // Once it has learned the job, the same push goes whole, and with the chief's the step commits.
  REQUIRE(worker.wait_ready(std::chrono::seconds(5)));
  CHECK(worker.push_rows("d", ids, grads) == PushStatus::kAccumulated);
  CHECK(chief.push_rows("d", ids, std::vector<float>(grads.size(), 4.0f)) ==
        PushStatus::kAccumulated);
  CHECK(pull_rows(chief, "d", {0, 8999}, 64) == std::vector<float>(2 * 64, -3.0f));
}

TEST_CASE("a sync step's gradients of ids picked to collide are summed as fast as any") {
  // psd sums a sync step's gradients per id in a hash table. In a standard
  // map (whose hash of an integer is the integer itself, its bucket count
  // known), ids that are multiples of that count share a bucket; psd's own
  // keyed set spreads them.
  constexpr std::size_t kIds = 200000;
  std::unordered_map<uint64_t, uint32_t> probe;
  for (uint64_t i = 0; i < kIds; ++i) probe.try_emplace(i, 0);
  const uint64_t buckets = probe.bucket_count();
  std::vector<uint64_t> ids(kIds);
  for (std::size_t k = 0; k < kIds; ++k) ids[k] = (k + 1) * buckets;
  PsdProcess psd;
  Client chief(options_for({&psd}, 0));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 1});
  chief.create_tables({dynamic("d", 1)});
  chief.set_ready();
  RawShard raw(psd, 0);
  const auto start = std::chrono::steady_clock::now();
  CHECK(raw.push("d", ids, std::vector<float>(kIds, 0.5f)) == wire::PushStatus::ACCUMULATED);
  CHECK(raw.pull("d", {ids.front(), ids.back()}) == std::vector<float>(2, -0.5f));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(psd.alive());
}

TEST_CASE("restored rows must keep the optimizer's slot invariants, or nothing is restored") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  const std::vector<int64_t> ids{1, 2};
  const std::vector<float> values{5, 6};
  struct Case {
    const char* table;
    RowOptimizerConfig optimizer;
    std::vector<std::vector<float>> bad, good;
    const char* error;
  };
  const float tiny = std::numeric_limits<float>::denorm_min();
  for (const Case& c : {Case{"ada",
                             RowOptimizerConfig::adagrad(0.1f),
                             {{0.5f, 0.0f}},
                             {{0.5f, tiny}},
                             "Adagrad's accumulator must be > 0"},
                        Case{"ada_negative",
                             RowOptimizerConfig::adagrad(0.1f),
                             {{-1.0f, 1.0f}},
                             {{1, 1}},
                             "Adagrad's accumulator must be > 0"},
                        Case{"adam",
                             RowOptimizerConfig::lazy_adam(0.1f),
                             {{-3.0f, 3.0f}, {1.0f, -1e-30f}},
                             {{-3.0f, 3.0f}, {1.0f, 0.0f}},
                             "second moment (v) must be >= 0"},
                        Case{"ftrl",
                             RowOptimizerConfig::ftrl(0.1f),
                             {{0.0f, 2.0f}, {-7.0f, 7.0f}},
                             {{tiny, 2.0f}, {-7.0f, 7.0f}},
                             "FTRL's accumulator must be > 0"}}) {
    INFO(c.table);
    client.create_tables({TableSpec{.name = c.table,
                                    .dim = 1,
                                    .rows = 4,
                                    .optimizer = c.optimizer,
                                    .init = InitConfig::constant(1)}});
    CHECK_THROWS_WITH(client.restore_rows(c.table, ids, values, c.bad, 7),
                      Catch::Contains("restoreRows") && Catch::Contains(c.error));
    CHECK(pull_rows(client, c.table, ids, 1) == std::vector<float>{1, 1});
    client.restore_rows(c.table, ids, values, c.good, 7);
    CHECK(pull_rows(client, c.table, ids, 1) == values);
  }
  CHECK(psd.alive());
}

TEST_CASE(
    "a restore with row ages that do not match its ids, or an update count near 2^64, is "
    "refused whole") {
  PsdProcess psd;
  Client client(options_for({&psd}));
  TableSpec spec = dynamic("e", 1);
  spec.optimizer = RowOptimizerConfig::lazy_adam(0.1f);
  spec.expire_after_steps = 10;
  client.create_tables({spec});
  const std::vector<int64_t> ids{1, 2};
  const std::vector<float> values{5, 6};
  const std::vector<std::vector<float>> slots{{0, 0}, {0, 0}};
  CHECK_THROWS_WITH(client.restore_rows("e", ids, values, slots, 3, std::vector<uint32_t>{1}),
                    Catch::Contains("2 ids, 1 row ages"));
  RawShard raw(psd);
  auto restore = raw.shard.restoreRowsRequest();
  restore.setTable("e");
  restore.setIds(kj::arrayPtr(reinterpret_cast<const uint64_t*>(ids.data()), ids.size()));
  restore.setValues(kj::arrayPtr(reinterpret_cast<const kj::byte*>(values.data()), 8));
  auto s = restore.initSlots(2);
  for (unsigned k = 0; k < 2; ++k)
    s.set(k, kj::arrayPtr(reinterpret_cast<const kj::byte*>(slots[k].data()), 8));
  restore.initAges(3);
  CHECK_THROWS_WITH(restore.send().wait(raw.ws()), Catch::Contains("2 ids, 3 row ages"));
  // LazyAdam's bias correction counts updates from the version: one about to wrap is refused.
  CHECK_THROWS_WITH(client.restore_rows("e", ids, values, slots, UINT64_MAX),
                    Catch::Contains("over 2^62 updates"));
  CHECK(client.list_tables().at(0).rows == 0);
  client.restore_rows("e", ids, values, slots, uint64_t{1} << 62, std::vector<uint32_t>{0, 9});
  CHECK(client.list_tables().at(0).rows == 2);
  CHECK(client.push_rows("e", ids, std::vector<float>{1, 1}) == PushStatus::kApplied);
  CHECK(pull_rows(client, "e", ids, 1) != values);  // updated, finite
  CHECK(psd.alive());
}

TEST_CASE("a retried push of rows (the same request id) is applied once") {
  PsdProcess psd;
  RawShard raw(psd, 0);
  raw.create(fixed("emb", 4, 1));
  CHECK(raw.push("emb", {2}, {1}, 77) == wire::PushStatus::APPLIED);
  CHECK(raw.push("emb", {2}, {1}, 77) == wire::PushStatus::APPLIED);
  CHECK(raw.pull("emb", {2}) == std::vector<float>{-1});
  CHECK(raw.push("emb", {2}, {1}, 78) == wire::PushStatus::APPLIED);
  CHECK(raw.pull("emb", {2}) == std::vector<float>{-2});
}

TEST_CASE(
    "sync mode: a step's rows are averaged over the replicas, stale and repeated pushes dropped") {
  PsdProcess ps0, ps1;
  ClientOptions o0 = options_for({&ps0, &ps1}, 0), o1 = options_for({&ps0, &ps1}, 1);
  o0.max_request_bytes = o1.max_request_bytes = 64;  // 4 ids a request outside sync mode
  Client chief(o0);
  Client other(o1);
  const TableSpec spec = fixed("emb", 20, 2, 1.0f);
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create_tables({spec});
  chief.set_ready();
  other.declare_tables({spec});
  REQUIRE(other.wait_ready(5s));
  // Worker 0 touches rows 0 and 1 (shards 0 and 1); worker 1 rows 1 and 2 only.
  CHECK(chief.push_rows("emb", std::vector<int64_t>{0, 1}, std::vector<float>{2, 2, 4, 4}, 0) ==
        PushStatus::kAccumulated);
  CHECK(chief.push_rows("emb", std::vector<int64_t>{0}, std::vector<float>{2, 2}, 0) ==
        PushStatus::kDuplicate);
  CHECK(pull_rows(chief, "emb", {0, 1, 2}, 2) ==
        std::vector<float>(6, 0.0f));  // nothing applied yet
  CHECK(other.push_rows("emb", std::vector<int64_t>{1, 2}, std::vector<float>{2, 2, 6, 6}, 0) ==
        PushStatus::kAccumulated);
  std::vector<float> rows(6);
  CHECK(chief.pull_rows("emb", std::vector<int64_t>{0, 1, 2}, rows, 1) == 1);
  CHECK(rows == std::vector<float>{-1, -1, -3, -3, -3, -3});
  CHECK(other.push_rows("emb", std::vector<int64_t>{1}, std::vector<float>{1, 1}, 0) ==
        PushStatus::kStale);
  CHECK(pull_rows(chief, "emb", {1}, 2) == std::vector<float>{-3, -3});
  // Step 1: six rows of shard 0 from one worker (more than one request's
  // worth outside sync mode) all count, averaged over both workers.
  const std::vector<int64_t> even = {0, 2, 4, 6, 8, 10};
  CHECK(chief.push_rows("emb", even, std::vector<float>(12, 2.0f), 1) == PushStatus::kAccumulated);
  CHECK(other.push_rows("emb", std::vector<int64_t>{0}, std::vector<float>{2, 2}, 1) ==
        PushStatus::kAccumulated);
  std::vector<float> after(12);
  CHECK(chief.pull_rows("emb", even, after, 2) == 2);
  CHECK(after == std::vector<float>{-3, -3, -4, -4, -1, -1, -1, -1, -1, -1, -1, -1});
}

TEST_CASE(
    "sync mode: a late push with new ids is reported stale, not refused, when the table is at its "
    "row limit") {
  // A backup worker's push comes after its step closed: its rows are never
  // created, so the table's row limit (or psd's memory) has nothing to say.
  PsdProcess psd;
  Client chief(options_for({&psd}, 0)), backup(options_for({&psd}, 1));
  const TableSpec spec = dynamic("dyn", 1, 2);  // at most 2 rows, refused past them
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 2});
  chief.create_tables({spec});
  chief.set_ready();
  backup.declare_tables({spec});
  REQUIRE(backup.wait_ready(5s));
  CHECK(chief.push_rows("dyn", std::vector<int64_t>{1, 2}, std::vector<float>{1, 1}, 0) ==
        PushStatus::kAccumulated);  // 1 of 1 replicas: step 0 applied
  CHECK(chief.list_tables().at(0).rows == 2);
  // The same step from the backup worker, with ids the table has no room for.
  CHECK(backup.push_rows("dyn", std::vector<int64_t>{3, 4}, std::vector<float>{1, 1}, 0) ==
        PushStatus::kStale);
  // In the open step, new ids past the limit are still refused.
  CHECK_THROWS_WITH(
      backup.push_rows("dyn", std::vector<int64_t>{3}, std::vector<float>{1}, 1),
      Catch::Contains("at its limit of 2 rows"));
  CHECK(chief.list_tables().at(0).rows == 2);
  CHECK(pull_rows(chief, "dyn", {1, 2}, 1) == std::vector<float>{-1, -1});
}

TEST_CASE("in a sync job only the chief adds trainable tensors and tables") {
  PsdProcess ps;
  Client chief(options_for({&ps}, 0));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create({TensorSpec{.name = "w", .shape = {2}}});
  chief.create_tables({fixed("emb", 4, 1)});
  chief.set_ready();
  Client worker(options_for({&ps}, 1));
  Client tool(options_for({&ps}));
  for (Client* c : {&worker, &tool}) {
    // A new one would hold every step of the job: refused, nothing created.
    CHECK_THROWS_WITH(c->create_tables({fixed("junk", 1, 1)}),
                      Catch::Contains("a new trainable table 'junk' in a sync job") &&
                          Catch::Contains("only the chief adds them"));
    CHECK_THROWS_WITH(c->create({TensorSpec{.name = "junk_w", .shape = {1}}}),
                      Catch::Contains("a new trainable tensor 'junk_w' in a sync job"));
    // What the chief created, asked for again, and a tensor no step counts: fine.
    CHECK_NOTHROW(c->create_tables({fixed("emb", 4, 1)}));
    CHECK_NOTHROW(c->create({TensorSpec{.name = "w", .shape = {2}}}));
  }
  CHECK_NOTHROW(tool.create({TensorSpec{.name = "metric", .shape = {1}, .trainable = false}}));
  CHECK(chief.list_tables().size() == 1);
  CHECK(chief.list().size() == 2);  // w and metric
  // The chief may still add one (its own program declares it, as its workers' do).
  CHECK_NOTHROW(chief.create_tables({fixed("late", 4, 1)}));
  CHECK(chief.list_tables().size() == 2);
}

TEST_CASE("sync mode: a pull of rows over several shards reads every shard at one step") {
  // A lookup as a pull: both read every shard at one step.
  const bool lookup = GENERATE(false, true);
  INFO((lookup ? "lookup_rows" : "pull_rows"));
  PsdProcess ps0, ps1;
  Client chief(options_for({&ps0, &ps1}, 0));
  // Backup workers: one push closes a step, so the shards can be a step apart.
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 2});
  chief.create_tables({fixed("emb", 4, 1)});  // 'mod': ids 0, 2 on shard 0; 1, 3 on shard 1
  chief.set_ready();
  {
    RawShard worker1(ps0, 1);  // step 0 closes on shard 0 only
    CHECK(worker1.push("emb", {0}, {1}) == wire::PushStatus::ACCUMULATED);
  }
  std::thread closes_shard1([&] {
    std::this_thread::sleep_for(300ms);
    RawShard worker1(ps1, 1);
    CHECK(worker1.push("emb", {1}, {2}) == wire::PushStatus::ACCUMULATED);
  });
  // Shard 0 is at step 1 and shard 1 at step 0: the rows of shard 1 are read
  // again once it reaches step 1, never a mix of the two steps.
  std::vector<float> rows(2);
  const std::vector<int64_t> ids{0, 1};
  const int64_t step =
      lookup ? chief.lookup_rows("emb", ids, rows) : chief.pull_rows("emb", ids, rows);
  closes_shard1.join();
  CHECK(step == 1);
  CHECK(rows == std::vector<float>{-1, -2});
}

TEST_CASE("sync mode: a pull of no ids waits for min_step and gives the step, as any pull") {
  PsdProcess ps0, ps1;
  Client chief(options_for({&ps0, &ps1}, 0));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 1});
  chief.create_tables({fixed("emb", 4, 1)});
  chief.set_ready();
  const std::vector<int64_t> no_ids;
  std::vector<float> none;
  for (int64_t step = 0; step < 2; ++step) {
    REQUIRE(chief.push_rows("emb", std::vector<int64_t>{1}, std::vector<float>{1}, step) ==
            PushStatus::kAccumulated);
  }
  // Before, a batch of no ids sent nothing and gave step 0 at once: a push
  // at that step was stale.
  CHECK(chief.pull_rows("emb", no_ids, none) == 2);
  CHECK(chief.lookup_rows("emb", no_ids, none) == 2);
  auto later = chief.pull_rows_async("emb", no_ids, none, 3);
  CHECK(later.wait_for(300ms) == std::future_status::timeout);
  REQUIRE(chief.push_rows("emb", std::vector<int64_t>{1}, std::vector<float>{1}, 2) ==
          PushStatus::kAccumulated);
  CHECK(later.get() == 3);
  CHECK(chief.push_rows("emb", no_ids, none, 3) == PushStatus::kAccumulated);
}

TEST_CASE(
    "checkpoints keep tables' rows and slots; a restart restores them, and a restore into another "
    "shard "
    "count moves rows to their new shards") {
  ps::test::TempDir dir;
  auto args = [&](int shard, int shards) {
    return std::vector<std::string>{
        "--checkpoint_dir",    dir.path(),     "--checkpoint_secs",   "0", "--shard_index",
        std::to_string(shard), "--num_shards", std::to_string(shards)};
  };
  const std::vector<TableSpec> specs = {
      TableSpec{.name = "fixed",
                .dim = 2,
                .rows = 10,
                .placement = TablePlacement::kDiv,
                .optimizer = RowOptimizerConfig::adagrad(0.5f),
                .init = InitConfig::uniform(-1, 1, 3)},
      TableSpec{.name = "dyn",
                .dim = 2,
                .dynamic = true,
                .placement = TablePlacement::kHash,
                .optimizer = RowOptimizerConfig::ftrl(0.5f, 0.01f, 0.1f)}};
  const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int64_t> dyn_ids = {5, -7, 1000000007, 42};
  auto train = [&](Client& c) {
    c.push_rows("fixed", std::vector<int64_t>{1, 8, 8}, std::vector<float>{1, 2, 3, 4, 5, 6});
    c.push_rows("dyn", dyn_ids, std::vector<float>{1, -1, 2, -2, 0.5f, 3, -4, 1});
  };
  auto read = [&](Client& c) {
    auto rows = pull_rows(c, "fixed", all, 2);
    auto d = pull_rows(c, "dyn", dyn_ids, 2);
    rows.insert(rows.end(), d.begin(), d.end());
    return rows;
  };
  std::vector<float> saved, after_one_more;
  {
    PsdProcess a(args(0, 2)), b(args(1, 2));
    Client client(options_for({&a, &b}));
    client.create_tables(specs);
    train(client);
    saved = read(client);
    auto ckpt = client.checkpoint();
    REQUIRE(ckpt.paths.size() == 2);
    uint64_t dyn_rows = 0;
    for (const auto& path : ckpt.paths) {
      for (const auto& t : read_checkpoint(path).tables) {
        if (t.spec.name == "dyn") dyn_rows += t.ids.size();  // only the rows that exist
        if (t.spec.name == "fixed") CHECK(t.slots.size() == 1);
      }
    }
    CHECK(dyn_rows == dyn_ids.size());
    train(client);
    after_one_more = read(client);
    a.kill();
    b.kill();
  }
  SECTION("a restarted psd restores its own tables") {
    PsdProcess a(args(0, 2)), b(args(1, 2));
    Client client(options_for({&a, &b}));
    client.declare_tables(specs);
    CHECK(read(client) == saved);
    train(client);  // the same update from the same rows and slots
    CHECK(read(client) == after_one_more);
  }
  SECTION("restored into three shards") {
    PsdProcess x({"--shard_index", "0", "--num_shards", "3"}),
        y({"--shard_index", "1", "--num_shards", "3"}),
        z({"--shard_index", "2", "--num_shards", "3"});
    Client client(options_for({&x, &y, &z}, 0));  // the chief
    RestoredModel m = restore_from_checkpoint(client, dir.path());
    REQUIRE(m.tables.size() == 2);
    CHECK(read(client) == saved);
    train(client);
    CHECK(read(client) == after_one_more);
    for (const auto& t : client.list_tables()) {
      if (t.name != "fixed") continue;
      RowPlacement place(TablePlacement::kDiv, 10, 3);
      for (uint32_t s = 0; s < 3; ++s) CHECK(t.rows_per_shard[s] == place.rows_on(s));
    }
  }
}

TEST_CASE(
    "a checkpoint restores into 1->3, 3->2 and 2->1 shards: split tensors with their slots, mod, "
    "div and dynamic tables, uneven sizes, and trains on as a run that did not stop") {
  const std::vector<std::pair<int, int>> moves = {{1, 3}, {3, 2}, {2, 1}};
  const std::vector<TensorSpec> tensors = {
      {.name = "big",
       .shape = {1001},
       .optimizer = OptimizerConfig::adam(0.02f),
       .init = InitConfig::normal(0, 1, 3)},
      {.name = "mom",
       .shape = {7},
       .optimizer = OptimizerConfig::with_momentum(0.05f, 0.9f),
       .init = InitConfig::normal(0, 1, 4)}};
  auto table = [](std::string name, TablePlacement p) {
    return TableSpec{.name = std::move(name),
                     .dim = 3,
                     .rows = 11,
                     .placement = p,
                     .optimizer = RowOptimizerConfig::adagrad(0.5f),
                     .init = InitConfig::uniform(-1, 1, 5)};
  };
  const std::vector<TableSpec> tables = {
      table("tmod", TablePlacement::kMod), table("tdiv", TablePlacement::kDiv),
      TableSpec{.name = "dyn",
                .dim = 3,
                .dynamic = true,
                .placement = TablePlacement::kHash,
                .optimizer = RowOptimizerConfig::ftrl(0.5f, 0.01f, 0.1f)}};
  std::vector<int64_t> all(11);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int64_t> dyn_ids = {5, -7, 1000000007, 42, 3};
  auto train = [&](Client& c, float k) {
    std::vector<float> g(1001), m(7);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = k * std::sin(0.1f * static_cast<float>(i));
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = k * (static_cast<float>(i) - 3);
    c.push({"big", "mom"}, {std::span<const float>(g), std::span<const float>(m)});
    std::vector<float> rg(all.size() * 3);
    for (std::size_t i = 0; i < rg.size(); ++i) rg[i] = k * (static_cast<float>(i % 5) - 2);
    c.push_rows("tmod", all, rg);
    c.push_rows("tdiv", all, rg);
    c.push_rows("dyn", dyn_ids, std::vector<float>(rg.begin(), rg.begin() + 15));
  };
  auto read = [&](Client& c) {
    std::vector<float> out = c.pull("big");
    const std::vector<float> m = c.pull("mom");
    out.insert(out.end(), m.begin(), m.end());
    for (const char* t : {"tmod", "tdiv"}) {
      const auto r = pull_rows(c, t, all, 3);
      out.insert(out.end(), r.begin(), r.end());
    }
    const auto d = pull_rows(c, "dyn", dyn_ids, 3);
    out.insert(out.end(), d.begin(), d.end());
    return out;
  };
  auto start = [](int n, const std::vector<std::string>& extra) {
    std::vector<std::unique_ptr<PsdProcess>> out;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> args = extra;
      args.insert(args.end(),
                  {"--shard_index", std::to_string(i), "--num_shards", std::to_string(n)});
      out.push_back(std::make_unique<PsdProcess>(args));
    }
    return out;
  };
  auto options = [](const std::vector<std::unique_ptr<PsdProcess>>& shards, uint64_t chunk) {
    ClientOptions o;
    for (const auto& s : shards) o.ps_hosts.push_back(s->address());
    o.worker_index = 0;
    o.is_chief = true;
    o.chunk_bytes = chunk;
    return o;
  };
  for (const auto& [from, to] : moves) {
    DYNAMIC_SECTION(from << " shards into " << to) {
      ps::test::TempDir dir;
      std::vector<float> saved, after;
      {
        auto shards = start(from, {"--checkpoint_dir", dir.path()});
        Client client(options(shards, 1024));  // "big" in 4 parts, the last one short
        client.create(tensors);
        client.create_tables(tables);
        train(client, 1.0f);
        train(client, -0.5f);
        saved = read(client);
        REQUIRE(client.checkpoint().paths.size() == static_cast<std::size_t>(from));
        train(client, 0.75f);
        after = read(client);
        for (auto& s : shards) s->kill();
      }
      auto shards = start(to, {});
      Client client(options(shards, 1536));
      RestoredModel m = restore_from_checkpoint(client, dir.path());
      CHECK(m.num_shards == static_cast<uint32_t>(from));
      CHECK(read(client) == saved);
      train(client, 0.75f);
      CHECK(read(client) == after);
      for (const auto& t : client.list_tables()) {
        if (t.name == "dyn") continue;
        const RowPlacement place(t.name == "tmod" ? TablePlacement::kMod : TablePlacement::kDiv,
                                 11, static_cast<uint32_t>(to));
        REQUIRE(t.rows_per_shard.size() == static_cast<std::size_t>(to));
        for (uint32_t s = 0; s < static_cast<uint32_t>(to); ++s)
          CHECK(t.rows_per_shard[s] == place.rows_on(s));
      }
    }
  }
}
