// Embedding tables across checkpoints and re-sharding: a job of N shards
// trains fixed (mod, div) and dynamic (unlimited, LRU-limited) tables with
// random ids, checkpoints, and restore_from_checkpoint puts it into a job of
// M shards. Every row and every optimizer slot must come back bit for bit,
// on the shard the new job places it on, with the table's version; one more
// step with the same gradients must then give the same rows in both jobs.
// Rows are compared through the checkpoint files (read_checkpoint), which
// neither create dynamic rows nor touch the LRU order, as a pull would.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "common/checkpoint/checkpoint_file.h"
#include "common/embedding_placement.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/training_session.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;
using ps::test::TempDir;

namespace {

using Shards = std::vector<std::unique_ptr<PsdProcess>>;

Shards start(int n, const std::string& checkpoint_dir = "") {
  Shards out;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> args = {"--shard_index", std::to_string(i), "--num_shards",
                                     std::to_string(n)};
    if (!checkpoint_dir.empty())
      args.insert(args.end(), {"--checkpoint_dir", checkpoint_dir, "--checkpoint_secs", "0"});
    out.push_back(std::make_unique<PsdProcess>(args));
  }
  return out;
}

ClientOptions chief_of(const Shards& shards) {
  ClientOptions o;
  for (const auto& s : shards) o.ps_hosts.push_back(s->address());
  o.worker_index = 0;
  o.is_chief = true;
  return o;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// One table as the shards hold it: each row's values then slots, as bits.
struct TableState {
  std::map<uint64_t, std::vector<uint32_t>> rows;
  std::vector<uint64_t> versions;  // by shard
  uint64_t version() const {
    uint64_t v = 0;
    for (uint64_t x : versions) v = std::max(v, x);
    return v;
  }
};
using State = std::map<std::string, TableState>;

// Every shard's rows through a checkpoint; checks that each row is on the
// shard its placement says, and on one shard only.
State snapshot(Client& client) {
  State out;
  const auto ck = client.checkpoint();
  REQUIRE(ck.paths.size() == static_cast<std::size_t>(client.num_shards()));
  for (const auto& path : ck.paths) {
    const ShardCheckpoint c = read_checkpoint(path);
    for (const TableCheckpoint& t : c.tables) {
      TableState& s = out[t.spec.name];
      s.versions.resize(c.num_shards);
      s.versions[t.shard_index] = t.version;
      const RowPlacement place(t.spec.dynamic ? TablePlacement::kHash : t.spec.placement,
                               t.spec.rows, t.num_shards);
      const uint32_t dim = t.spec.dim;
      for (std::size_t i = 0; i < t.ids.size(); ++i) {
        INFO("table " << t.spec.name << " id " << t.ids[i]);
        CHECK(place.shard_of(t.ids[i]) == t.shard_index);
        std::vector<uint32_t> row;
        for (uint32_t j = 0; j < dim; ++j) row.push_back(bits(t.values[i * dim + j]));
        for (const auto& slot : t.slots)
          for (uint32_t j = 0; j < dim; ++j) row.push_back(bits(slot[i * dim + j]));
        CHECK(s.rows.emplace(t.ids[i], std::move(row)).second);  // on one shard only
      }
    }
  }
  return out;
}

// The rows of `b` that differ from `a`'s (or that one of them lacks), for
// the message of a failed comparison.
std::string differences(const TableState& a, const TableState& b) {
  std::string out;
  int shown = 0;
  for (const auto& [id, row] : a.rows) {
    auto it = b.rows.find(id);
    if (it == b.rows.end() || it->second != row) {
      if (shown++ < 5)
        out += " id " + std::to_string(id) + (it == b.rows.end() ? " missing;" : " differs;");
    }
  }
  for (const auto& [id, row] : b.rows) {
    if (!a.rows.count(id) && shown++ < 5) out += " id " + std::to_string(id) + " extra;";
  }
  return out;
}

void check_same(const TableState& a, const TableState& b, const std::string& what) {
  INFO(what << ":" << differences(a, b));
  CHECK(a.rows.size() == b.rows.size());
  CHECK(a.rows == b.rows);
}

const TableSpec kFixedMod{.name = "fmod",
                          .dim = 3,
                          .rows = 37,
                          .placement = TablePlacement::kMod,
                          .optimizer = RowOptimizerConfig::lazy_adam(0.05f),
                          .init = InitConfig::uniform(-0.5f, 0.5f, 11)};
const TableSpec kFixedDiv{.name = "fdiv",
                          .dim = 2,
                          .rows = 29,
                          .placement = TablePlacement::kDiv,
                          .optimizer = RowOptimizerConfig::ftrl(0.1f, 0.01f, 0.02f),
                          .init = InitConfig::normal(0, 0.3f, 12)};
const TableSpec kDynamic{.name = "dyn",
                         .dim = 4,
                         .dynamic = true,
                         .placement = TablePlacement::kHash,
                         .optimizer = RowOptimizerConfig::adagrad(0.1f),
                         .init = InitConfig::truncated_normal(0, 0.2f, 13)};
constexpr uint64_t kLruLimit = 8;
constexpr int kSteps = 6;
const TableSpec kLru{.name = "lru",
                     .dim = 2,
                     .dynamic = true,
                     .placement = TablePlacement::kHash,
                     .optimizer = RowOptimizerConfig::sgd(0.5f),
                     .init = InitConfig::uniform(-1, 1, 14),
                     .row_limit = kLruLimit,
                     .on_limit = OnRowLimit::kEvictLru};

// One training step's batches, drawn once and given to every job that takes it.
struct Batch {
  std::string table;
  std::vector<int64_t> ids;
  std::vector<float> grads;
  bool pull_first = false;
};

std::vector<Batch> draw_step(std::mt19937_64& rng, const std::vector<int64_t>& lru_pool) {
  std::vector<Batch> out;
  auto grads = [&](std::size_t n, uint32_t dim) {
    std::uniform_real_distribution<float> g(-1, 1);
    std::vector<float> v(n * dim);
    for (auto& x : v) x = g(rng);
    return v;
  };
  auto fixed_ids = [&](const TableSpec& s, std::size_t n) {
    std::vector<int64_t> ids = {0, static_cast<int64_t>(s.rows) - 1};
    // LazyAdam's t is each shard's count of updates: every step touches
    // every shard of every layout (mod over up to 4 shards), so that the
    // counts agree between the jobs.
    if (s.placement == TablePlacement::kMod) ids.insert(ids.end(), {1, 2, 3});
    std::uniform_int_distribution<int64_t> d(0, static_cast<int64_t>(s.rows) - 1);
    for (std::size_t i = 0; i < n; ++i) ids.push_back(d(rng));
    ids.push_back(ids[ids.size() / 2]);  // a repeat
    std::shuffle(ids.begin(), ids.end(), rng);
    return ids;
  };
  for (const TableSpec* s : {&kFixedMod, &kFixedDiv}) {
    auto ids = fixed_ids(*s, 12);
    out.push_back({s->name, ids, grads(ids.size(), s->dim), false});
  }
  {
    // Huge and negative ids, small ones, repeats.
    std::vector<int64_t> ids = {std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max(), -1, 0};
    std::uniform_int_distribution<int64_t> any(std::numeric_limits<int64_t>::min(),
                                               std::numeric_limits<int64_t>::max());
    std::uniform_int_distribution<int64_t> small(0, 40);
    for (int i = 0; i < 10; ++i) ids.push_back(i % 2 ? any(rng) : small(rng));
    ids.push_back(ids[3]);
    std::shuffle(ids.begin(), ids.end(), rng);
    out.push_back({kDynamic.name, ids, grads(ids.size(), kDynamic.dim), false});
  }
  {
    // At most kLruLimit distinct ids (a request may not evict its own rows),
    // from a pool larger than every layout's capacity: rows are evicted.
    std::vector<int64_t> ids;
    std::set<int64_t> distinct;
    std::uniform_int_distribution<std::size_t> pick(0, lru_pool.size() - 1);
    while (distinct.size() < kLruLimit) {
      ids.push_back(lru_pool[pick(rng)]);
      distinct.insert(ids.back());
    }
    ids.push_back(ids[0]);
    out.push_back({kLru.name, ids, grads(ids.size(), kLru.dim), rng() % 2 == 0});
  }
  return out;
}

void run_step(Client& client, const std::vector<Batch>& step) {
  for (const Batch& b : step) {
    if (b.pull_first) {
      std::vector<float> rows(b.grads.size());
      client.pull_rows(b.table, b.ids, rows);
    }
    REQUIRE(client.push_rows(b.table, b.ids, b.grads) == PushStatus::kApplied);
  }
}

}  // namespace

