// Embedding tables in training steps, against real psd processes:
// Client::push_and_step with rows (tensors, rows and the step report as one
// step, refused whole), TrainingSession steps that mix variables and rows
// (sync, checked against a float64 reference at every step), and a chief
// restoring its tables from a checkpoint while a worker waits.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/training_session.h"
#include "test/psd_process.h"

using namespace ps;
using namespace std::chrono_literals;
using ps::test::PsdProcess;

namespace {

ClientOptions options_for(const std::vector<const PsdProcess*>& shards, int worker) {
  ClientOptions o;
  for (auto* s : shards) o.ps_hosts.push_back(s->address());
  o.worker_index = worker;
  o.is_chief = worker == 0;
  return o;
}

const TensorSpec kW{.name = "w", .shape = {3}, .optimizer = OptimizerConfig::sgd(0.5f)};
const TableSpec kEmb{.name = "emb",
                     .dim = 2,
                     .rows = 6,
                     .placement = TablePlacement::kMod,
                     .optimizer = RowOptimizerConfig::sgd(0.5f)};

std::vector<float> rows_of(Client& c, const std::string& table, std::vector<int64_t> ids,
                           uint32_t dim) {
  std::vector<float> out(ids.size() * dim);
  c.pull_rows(table, ids, out);
  return out;
}

}  // namespace

TEST_CASE("push_and_step sends tensors, rows and the step report as one step, refused whole") {
  PsdProcess ps0, ps1;
  Client chief(options_for({&ps0, &ps1}, 0)), other(options_for({&ps0, &ps1}, 1));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create({kW});
  chief.create_tables({kEmb});
  chief.set_ready();
  other.declare({kW});
  other.declare_tables({kEmb});
  REQUIRE(other.wait_ready(5s));
  const std::vector<float> g0(3, 1.0f), g1(3, 3.0f);
  const std::vector<int64_t> ids0 = {0, 1, 0}, ids1 = {1};  // id 0 twice: its gradients summed
  const std::vector<float> r0 = {1, 1, 2, 2, 3, 3}, r1 = {4, 4};

  SECTION("refused whole: nothing applied, the step not counted") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> bad = {1, 1, 2, nan, 3, 3};
    CHECK_THROWS_WITH(chief.push_and_step({"w"}, {g0}, {{"emb", ids0, bad}}, 0, 0),
                      Catch::Contains("NaN") && Catch::Contains("nothing was sent"));
    CHECK_THROWS_WITH(
        chief.push_and_step({"w"}, {g0}, {{"emb", ids0, r0}, {"emb", ids1, r1}}, 0, 0),
        Catch::Contains("given twice"));
    const std::vector<int64_t> outside = {7};
    CHECK_THROWS_WITH(chief.push_and_step({"w"}, {g0}, {{"emb", outside, r1}}, 0, 0),
                      Catch::Contains("id 7 is outside"));
    CHECK_THROWS_WITH(chief.push_and_step({"w"}, {g0}, {{"emb", ids1, r0}}, 0, 0),
                      Catch::Contains("1 ids need 2 gradient floats, got 6"));
    // The same step pushed right is accumulated (no duplicate: nothing went).
    PushResult p = chief.push_and_step({"w"}, {g0}, {{"emb", ids0, r0}}, 0, 0);
    CHECK(p.row_status == std::vector<PushStatus>{PushStatus::kAccumulated});
    CHECK(p.status == std::vector<PushStatus>{PushStatus::kAccumulated});
  }
  SECTION("a sync step of two workers: tensors and rows averaged, the step counted") {
    PushResult p0 = chief.push_and_step({"w"}, {g0}, {{"emb", ids0, r0}}, 0, 0);
    CHECK(p0.row_status == std::vector<PushStatus>{PushStatus::kAccumulated});
    CHECK(p0.global_step == 0);
    PushResult p1 = other.push_and_step({"w"}, {g1}, {{"emb", ids1, r1}}, 0, 0);
    CHECK(p1.row_status == std::vector<PushStatus>{PushStatus::kAccumulated});
    CHECK(p1.global_step == 1);  // its push closed the step on every shard
    std::vector<float> w(3);
    CHECK(chief.pull({"w"}, {std::span<float>(w)}, 1).step == 1);
    CHECK(w == std::vector<float>(3, -1.0f));  // 0.5 * (1 + 3) / 2
    // id 0: (1 + 3) / 2 * 0.5 = 1; id 1: (2 + 4) / 2 * 0.5 = 1.5; id 2 untouched.
    CHECK(rows_of(chief, "emb", {0, 1, 2}, 2) == std::vector<float>{-1, -1, -1.5f, -1.5f, 0, 0});
    // A second push for the finished step is stale, for tensors and rows alike.
    PushResult late = other.push_and_step({"w"}, {g1}, {{"emb", ids1, r1}}, 0, 0);
    CHECK(late.row_status == std::vector<PushStatus>{PushStatus::kStale});
    CHECK(late.status == std::vector<PushStatus>{PushStatus::kStale});
  }
}

