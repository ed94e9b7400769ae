// A shard's embedding tables against its memory budget, driven with the
// plain request types (no socket, no psd): what each request is charged must
// be what it then maps, so that psd stays within --max_memory_mb; and a
// restore refused part way must leave no table behind.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "common/checkpoint/checkpoint_file.h"
#include "common/memory_budget.h"
#include "ps/errors.h"
#include "server/compute_pool.h"
#include "server/shard.h"
#include "test/kj_test_loop.h"

using namespace ps;

namespace {

TableSpec dynamic_table(std::string name, uint32_t dim) {
  return TableSpec{.name = std::move(name),
                   .dim = dim,
                   .dynamic = true,
                   .placement = TablePlacement::kHash,
                   .optimizer = RowOptimizerConfig::sgd(1.0f)};
}

// A shard with a budget of `limit` bytes, a sync job of `replicas` workers, and table `spec`.
struct BudgetedShard {
  test::Loop io;
  ComputePool pool{1};
  MemoryBudget budget;
  Shard shard;
  std::vector<Caller> workers;

  BudgetedShard(uint64_t limit, uint32_t replicas, const TableSpec& spec)
      : budget(limit), shard(ShardOptions{}, pool, io.port.getTimer(), &budget) {
    shard.init_job(
        {.mode = SyncMode::kSync, .replicas_to_aggregate = replicas, .total_replicas = replicas});
    shard.create_tables({{spec, 0, 1}}, false);
    shard.set_ready();
    for (uint32_t i = 0; i < replicas; ++i) {
      workers.push_back(Caller{.worker_index = static_cast<int>(i), .peer = "w"});
      shard.hello(workers.back());
    }
  }
  ~BudgetedShard() { pool.join(); }