TEST_CASE(
    "tables restored from N into M shards hold every row, slot and version bit for bit, on the "
    "right shards, and train on as the job that did not stop") {
  const std::vector<std::pair<int, int>> moves = {{1, 1}, {1, 3}, {2, 2}, {2, 4},
                                                  {3, 3}, {3, 2}, {2, 1}, {1, 4}};
  const std::vector<TableSpec> specs = {kFixedMod, kFixedDiv, kDynamic, kLru};
  for (const auto& [from, to] : moves) {
    DYNAMIC_SECTION(from << " shards into " << to) {
      std::mt19937_64 rng(1000 * from + to);
      // Large and negative ids too: the pool is larger than every layout's capacity.
      std::vector<int64_t> lru_pool;
      for (int i = 0; i < 60; ++i) lru_pool.push_back(i % 3 == 0 ? static_cast<int64_t>(rng()) : i);
      TempDir dir, dir2;
      auto a = start(from, dir.path());
      Client original(chief_of(a));
      original.create_tables(specs);
      for (int s = 0; s < kSteps; ++s) run_step(original, draw_step(rng, lru_pool));
      const State saved = snapshot(original);
      REQUIRE(saved.at("lru").rows.size() > 0);
      CHECK(original.list_tables().size() == 4);
      uint64_t evictions = 0;
      for (const auto& t : original.list_tables()) evictions += t.evictions;
      CHECK(evictions > 0);  // the LRU table is at its limit, as it was saved

      auto b = start(to, dir2.path());
      Client restored(chief_of(b));
      // The LRU table's rows per shard of the new layout: over its limit,
      // the restore must be refused as a whole.
      std::vector<uint64_t> per_shard(to);
      const RowPlacement hash(TablePlacement::kHash, 0, to);
      for (const auto& [id, row] : saved.at("lru").rows) ++per_shard[hash.shard_of(id)];
      const bool fits = *std::max_element(per_shard.begin(), per_shard.end()) <= kLruLimit;
      if (!fits) {
        CHECK_THROWS_WITH(restore_from_checkpoint(restored, dir.path()),
                          Catch::Contains("lru") && Catch::Contains("row limit"));
        CHECK(restored.list_tables().empty());  // refused before anything was created
        // The others, through the steps restore_from_checkpoint takes.
        RestoredModel m = load_checkpoint(dir.path());
        std::vector<TableSpec> kept;
        for (const auto& t : m.tables)
          if (t.spec.name != "lru") kept.push_back(t.spec);
        restored.create_tables(kept);
        for (const auto& t : m.tables)
          if (t.spec.name != "lru")
            restored.restore_rows(t.spec.name, t.ids, t.values, t.slots, t.version);
        restored.set_ready();
      } else {
        RestoredModel m = restore_from_checkpoint(restored, dir.path());
        CHECK(m.num_shards == static_cast<uint32_t>(from));
        CHECK(m.tables.size() == 4);
      }
      const State back = snapshot(restored);
      for (const auto& [name, t] : saved) {
        if (name == "lru" && !fits) continue;
        INFO("table " << name);
        REQUIRE(back.count(name));
        check_same(t, back.at(name), "restored " + name);
        CHECK(back.at(name).version() == t.version());
        // Every shard of the new job counts on from the checkpoint's
        // version, those that got no row of the table too.
        for (uint64_t v : back.at(name).versions) CHECK(v == t.version());
      }
      // LazyAdam's t: every shard of both layouts took every step.
      for (uint64_t v : saved.at("fmod").versions) CHECK(v == kSteps);

      // One more step with the same gradients in both.
      const auto next = draw_step(rng, lru_pool);
      run_step(original, next);
      if (fits) {
        run_step(restored, next);
      } else {
        run_step(restored, std::vector<Batch>(next.begin(), next.end() - 1));
      }
      const State after = snapshot(original);
      const State after_restored = snapshot(restored);
      for (const char* name : {"fmod", "fdiv", "dyn"})
        check_same(after.at(name), after_restored.at(name), std::string("after a step, ") + name);
      if (fits) {
        const TableState& x = after.at("lru");
        const TableState& y = after_restored.at("lru");
        if (from == to) {
          // The same shards, the same LRU order: the same rows evicted.
          check_same(x, y, "after a step, lru");
        } else {
          // Per-shard limits differ: the rows the step pushed agree.
          for (int64_t id : next.back().ids) {
            INFO("lru id " << id);
            REQUIRE(x.rows.count(id));
            REQUIRE(y.rows.count(id));
            CHECK(x.rows.at(id) == y.rows.at(id));
          }
        }
      }
    }
  }
}