TEST_CASE("TrainingSession: sync steps mixing a variable and table rows match a float64 loop") {
  PsdProcess ps0, ps1;
  constexpr int kSteps = 6;
  const JobConfig job{.mode = SyncMode::kSync,
                      .replicas_to_aggregate = 2,
                      .total_replicas = 2,
                      .train_steps = kSteps};
  // The reference: worker k pushes gradient k + 1 for w and for rows k, k + 2
  // and 5 (each of its floats); psd averages over the two workers.
  std::vector<double> ref_w(3, 0.0), ref_rows(12, 0.0);
  std::vector<std::vector<double>> w_at, rows_at;  // before each step
  for (int s = 0; s < kSteps; ++s) {
    w_at.push_back(ref_w);
    rows_at.push_back(ref_rows);
    for (auto& v : ref_w) v -= 0.5 * (1.0 + 2.0) / 2;
    std::vector<double> sum(6, 0.0);
    for (int k = 0; k < 2; ++k)
      for (int id : {k, k + 2, 5}) sum[id] += k + 1;
    for (int id = 0; id < 6; ++id)
      for (int j = 0; j < 2; ++j) ref_rows[id * 2 + j] -= 0.5 * sum[id] / 2;
  }
  std::atomic<int> mismatches{0}, stale{0};
  std::string errors[2];
  std::atomic<int> computed[2] = {0, 0};
  auto worker = [&](int k) {
    try {
      Client client(options_for({&ps0, &ps1}, k));
      TrainingSession session(client, {.job = job});
      std::vector<float> w(3), gw(3, float(k + 1));
      session.add_variable(kW, w, gw);
      session.add_table(kEmb);
      session.initialize();
      const std::vector<int64_t> ids = {k, k + 2, 5};
      std::vector<float> rows(6), grads(6, float(k + 1));
      while (!session.should_stop()) {
        session.set_rows("emb", ids, rows, grads);
        StepOutcome out = session.run_step([&] {
          // What was read is the reference at one step, variables and rows alike.
          const int64_t s = session.global_step();
          ++computed[k];
          for (int j = 0; j < 3; ++j)
            if (w[j] != static_cast<float>(w_at[s][j])) ++mismatches;
          for (std::size_t i = 0; i < ids.size(); ++i)
            for (int j = 0; j < 2; ++j)
              if (rows[i * 2 + j] != static_cast<float>(rows_at[s][ids[i] * 2 + j])) ++mismatches;
        });
        if (out.stale) ++stale;
      }
    } catch (const std::exception& e) {
      errors[k] = e.what();
    }
  };
  std::thread other(worker, 1);
  worker(0);
  other.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(mismatches == 0);
  CHECK(stale == 0);
  CHECK(computed[0] == kSteps);
  CHECK(computed[1] == kSteps);
  Client reader(options_for({&ps0, &ps1}, -1));
  reader.declare({kW});
  reader.declare_tables({kEmb});
  std::vector<float> w(3);
  reader.pull("w", w);
  for (int j = 0; j < 3; ++j) CHECK(w[j] == Approx(ref_w[j]).margin(1e-6));
  auto rows = rows_of(reader, "emb", {0, 1, 2, 3, 4, 5}, 2);
  for (int i = 0; i < 12; ++i) CHECK(rows[i] == Approx(ref_rows[i]).margin(1e-6));
}