  // What the budget counts for the tables now (a create of nothing brings it up to date).
  uint64_t tables_use() {
    shard.create_tables({}, true);
    return budget.used(MemoryUse::kTensors);
  }
  uint64_t table_bytes() { return shard.list_tables().at(0).bytes; }
  uint64_t rows() { return shard.list_tables().at(0).rows_here; }
  PushRowsReply push(uint32_t worker, const std::vector<uint64_t>& ids, int64_t step) {
    grads.assign(ids.size() * shard.list_tables().at(0).spec.dim, 0.01f);
    return shard.push_rows(workers.at(worker),
                           PushRowsRequest{.table = "a", .ids = ids, .grads = grads, .step = step});
  }
  std::vector<float> grads;
};

std::vector<uint64_t> ids_from(uint64_t first, std::size_t n) {
  std::vector<uint64_t> ids(n);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

}  // namespace

TEST_CASE("a sync step's new rows are charged what its commit creates, admission by count too") {
  TableSpec spec = dynamic_table("a", 64);
  spec.min_count = 2;
  spec.count_sketch_width = 1u << 20;
  BudgetedShard s(uint64_t{1} << 34, 3, spec);
  const std::size_t k = 20000;
  const std::vector<uint64_t> v = ids_from(2000000, k), w = ids_from(3000000, k);
  std::vector<uint64_t> vw = v;
  vw.insert(vw.end(), w.begin(), w.end());
  for (uint32_t i = 0; i < 3; ++i) s.push(i, vw, 0);  // sizes the step's buffers; counts v and w
  for (uint32_t i = 0; i < 3; ++i) s.push(i, ids_from(5000000, 10), 1);  // counts 10 more ids
  REQUIRE(s.rows() == 0);
  const std::vector<uint64_t> fresh = ids_from(4000000, k);  // never seen
  std::vector<uint64_t> v_fresh = v;
  v_fresh.insert(v_fresh.end(), fresh.begin(), fresh.end());
  const uint64_t before = s.tables_use(), table_before = s.table_bytes();
  s.push(0, v, 2);        // v's second push: k rows the commit creates
  s.push(1, v_fresh, 2);  // the same k, and k ids counted for the first time: no row
  const uint64_t pending = s.tables_use();
  s.push(2, v, 2);  // the commit
  // v's k rows; a fresh id whose sketch counters all collide with counted
  // ids' (a few in a hundred runs) is admitted too, and charged as well.
  CHECK(s.rows() >= k);
  CHECK(s.rows() <= k + 4);
  CHECK(pending - before == s.table_bytes() - table_before);
}

TEST_CASE(
    "a sync push is charged what it grows the step's buffers by, and refused past the budget") {
  // 2^17 ids fill the step's buffers; a later push of 2^17 + 1 held ids (no new row) grows them
  // (its id set to 2^19 entries). Before it was charged so, it doubled every buffer (35 MB) for
  // a charge of 288 bytes.
  const std::size_t k = std::size_t{1} << 17;
  auto grow = [&](uint64_t limit, uint64_t& before, uint64_t& after) {
    BudgetedShard s(limit, 2, dynamic_table("a", 64));
    s.push(0, ids_from(0, k), 0);
    s.push(1, ids_from(0, k), 0);
    s.push(0, ids_from(k, 10), 1);
    s.push(1, ids_from(k, 10), 1);  // k + 10 rows held
    before = s.tables_use();
    bool refused = false;
    try {
      s.push(0, ids_from(0, k + 1), 2);
    } catch (const RequestError& e) {
      refused = true;
      CHECK_THAT(e.what(), Catch::Contains("memory"));
    }
    after = s.tables_use();
    return refused;
  };
  uint64_t before = 0, after = 0;
  CHECK_FALSE(grow(uint64_t{1} << 34, before, after));
  const uint64_t growth = after - before;
  CHECK(growth > 0);
  CHECK(growth < 4u << 20);
  uint64_t at_before = 0, at_after = 0;
  CHECK_FALSE(grow(before + growth, at_before, at_after));  // charged exactly what it maps
  CHECK(at_after == before + growth);
  uint64_t under_before = 0, under_after = 0;
  CHECK(grow(before + growth - 1, under_before, under_after));
  CHECK(under_after == under_before);
}

TEST_CASE("a restore refused part way leaves none of the tables it restored before") {
  auto table = [](std::string name, uint64_t version, std::vector<uint64_t> ids) {
    TableCheckpoint t;
    t.spec = dynamic_table(std::move(name), 1);
    t.version = version;
    t.ids = std::move(ids);
    t.values.assign(t.ids.size(), 7.0f);
    return t;
  };
  test::Loop io;
  ComputePool pool{1};
  Shard shard(ShardOptions{}, pool, io.port.getTimer());
  ShardCheckpoint newer{.global_step = 10};
  newer.tables = {table("x", 5, {1, 2, 3}), table("y", UINT64_MAX, {4})};
  CHECK_THROWS_WITH(shard.restore(newer), Catch::Contains("over 2^62"));
  CHECK(shard.list_tables().empty());
  ShardCheckpoint older{.global_step = 5};  // psd goes on to the next older file
  older.tables = {table("y", 1, {4})};
  shard.restore(older);
  REQUIRE(shard.list_tables().size() == 1);
  CHECK(shard.list_tables()[0].spec.name == "y");
  pool.join();
}

TEST_CASE(
    "a sync step's gradient sums are counted in the budget; a push with no room is refused whole") {
  test::Loop io;
  ComputePool pool{1};
  MemoryBudget budget(1 << 20);
  Shard shard(ShardOptions{}, pool, io.port.getTimer(), &budget);
  auto create = [&](std::string name, uint64_t n) {
    CreateRequest request;
    request.tensors.push_back({TensorSpec{.name = std::move(name), .shape = {n}}, std::nullopt});
    CreateReply reply;
    shard.create(request, reply);
  };
  create("big", 150'000);  // 600 KB of the 1 MiB: its sum's 600 KB more do not fit
  create("small", 1'000);
  shard.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  shard.set_ready();
  Caller w0{.worker_index = 0, .peer = "w0"};
  shard.hello(w0);
  const std::vector<float> big(150'000, 1.0f), small(1'000, 1.0f);
  auto push = [&](std::vector<std::pair<const char*, const std::vector<float>*>> grads) {
    PushRequest r;
    for (auto& [name, g] : grads)
      r.grads.push_back(
          {name, std::span<const float>(*g), g->size() * sizeof(float), std::nullopt});
    r.request_id = 7;
    PushReply reply;
    io.wait(shard.push(w0, r, reply));
    return reply;
  };
  const uint64_t before = budget.used(MemoryUse::kTensors);
  try {
    push({{"small", &small}, {"big", &big}});
    FAIL("not refused");
  } catch (const RequestError& e) {
    CHECK_THAT(e.what(), Catch::Contains("the sum of tensor 'big''s sync gradients (600000 bytes) "
                                         "would take psd over its memory limit"));
  }
  CHECK(shard.counters().pushes == 0);  // nothing recorded: the same request id goes through later
  CHECK(budget.used(MemoryUse::kTensors) == before + 4'000);  // small's sum, allocated first
  auto reply = push({{"small", &small}});
  CHECK(reply.status == std::vector<GradientStatus>{GradientStatus::kAccumulated});
  CHECK(budget.used(MemoryUse::kTensors) == before + 4'000);  // allocated once
}