TEST_CASE(
    "a shard of the new job that gets none of a table's rows still counts on from the "
    "checkpoint's version (LazyAdam's bias correction)") {
  const TableSpec spec{.name = "adam",
                       .dim = 2,
                       .dynamic = true,
                       .placement = TablePlacement::kHash,
                       .optimizer = RowOptimizerConfig::lazy_adam(0.1f)};
  // Ids that one shard of two would hold, and one for the other.
  const RowPlacement two(TablePlacement::kHash, 0, 2);
  std::vector<int64_t> on_zero;
  int64_t on_one = -1;
  for (int64_t id = 1; on_zero.size() < 3 || on_one < 0; ++id) {
    if (two.shard_of(id) == 0 && on_zero.size() < 3) on_zero.push_back(id);
    if (two.shard_of(id) == 1 && on_one < 0) on_one = id;
  }
  TempDir dir;
  auto a = start(1, dir.path());
  Client original(chief_of(a));
  original.create_tables({spec});
  for (int s = 0; s < 4; ++s)
    original.push_rows("adam", on_zero, std::vector<float>(6, 0.25f * (s + 1)));
  original.checkpoint();
  auto b = start(2);
  Client restored(chief_of(b));
  restore_from_checkpoint(restored, dir.path());
  // A new row on the shard that got none: its first update is the table's
  // fifth, as in the job that did not stop.
  const std::vector<int64_t> ids = {on_one};
  const std::vector<float> g = {0.5f, -0.5f};
  original.push_rows("adam", ids, g);
  restored.push_rows("adam", ids, g);
  std::vector<float> x(2), y(2);
  original.pull_rows("adam", ids, x);
  restored.pull_rows("adam", ids, y);
  CHECK(x == y);
}