TEST_CASE(
    "a chief restarting from a checkpoint gets its tables back, into another shard count; a "
    "worker waits for them") {
  ps::test::TempDir dir;
  const TableSpec dyn{.name = "dyn",
                      .dim = 2,
                      .dynamic = true,
                      .placement = TablePlacement::kHash,
                      .optimizer = RowOptimizerConfig::adagrad(0.5f)};
  const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5}, dyn_ids = {-3, 77, 1000000007};
  const std::vector<float> one_more = {1, 2, -1, 0.5f, 3, -2};
  auto read = [&](Client& c) {
    auto rows = rows_of(c, "emb", all, 2);
    auto d = rows_of(c, "dyn", dyn_ids, 2);
    rows.insert(rows.end(), d.begin(), d.end());
    return rows;
  };
  auto add = [&](TrainingSession& session, std::vector<float>& w, std::vector<float>& gw) {
    session.add_variable(kW, w, gw);
    session.add_table(kEmb);
    session.add_table(dyn);
  };
  std::vector<float> saved, saved_w(3), after_one_more;
  int64_t saved_step = 0;
  {
    PsdProcess a({"--checkpoint_dir", dir.path(), "--checkpoint_secs", "0", "--shard_index", "0",
                  "--num_shards", "2"}),
        b({"--checkpoint_dir", dir.path(), "--checkpoint_secs", "0", "--shard_index", "1",
           "--num_shards", "2"});
    Client client(options_for({&a, &b}, 0));
    TrainingSession session(client, {.job = {.total_replicas = 1, .train_steps = 3}});
    std::vector<float> w(3), gw = {1, 2, 3};
    add(session, w, gw);
    session.initialize();
    const std::vector<int64_t> ids = {0, 3, 3, 5};
    std::vector<float> rows(8), grads = {1, 1, 2, 2, 3, 3, 4, 4}, drows(6),
                                dgrads = {1, -1, 2, -2, 3, 0.5f};
    while (!session.should_stop()) {
      session.set_rows("emb", ids, rows, grads);
      session.set_rows("dyn", dyn_ids, drows, dgrads);
      session.run_step([] {});
    }
    saved = read(client);
    client.pull("w", saved_w);
    saved_step = client.checkpoint().step;
    CHECK(saved_step == 3);
    client.push_rows("dyn", dyn_ids, one_more);  // Adagrad: the result depends on the slots
    after_one_more = read(client);
    a.kill();
    b.kill();
  }
  PsdProcess x({"--shard_index", "0", "--num_shards", "3"}),
      y({"--shard_index", "1", "--num_shards", "3"}),
      z({"--shard_index", "2", "--num_shards", "3"});
  // The worker starts first and waits for the chief; its first read is the
  // restored model, tables included.
  std::vector<float> worker_read, worker_w(3);
  std::string worker_error;
  int64_t worker_step = -1;
  std::thread worker([&] {
    try {
      Client client(options_for({&x, &y, &z}, 1));
      TrainingSession session(client, {.job = {.total_replicas = 2}, .ready_timeout = 20s});
      std::vector<float> w(3), gw(3);
      add(session, w, gw);
      session.initialize();
      std::vector<float> rows(12), grads(12), drows(6), dgrads(6);
      session.set_rows("emb", all, rows, grads);
      session.set_rows("dyn", dyn_ids, drows, dgrads);
      worker_step = session.pull();
      worker_read = rows;
      worker_read.insert(worker_read.end(), drows.begin(), drows.end());
      worker_w = w;
    } catch (const std::exception& e) {
      worker_error = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  Client chief(options_for({&x, &y, &z}, 0));
  TrainingSession session(chief, {.job = {.total_replicas = 2}, .restore_from = dir.path()});
  std::vector<float> w(3), gw(3);
  add(session, w, gw);
  session.initialize();
  worker.join();
  CHECK(worker_error == "");
  CHECK(worker_read == saved);
  CHECK(worker_w == saved_w);
  CHECK(worker_step >= saved_step);
  CHECK(read(chief) == saved);
  chief.push_rows("dyn", dyn_ids, one_more);  // the same update from the same rows and slots
  CHECK(read(chief) == after_one_more);
  for (const auto& t : chief.list_tables()) {
    if (t.name != "emb") continue;
    REQUIRE(t.rows_per_shard.size() == 3);
    CHECK(t.rows_per_shard == std::vector<uint64_t>{2, 2, 2});  // 'mod' over three shards
  }
}

TEST_CASE("a worker that adds a table other than the chief created is stopped at initialize") {
  PsdProcess psd;
  Client chief(options_for({&psd}, 0)), other(options_for({&psd}, 1));
  TrainingSession a(chief, {.job = {.total_replicas = 2}});
  std::vector<float> w(3), gw(3);
  a.add_variable(kW, w, gw);
  a.add_table(kEmb);
  a.initialize();
  TrainingSession b(other, {.job = {.total_replicas = 2}, .ready_timeout = 5s});
  b.add_variable(kW, w, gw);
  TableSpec wider = kEmb;
  wider.dim = 4;
  b.add_table(wider);
  CHECK_THROWS_WITH(b.initialize(), Catch::Contains("table 'emb'") && Catch::Contains("dim 4") &&
                                        Catch::Contains("dim 2"));
}