TEST_CASE("a restore that puts more rows on a shard than its row limit is refused, not cut") {
  auto limited = [](std::string name, OnRowLimit on_limit) {
    return TableSpec{.name = std::move(name),
                     .dim = 2,
                     .dynamic = true,
                     .placement = TablePlacement::kHash,
                     .optimizer = RowOptimizerConfig::adagrad(0.1f),
                     .row_limit = 4,
                     .on_limit = on_limit};
  };
  std::vector<int64_t> ids(6);
  for (int64_t i = 0; i < 6; ++i) ids[i] = 1000 + i;
  const std::vector<float> values(12, 1.5f);
  const std::vector<std::vector<float>> slots = {std::vector<float>(12, 0.5f)};
  SECTION("restore_rows in several requests into an LRU table: none evicts another") {
    auto a = start(1);
    ClientOptions o = chief_of(a);
    o.max_request_bytes = 16;  // two rows per request
    Client client(o);
    client.create_tables({limited("lru", OnRowLimit::kEvictLru)});
    CHECK_THROWS_WITH(client.restore_rows("lru", ids, values, slots, 3),
                      Catch::Contains("row limit") && Catch::Contains("nothing was restored"));
    CHECK(client.list_tables().at(0).rows == 0);
    CHECK(client.list_tables().at(0).evictions == 0);
  }
  for (OnRowLimit on_limit : {OnRowLimit::kEvictLru, OnRowLimit::kRefuse}) {
    DYNAMIC_SECTION("a checkpoint of 2 shards at their limit into 1 shard, "
                    << (on_limit == OnRowLimit::kRefuse ? "refuse" : "lru")) {
      TempDir dir;
      {
        auto a = start(2, dir.path());
        Client client(chief_of(a));
        client.create_tables(
            {limited("t", on_limit), TableSpec{.name = "other", .dim = 1, .rows = 5}});
        const RowPlacement two(TablePlacement::kHash, 0, 2);
        std::vector<int64_t> fill[2];
        for (int64_t id = 1; fill[0].size() < 4 || fill[1].size() < 4; ++id) {
          auto& f = fill[two.shard_of(id)];
          if (f.size() < 4) f.push_back(id);
        }
        for (auto& f : fill) client.push_rows("t", f, std::vector<float>(8, 1.0f));
        CHECK(client.list_tables().at(1).rows == 8);
        client.checkpoint();
      }
      auto b = start(1);
      Client client(chief_of(b));
      CHECK_THROWS_WITH(
          restore_from_checkpoint(client, dir.path()),
          Catch::Contains("'t'") && Catch::Contains("8 rows") && Catch::Contains("row limit of 4"));
      CHECK(client.list_tables().empty());
    }
  }
}

TEST_CASE("an LRU table's order survives a checkpoint: the same rows are evicted after a restore") {
  TempDir dir;
  const TableSpec spec{.name = "lru",
                       .dim = 1,
                       .dynamic = true,
                       .placement = TablePlacement::kHash,
                       .optimizer = RowOptimizerConfig::sgd(1.0f),
                       .row_limit = 16,
                       .on_limit = OnRowLimit::kEvictLru};
  std::mt19937_64 rng(7);
  std::vector<int64_t> order;
  for (int i = 0; i < 16; ++i) order.push_back(static_cast<int64_t>(rng()));
  auto a = start(1, dir.path());
  Client original(chief_of(a));
  original.create_tables({spec});
  for (int64_t id : order)
    original.push_rows("lru", std::vector<int64_t>{id}, std::vector<float>{1});
  // Touched again in another order: this is the LRU order, oldest first.
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t id : order) {
    std::vector<float> row(1);
    original.pull_rows("lru", std::vector<int64_t>{id}, row);
  }
  original.checkpoint();
  auto check_evicts_oldest = [&](Client& c) {
    for (int k = 0; k < 8; ++k) {
      c.push_rows("lru", std::vector<int64_t>{-1 - k}, std::vector<float>{1});  // evicts one
    }
    const State s = snapshot(c);
    std::set<int64_t> held;
    for (const auto& [id, row] : s.at("lru").rows) held.insert(static_cast<int64_t>(id));
    std::set<int64_t> want(order.begin() + 8, order.end());
    for (int k = 0; k < 8; ++k) want.insert(-1 - k);
    CHECK(held == want);
  };
  SECTION("restored by restore_from_checkpoint") {
    TempDir dir2;
    auto b = start(1, dir2.path());
    Client restored(chief_of(b));
    restore_from_checkpoint(restored, dir.path());
    check_evicts_oldest(restored);
  }
  SECTION("psd restarted on its own checkpoint") {
    a.clear();
    auto b = start(1, dir.path());
    Client restarted(chief_of(b));
    restarted.declare_tables({spec});
    check_evicts_oldest(restarted);
  }
  SECTION("the job that did not stop") { check_evicts_oldest(original); }
}

TEST_CASE(
    "a session restoring a table with another dim, kind, row count or row optimizer, or whose rows "
    "exceed its row limit on the new shards, is refused before anything is created") {
  TempDir dir;
  const TensorSpec w{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(0.5f)};
  const TableSpec emb{.name = "emb",
                      .dim = 2,
                      .rows = 10,
                      .placement = TablePlacement::kMod,
                      .optimizer = RowOptimizerConfig::adagrad(0.1f)};
  const TableSpec dyn{.name = "dyn",
                      .dim = 2,
                      .dynamic = true,
                      .placement = TablePlacement::kHash,
                      .optimizer = RowOptimizerConfig::ftrl(0.1f)};
  {
    auto a = start(1, dir.path());
    Client client(chief_of(a));
    client.create({w});
    client.create_tables({emb, dyn});
    std::vector<int64_t> ids;
    for (int64_t id = 1; id <= 10; ++id) ids.push_back(id * 1000003);
    client.push_rows("dyn", ids, std::vector<float>(20, 0.5f));
    client.checkpoint();
  }
  struct Case {
    const char* what;
    std::function<void(TableSpec& emb, TableSpec& dyn)> change;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"dim", [](TableSpec& e, TableSpec&) { e.dim = 3; }, "dim 3"},
      {"rows", [](TableSpec& e, TableSpec&) { e.rows = 11; }, "the same rows"},
      {"kind",
       [](TableSpec& e, TableSpec&) {
         e.dynamic = true;
         e.rows = 0;
         e.placement = TablePlacement::kHash;
       },
       "dynamic"},
      {"optimizer",
       [](TableSpec& e, TableSpec&) { e.optimizer = RowOptimizerConfig::lazy_adam(0.1f); },
       "another row optimizer"},
      {"row limit",
       [](TableSpec&, TableSpec& d) {
         d.row_limit = 3;
         d.on_limit = OnRowLimit::kEvictLru;
       },
       "over its row limit of 3"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.what) {
      auto b = start(2);
      Client client(chief_of(b));
      TrainingSession session(client, {.restore_from = dir.path()});
      std::vector<float> wv(2), gw(2);
      session.add_variable(w, wv, gw);
      TableSpec e = emb, d = dyn;
      c.change(e, d);
      session.add_table(e);
      session.add_table(d);
      CHECK_THROWS_WITH(session.initialize(),
                        Catch::Contains("restore") && Catch::Contains(c.error));
      CHECK(client.list_tables().empty());
      CHECK_FALSE(client.wait_ready(std::chrono::milliseconds(0)));
    }
  }
}

TEST_CASE(
    "a table admitting ids by count keeps its admitted rows and its min_count through a "
    "checkpoint into another shard count") {
  TempDir dir, dir2;
  const TableSpec spec{.name = "admit",
                       .dim = 3,
                       .dynamic = true,
                       .placement = TablePlacement::kHash,
                       .optimizer = RowOptimizerConfig::adagrad(0.1f),
                       .init = InitConfig::uniform(-1, 1, 21),
                       .min_count = 2,
                       .count_sketch_width = 4096,
                       .expire_after_steps = 1000};
  auto a = start(2, dir.path());
  Client original(chief_of(a));
  original.create_tables({spec});
  std::vector<int64_t> ids(200);
  std::iota(ids.begin(), ids.end(), -100);
  const std::vector<int64_t> twice(ids.begin(), ids.begin() + 80);
  std::vector<float> g(ids.size() * 3);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7) / 8 - 0.25f;
  original.push_rows("admit", ids, g);
  original.push_rows("admit", twice, std::span<const float>(g).first(twice.size() * 3));
  const State saved = snapshot(original);
  CHECK(saved.at("admit").rows.size() == twice.size());  // only the admitted ids have rows

  auto b = start(3, dir2.path());
  Client restored(chief_of(b));
  RestoredModel m = restore_from_checkpoint(restored, dir.path());
  REQUIRE(m.tables.size() == 1);
  CHECK(m.tables[0].spec.min_count == 2);
  CHECK(m.tables[0].spec.count_sketch_width == 4096);
  CHECK(m.tables[0].spec.expire_after_steps == 1000);
  const State back = snapshot(restored);
  check_same(saved.at("admit"), back.at("admit"), "restored admit");
  const auto info = restored.list_tables().at(0);
  CHECK(info.rows == twice.size());
  CHECK(info.ids_filtered == 0);  // counts of ids not yet admitted start again (docs/embedding.md)
  // An id pushed once before the checkpoint needs min_count pushes again.
  const std::vector<int64_t> once{ids.back()};
  restored.push_rows("admit", once, std::vector<float>(3, 1.0f));
  CHECK(restored.list_tables().at(0).rows == twice.size());
}

TEST_CASE(
    "expiring rows keep the steps since their last touch through a checkpoint into another "
    "shard count") {
  TempDir dir, dir2;
  const TableSpec spec{.name = "e",
                       .dim = 2,
                       .dynamic = true,
                       .placement = TablePlacement::kHash,
                       .optimizer = RowOptimizerConfig::sgd(1.0f),
                       .expire_after_steps = 3};
  // Group g is last touched at step 3 + g, so at the checkpoint (step 5) its age is 2 - g.
  std::vector<std::vector<int64_t>> groups(3);
  for (int64_t id = 0; id < 300; ++id) groups[id % 3].push_back(id * 7919 - 1000);
  auto a = start(2, dir.path());
  Client original(chief_of(a));
  original.init_job({.mode = SyncMode::kAsync});
  original.create_tables({spec});
  original.set_ready();
  for (int64_t step = 0; step <= 5; ++step) {
    for (int64_t g = std::max<int64_t>(0, step - 3); g < 3; ++g) {
      std::vector<float> rows(groups[g].size() * 2);
      original.pull_rows("e", groups[g], rows);
    }
    if (step < 5) original.step_done(step);
  }
  REQUIRE(original.checkpoint().step == 5);

  auto b = start(3, dir2.path());
  Client restored(chief_of(b));
  const RestoredModel m = restore_from_checkpoint(restored, dir.path());
  REQUIRE(m.tables.size() == 1);
  REQUIRE(m.tables[0].ages.size() == 300);
  const auto all = restored.list_tables().at(0);
  CHECK(all.rows == 300);
  for (uint64_t on_shard : all.rows_per_shard) CHECK(on_shard > 0);
  for (int64_t g = 0; g < 3; ++g) {  // a group a step, as in the job that was checkpointed
    CHECK(restored.step_done(5 + g).global_step == 6 + g);
    const auto t = restored.list_tables().at(0);
    CHECK(t.rows == 300 - 100 * uint64_t(g + 1));
    CHECK(t.rows_expired == 100 * uint64_t(g + 1));
  }
}
