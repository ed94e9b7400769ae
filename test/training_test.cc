// Training semantics against real psd processes: sync replicas (exactness,
// stale rejection, backup workers), bounded staleness, the chief's
// initialisation, barriers and the end of a job.
// One test program per area: its cases share the helpers at its top;
// splitting it would duplicate them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <ctime>
#include <random>
#include <thread>

#include "server/optimizer.h"
#include "ps/client.h"
#include "ps/hooks.h"
#include "ps/training_session.h"
#include "ps/worker_loop.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;
using namespace std::chrono_literals;

namespace {

ClientOptions worker_options(const std::vector<const PsdProcess*>& shards, int worker) {
  ClientOptions o;
  for (auto* s : shards) o.ps_hosts.push_back(s->address());
  o.worker_index = worker;
  o.is_chief = worker == 0;
  return o;
}

// Linear regression y = x . w + b on a fixed data shard: the gradient of the
// mean squared error, computed in float like a real worker would.
struct Shard {
  std::vector<float> x;  // (n, d)
  std::vector<float> y;  // (n)
  int d;
  void gradient(std::span<const float> w, float b, std::span<float> gw, float& gb) const {
    const int n = static_cast<int>(y.size());
    std::fill(gw.begin(), gw.end(), 0.0f);
    gb = 0;
    for (int i = 0; i < n; ++i) {
      float pred = b;
      for (int j = 0; j < d; ++j) pred += x[i * d + j] * w[j];
      const float err = pred - y[i];
      for (int j = 0; j < d; ++j) gw[j] += 2.0f * err * x[i * d + j] / n;
      gb += 2.0f * err / n;
    }
  }
};

std::vector<Shard> make_shards(int count, int n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> true_w(d);
  for (auto& v : true_w) v = dist(rng);
  std::vector<Shard> shards(count);
  for (auto& s : shards) {
    s.d = d;
    s.x.resize(n * d);
    s.y.resize(n);
    for (auto& v : s.x) v = dist(rng);
    for (int i = 0; i < n; ++i) {
      float y = 3.0f;
      for (int j = 0; j < d; ++j) y += s.x[i * d + j] * true_w[j];
      s.y[i] = y + 0.1f * dist(rng);
    }
  }
  return shards;
}

double relative_difference(std::span<const float> a, std::span<const double> b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

// A sync job of two workers on one SGD tensor "w" [2], lr 1, ready to push.
struct TwoSyncWorkers {
  explicit TwoSyncWorkers(const PsdProcess& psd)
      : chief(worker_options({&psd}, 0)), other(worker_options({&psd}, 1)) {
    const TensorSpec spec{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
    chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
    chief.create({spec});
    chief.set_ready();
    other.declare({spec});
    REQUIRE(other.wait_ready(1s));
  }
  Client chief;
  Client other;
};

}  // namespace

TEST_CASE("sync mode equals a single-process loop averaging the replicas' gradients") {
  const int workers = 3, d = 5, steps = 25;
  auto optimizer = GENERATE(OptimizerConfig::sgd(0.05f), OptimizerConfig::adam(0.05f),
                            OptimizerConfig::with_momentum(0.02f, 0.9f, true));
  PsdProcess ps0, ps1;
  auto data = make_shards(workers, 40, d, 11);
  const JobConfig job{.mode = SyncMode::kSync,
                      .replicas_to_aggregate = 3,
                      .total_replicas = 3,
                      .train_steps = steps};

  std::vector<std::thread> threads;
  std::vector<std::vector<float>> final_w(workers, std::vector<float>(d));
  std::vector<float> final_b(workers);
  std::atomic<int> failures{0};
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        Client client(worker_options({&ps0, &ps1}, w));
        TrainingSession session(client, {.job = job});
        std::vector<float> wv(d), gw(d), bv(1), gb(1);
        session.add_variable({.name = "w",
                              .shape = {uint64_t(d)},
                              .optimizer = optimizer,
                              .init = InitConfig::constant(0.5f)},
                             wv, gw);
        session.add_variable({.name = "b", .shape = {1}, .optimizer = optimizer}, bv, gb);
        session.initialize();
        while (!session.should_stop()) {
          session.run_step([&] { data[w].gradient(wv, bv[0], gw, gb[0]); });
        }
        client.pull({"w", "b"}, {std::span<float>(final_w[w]), std::span<float>(&final_b[w], 1)},
                    steps);
      } catch (const std::exception& e) {
        UNSCOPED_INFO("worker " << w << ": " << e.what());
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failures == 0);

  // The reference: one process, the same optimizer, the average of the three
  // gradients each step (float64 parameters).
  auto opt_w = make_optimizer(optimizer), opt_b = make_optimizer(optimizer);
  std::vector<float> w(d, 0.5f), b(1, 0.0f);
  auto slots_w = opt_w->make_slots(d);
  auto slots_b = opt_b->make_slots(1);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> sum_w(d, 0.0f), gw(d);
    float sum_b = 0, gb;
    for (int r = 0; r < workers; ++r) {
      data[r].gradient(w, b[0], gw, gb);
      for (int j = 0; j < d; ++j) sum_w[j] += gw[j];
      sum_b += gb;
    }
    opt_w->apply(w, sum_w, slots_w, s, 1.0f / workers);
    opt_b->apply(b, std::vector<float>{sum_b}, slots_b, s, 1.0f / workers);
  }
  std::vector<double> ref(w.begin(), w.end());
  for (int r = 0; r < workers; ++r) {
    INFO("worker " << r);
    CHECK(relative_difference(final_w[r], ref) < 1e-6);
    CHECK(final_b[r] == Approx(b[0]).epsilon(1e-6));
  }
  CHECK(std::fabs(ref[0] - 0.5) > 1e-3);  // training moved the weights

  Client observer(worker_options({&ps0, &ps1}, -1));
  for (const auto& st : observer.stats()) {
    CHECK(st.global_step == steps);
  }
}

TEST_CASE("a stale push is rejected, counted, and changes nothing") {
  PsdProcess psd;
  TwoSyncWorkers workers(psd);
  Client& chief = workers.chief;
  Client& other = workers.other;

  const std::vector<float> g = {1, 1};
  // Step 0: both contribute, the average is applied, the step advances.
  CHECK(chief.push({"w"}, {g}, 0).status[0] == PushStatus::kAccumulated);
  CHECK(chief.push({"w"}, {g}, 0).status[0] ==
        PushStatus::kDuplicate);  // at most one per worker per step
  CHECK(other.push({"w"}, {g}, 0).status[0] == PushStatus::kAccumulated);
  std::vector<float> w(2);
  auto r = chief.pull({"w"}, {std::span<float>(w)}, 1);
  CHECK(r.step == 1);
  CHECK(w == std::vector<float>{-1, -1});

  // A gradient for step 0, now that the job is at step 1: stale.
  const std::vector<float> big = {100, 100};
  auto stale = other.push({"w"}, {big}, 0);
  CHECK(stale.status[0] == PushStatus::kStale);
  CHECK(stale.step == 1);
  chief.pull({"w"}, {std::span<float>(w)}, 1);
  CHECK(w == std::vector<float>{-1, -1});
  auto st = chief.stats()[0];
  CHECK(st.stale_gradients == 1);
  CHECK(st.global_step == 1);

  // A push for a step the job has not reached is an error.
  CHECK_THROWS_WITH(other.push({"w"}, {g}, 5),
                    Catch::Contains("step 5") && Catch::Contains("at step 1"));
  CHECK_THROWS_WITH(other.push({"nope"}, {g}, 1), Catch::Contains("unknown tensor"));
  chief.pull({"w"}, {std::span<float>(w)}, 1);
  CHECK(w == std::vector<float>{-1, -1});
}

TEST_CASE(
    "sync mode refuses gradient values whose sum over the replicas would overflow; their average "
    "is applied") {
  PsdProcess psd;
  TwoSyncWorkers workers(psd);
  Client& chief = workers.chief;
  Client& other = workers.other;
  // 3e38 from each of two workers averages to 3e38 but summed to Inf, which
  // was applied: each value must stay within FLT_MAX / 2 here.
  const std::vector<float> huge = {3e38f, 0};
  CHECK_THROWS_WITH(chief.push({"w"}, {huge}, 0),
                    Catch::Contains("would overflow") && Catch::Contains("2 workers"));
  const std::vector<float> large = {1.5e38f, -1.5e38f};
  CHECK(chief.push({"w"}, {large}, 0).status[0] == PushStatus::kAccumulated);
  CHECK(other.push({"w"}, {large}, 0).status[0] == PushStatus::kAccumulated);
  std::vector<float> w(2);
  CHECK(chief.pull({"w"}, {std::span<float>(w)}, 1).step == 1);
  CHECK(w == std::vector<float>{-1.5e38f, 1.5e38f});
  CHECK(chief.stats()[0].rejected == 1);
}

TEST_CASE(
    "sync mode: a split push with one value too large for the replicas' sum is refused whole") {
  // psd refuses only the request holding the value; the client checks a
  // push it splits over shards first, or the other parts were accumulated
  // (and the worker's clean push for that step then counted as a duplicate).
  PsdProcess ps0, ps1;
  const std::size_t n = 40'000;  // three parts of 64 KiB over two shards
  const TensorSpec spec{.name = "emb", .shape = {n}, .optimizer = OptimizerConfig::sgd(1.0f)};
  auto options = [&](int worker) {
    ClientOptions o = worker_options({&ps0, &ps1}, worker);
    o.chunk_bytes = 64 << 10;
    return o;
  };
  Client chief(options(0));
  Client other(options(1));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create({spec});
  chief.set_ready();
  other.declare({spec});
  REQUIRE(other.wait_ready(1s));

  std::vector<float> bad(n, 7.0f);
  bad[n - 1] = 3e38f;  // finite, but two of them sum to Inf
  CHECK_THROWS_WITH(chief.push({"emb"}, {bad}, 0),
                    Catch::Contains("would overflow") && Catch::Contains("2 workers"));
  const std::vector<float> g(n, 0.5f);
  CHECK(chief.push({"emb"}, {g}, 0).status[0] == PushStatus::kAccumulated);
  CHECK(other.push({"emb"}, {g}, 0).status[0] == PushStatus::kAccumulated);
  std::vector<float> w(n);
  CHECK(chief.pull({"emb"}, {std::span<float>(w)}, 1).step == 1);
  CHECK(std::count(w.begin(), w.end(), -0.5f) == static_cast<std::ptrdiff_t>(n));
}

TEST_CASE("sync: every worker reports the step its push went into, the last one included") {
  // Before, only the worker whose push closed a step said so; the other
  // reported the step before (one of two workers ended at "99 global steps"
  // of 100).
  PsdProcess psd;
  const JobConfig job{
      .mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2, .train_steps = 20};
  int64_t final_step[2] = {0, 0};
  int off_by_one[2] = {0, 0};  // Catch's assertions are for the test's own thread
  auto worker = [&](int i) {
    Client client(worker_options({&psd}, i));
    TrainingSession session(client, {.job = job});
    std::vector<float> w(2), g(2, 1.0f);
    session.add_variable({.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(0.01f)}, w,
                         g);
    session.initialize();
    while (!session.should_stop()) {
      session.pull();
      if (session.should_stop()) break;  // the job ended while this worker waited
      const StepOutcome out = session.push();
      off_by_one[i] += out.global_step != out.step + 1;
    }
    final_step[i] = session.global_step();
  };
  std::thread other(worker, 1);
  worker(0);
  other.join();
  CHECK(off_by_one[0] == 0);
  CHECK(off_by_one[1] == 0);
  CHECK(final_step[0] == 20);
  CHECK(final_step[1] == 20);
}

TEST_CASE("a push can report the worker's step: blocking and async alike") {
  // Async job, 2 shards, "w" on shard 0 only: shard 1 gets the report alone.
  PsdProcess a, b;
  const JobConfig job{.mode = SyncMode::kAsync, .total_replicas = 1, .train_steps = 3};
  Client chief(worker_options({&a, &b}, 0));
  const TensorSpec spec{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  chief.init_job(job);
  chief.create({spec});
  chief.set_ready();
  const std::vector<float> g = {1, 1};
  PushResult r0 = chief.push_and_step({"w"}, {g}, 0, 0);
  CHECK(r0.status[0] == PushStatus::kApplied);
  CHECK(r0.global_step == 1);
  CHECK_FALSE(r0.stop);
  PushResult r1 = chief.push_and_step_async({"w"}, {g}, 1, 1).get();
  CHECK(r1.global_step == 2);
  PushResult r2 = chief.push_and_step({"w"}, {g}, 2, 2);
  CHECK(r2.global_step == 3);
  CHECK(r2.stop);  // train_steps reached, seen on the push itself
  for (const ShardStats& st : chief.stats()) {
    REQUIRE(st.workers.size() == 1);
    CHECK(st.workers[0].step == 3);  // both shards heard the last report: steps 0-2 done
  }
  std::vector<float> w(2);
  chief.pull({"w"}, {std::span<float>(w)});
  CHECK(w == std::vector<float>{-3, -3});
}

TEST_CASE("bounded staleness: a restarted worker goes on from the step psd recorded for it") {
  // Before, it counted from 0 again: psd ignored its steps until it passed
  // its old count, and the others ran that far past max_staleness.
  PsdProcess psd;
  const JobConfig job{.mode = SyncMode::kBoundedStaleness, .total_replicas = 2, .max_staleness = 2};
  const TensorSpec spec{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(0.01f)};
  std::vector<float> v(2), g(2, 1.0f);
  Client chief_client(worker_options({&psd}, 0));
  TrainingSession chief(chief_client, {.job = job});
  chief.add_variable(spec, v, g);
  chief.initialize();
  CHECK(chief_client.recorded_step() == -1);
  {
    Client client(worker_options({&psd}, 1));
    TrainingSession worker(client, {.job = job});
    worker.add_variable(spec, v, g);
    worker.initialize();
    CHECK(worker.local_step() == 0);
    for (int s = 0; s < 5; ++s) {
      chief.run_step([] {});
      worker.run_step([] {});
    }
  }
  Client client(worker_options({&psd}, 1));  // worker 1 restarted
  CHECK(client.recorded_step() == 5);        // steps 0-4 done
  TrainingSession worker(client, {.job = job});
  worker.add_variable(spec, v, g);
  worker.initialize();
  CHECK(worker.local_step() == 5);
  worker.run_step([] {});
  CHECK(chief_client.stats()[0].workers.at(1).step == 6);
}

TEST_CASE("backup workers: one slow worker of four does not slow the job") {
  const int steps = 20;
  // Each run is its own job, so each gets its own psd.
  auto run = [&](int workers, int replicas, int slow_worker, const std::string& prefix) {
    PsdProcess psd;
    const JobConfig job{.mode = SyncMode::kSync,
                        .replicas_to_aggregate = uint32_t(replicas),
                        .total_replicas = uint32_t(workers),
                        .train_steps = steps};
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    auto start = std::chrono::steady_clock::now();
    std::atomic<int64_t> chief_done_ns{0};
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        try {
          Client client(worker_options({&psd}, w));
          TrainingSession session(client, {.job = job});
          std::vector<float> v(64), g(64, 0.01f);
          session.add_variable(
              {.name = prefix + "v", .shape = {64}, .optimizer = OptimizerConfig::sgd(0.1f)}, v, g);
          session.initialize();
          while (!session.should_stop()) {
            session.run_step([&] { std::this_thread::sleep_for(w == slow_worker ? 250ms : 20ms); });
          }
          if (w == 0) chief_done_ns = (std::chrono::steady_clock::now() - start).count();
        } catch (const std::exception& e) {
          UNSCOPED_INFO("worker " << w << ": " << e.what());
          ++failures;
        }
      });
    }
    for (auto& t : threads) t.join();
    REQUIRE(failures == 0);
    return steps / (chief_done_ns.load() * 1e-9);
  };
  const double fast3 = run(3, 3, -1, "a/");
  const double with_slow = run(4, 3, 3, "b/");
  INFO("3 fast workers: " << fast3 << " steps/s; 3 fast + 1 slow with backup: " << with_slow
                          << " steps/s");
  CHECK(with_slow >= 0.8 * fast3);
}

TEST_CASE("a worker that finds the job done runs its hooks once per step, not again") {
  // Sync with a backup worker: the slow one's pull finds the job done, and
  // run_step() returns without a step. The documented loop calls after_step().
  PsdProcess psd;
  const JobConfig job{
      .mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 3, .train_steps = 12};
  struct Record : TrainingHook {
    std::vector<int64_t>& steps;
    explicit Record(std::vector<int64_t>& s) : steps(s) {}
    void after_step(const StepInfo& s) override { steps.push_back(s.local_step); }
  };
  std::vector<std::vector<int64_t>> seen(3);
  std::vector<int> no_step(3, 0);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      try {
        Client client(worker_options({&psd}, w));
        TrainingSession session(client, {.job = job});
        std::vector<float> v(8), g(8, 0.01f);
        session.add_variable({.name = "v", .shape = {8}, .optimizer = OptimizerConfig::sgd(0.1f)},
                             v, g);
        session.initialize();
        HookList hooks;
        hooks.add<Record>(seen[w]);
        hooks.begin();
        StepInfo info;
        while (!session.should_stop()) {
          const int64_t before = session.local_step();
          auto out = session.run_step([&] { std::this_thread::sleep_for(w == 2 ? 200ms : 10ms); });
          if (session.local_step() == before) ++no_step[w];
          info.local_step = session.local_step();
          info.global_step = out.global_step;
          hooks.after_step(info);
        }
        hooks.end(info);
      } catch (const std::exception& e) {
        UNSCOPED_INFO("worker " << w << ": " << e.what());
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failures == 0);
  INFO("the slow worker's run_step() calls without a step: " << no_step[2]);
  CHECK(no_step[2] == 1);  // the case this test is about did happen
  for (int w = 0; w < 3; ++w) {
    INFO("worker " << w);
    CHECK(std::adjacent_find(seen[w].begin(), seen[w].end(), std::greater_equal<int64_t>()) ==
          seen[w].end());  // strictly increasing
  }
}

TEST_CASE("bounded staleness keeps every worker within max_staleness of the slowest") {
  PsdProcess psd;
  const int workers = 3, steps = 12;
  const JobConfig job{.mode = SyncMode::kBoundedStaleness,
                      .total_replicas = 3,
                      .max_staleness = 2,
                      .train_steps = 0};
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::atomic<int> fast_done{0};
  std::atomic<int> slow_step_when_fast_done{-1};
  std::atomic<int> slow_step{0};
  // The bound is over connected workers (a worker not yet there holds no
  // one back): all three connect before any steps, as a launch would have
  // them; under a sanitizer the slow one's start could otherwise come late.
  std::barrier all_connected(workers);
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      bool arrived = false;
      try {
        Client client(worker_options({&psd}, w));
        TrainingSession session(client, {.job = job});
        std::vector<float> v(16), g(16, 1.0f);
        session.add_variable({.name = "v", .shape = {16}, .optimizer = OptimizerConfig::sgd(0.01f)},
                             v, g);
        session.initialize();
        arrived = true;
        all_connected.arrive_and_wait();
        for (int s = 0; s < steps; ++s) {
          session.run_step([&] { std::this_thread::sleep_for(w == 2 ? 60ms : 1ms); });
          if (w == 2) slow_step = s + 1;
        }
        if (w != 2 && ++fast_done == 1) slow_step_when_fast_done = slow_step.load();
      } catch (const std::exception& e) {
        UNSCOPED_INFO("worker " << w << ": " << e.what());
        ++failures;
        if (!arrived) all_connected.arrive_and_drop();  // the others do not wait for it
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failures == 0);
  Client observer(worker_options({&psd}, -1));
  auto st = observer.stats()[0];
  INFO("waits " << st.global_step);
  // psd's own record: no gradient applied more than 2 steps ahead of the slowest worker.
  CHECK(st.max_staleness <= 2);
  CHECK(st.staleness_waits > 0);  // the fast workers had to wait
  // The fast workers could not finish while the slow one was far behind.
  CHECK(slow_step_when_fast_done >= steps - 2 - 1);
  CHECK(st.global_step == workers * steps);
}

TEST_CASE("workers wait for the chief's initialisation, bounded") {
  PsdProcess psd;
  const TensorSpec spec{.name = "w", .shape = {3}, .init = InitConfig::constant(4.0f)};
  SECTION("and go on once it is done") {
    std::atomic<bool> ready{false};
    std::thread waiter([&] {
      Client client(worker_options({&psd}, 1));
      TrainingSession session(client, {.ready_log_interval = 100ms});
      std::vector<float> v(3), g(3);
      session.add_variable(spec, v, g);
      session.initialize();
      ready = true;
      session.pull();
      CHECK(v == std::vector<float>{4, 4, 4});
      CHECK(session.job().mode == SyncMode::kAsync);
    });
    std::this_thread::sleep_for(300ms);
    CHECK_FALSE(ready);
    Client chief_client(worker_options({&psd}, 0));
    TrainingSession chief(chief_client, {});
    std::vector<float> v(3), g(3);
    chief.add_variable(spec, v, g);
    chief.initialize();
    waiter.join();
    CHECK(ready);
  }
  SECTION("and give a clear error when the chief never comes") {
    Client client(worker_options({&psd}, 1));
    TrainingSession session(client, {.ready_timeout = 400ms, .ready_log_interval = 100ms});
    std::vector<float> v(3), g(3);
    session.add_variable(spec, v, g);
    CHECK_THROWS_WITH(session.initialize(), Catch::Contains("chief did not initialise"));
  }
}

TEST_CASE("bad job input: a second chief, a worker outside the job, another job config") {
  PsdProcess psd;
  Client chief(worker_options({&psd}, 0));
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  CHECK_THROWS_WITH(Client(worker_options({&psd}, 0)), Catch::Contains("second chief"));
  CHECK_THROWS_WITH(Client(worker_options({&psd}, 7)),
                    Catch::Contains("outside the job's 2 workers"));
  CHECK_THROWS_WITH(chief.init_job({.mode = SyncMode::kAsync}),
                    Catch::Contains("already configured"));
  // Another stop step ahead of the job is taken (a job resumed and extended).
  CHECK_NOTHROW(chief.init_job({.mode = SyncMode::kSync,
                                .replicas_to_aggregate = 2,
                                .total_replicas = 2,
                                .train_steps = 60}));
  CHECK(chief.stats()[0].job.train_steps == 60);
  // Anything else reads as one refusal, named once (it read "initJob: initJob: ... as sync (...),
  // not sync (...)").
  CHECK_THROWS_WITH(
      chief.init_job({.mode = SyncMode::kSync,
                      .replicas_to_aggregate = 1,
                      .total_replicas = 2,
                      .train_steps = 60}),
      Catch::StartsWith("initJob: the job is already configured as sync (aggregate 2 of 2), stop "
                        "at step 60, not sync "
                        "(aggregate 1 of 2), stop at step 60 (only the stop step may change"));
  // A chief restarted with restore_from names the newest checkpoint's step
  // as where a job starts: the running job goes on, at its own step.
  CHECK_NOTHROW(chief.init_job(
      {.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2, .start_step = 7}));
  CHECK(chief.stats()[0].global_step == 0);
  CHECK_THROWS_WITH(
      chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 3, .total_replicas = 2}),
      Catch::Contains("exceeds"));
  Client worker(worker_options({&psd}, 1));
  CHECK_THROWS_WITH(worker.set_ready(), Catch::Contains("only the chief"));
  // Before the chief marks the model ready, pushes are refused.
  chief.create({{.name = "w", .shape = {1}}});
  worker.declare({{.name = "w", .shape = {1}}});
  CHECK_THROWS_WITH(worker.push("w", std::vector<float>{1}),
                    Catch::Contains("not finished initialising"));
  CHECK(psd.alive());
}

TEST_CASE("barrier releases everyone together, and times out cleanly") {
  PsdProcess psd;
  std::vector<std::thread> threads;
  std::atomic<int> passed{0};
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      Client c(worker_options({&psd}, w));
      std::this_thread::sleep_for(std::chrono::milliseconds(50 * w));
      c.barrier("start", 3, 5s);
      ++passed;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(passed == 3);
  Client lone(worker_options({&psd}, -1));
  CHECK_THROWS_WITH(lone.barrier("never", 2, 200ms), Catch::Contains("timed out"));
  // A caller that timed out is not there any more: it does not count
  // (it did, and the same caller then passed a barrier of two alone).
  CHECK_THROWS_WITH(lone.barrier("never", 2, 200ms), Catch::Contains("timed out"));
  // Callers of one barrier agree on its count; one that does not is refused
  // instead of releasing the others early.
  std::atomic<uint32_t> arrived{0};
  std::thread waiter([&] {
    Client c(worker_options({&psd}, -1));
    arrived = c.barrier("x", 2, 5s);
  });
  for (int i = 0; i < 500 && lone.stats()[0].connections < 2; ++i)
    std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);  // the waiter's call is in psd
  CHECK_THROWS_WITH(lone.barrier("x", 1, 1s),
                    Catch::Contains("1 caller(s) wait for 2, this call asks for 1"));
  CHECK(arrived == 0);
  CHECK(lone.barrier("x", 2, 5s) == 2);
  waiter.join();
  CHECK(arrived == 2);
}

TEST_CASE("a worker that declares another model than the chief created is stopped at initialize") {
  PsdProcess ps0, ps1;
  Client chief(worker_options({&ps0, &ps1}, 0));
  TrainingSession chief_session(chief, {});
  std::vector<float> a(6), ga(6), b(4), gb(4);
  chief_session.add_variable({.name = "a", .shape = {2, 3}}, a, ga);
  chief_session.add_variable({.name = "b", .shape = {4}}, b, gb);
  chief_session.initialize();
  auto initialize = [&](std::vector<std::pair<std::string, std::vector<uint64_t>>> vars) {
    Client client(worker_options({&ps0, &ps1}, 1));
    TrainingSession session(client, {});
    std::vector<std::vector<float>> buffers;
    for (auto& [name, shape] : vars) {
      const TensorSpec spec{.name = name, .shape = shape};
      buffers.emplace_back(spec.num_elements());
      buffers.emplace_back(spec.num_elements());
      session.add_variable(spec, buffers[buffers.size() - 2], buffers.back());
    }
    session.initialize();
  };
  // Same element count, parts of the same length: psd alone cannot tell.
  CHECK_THROWS_WITH(initialize({{"a", {3, 2}}, {"b", {4}}}),
                    Catch::Contains("declared with shape [3, 2], the chief created [2, 3]"));
  CHECK_THROWS_WITH(initialize({{"b", {4}}, {"a", {2, 3}}}),
                    Catch::Contains("placed on other shards"));
  CHECK_THROWS_WITH(initialize({{"a", {2, 3}}, {"b", {4}}, {"c", {1}}}),
                    Catch::Contains("was not created by the chief"));
  CHECK_NOTHROW(initialize({{"a", {2, 3}}, {"b", {4}}}));
}

TEST_CASE(
    "sync mode with a shard that holds no trainable tensor is refused at setReady, not left to "
    "hang") {
  PsdProcess ps0, ps1;
  Client chief(worker_options({&ps0, &ps1}, 0));
  TrainingSession session(
      chief, {.job = {.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 1}});
  std::vector<float> v(4), g(4);
  session.add_variable({.name = "only", .shape = {4}}, v, g);  // on shard 0; shard 1 holds nothing
  // Before, shard 1 stayed at step 0 for good: a checkpoint at a step waited
  // there forever, and the shards' checkpoints never formed one step.
  CHECK_THROWS_WITH(session.initialize(), Catch::Contains("holds no trainable tensor"));
}

TEST_CASE(
    "waitReady and barrier may wait longer than call_timeout: they end as asked, not as a lost "
    "psd") {
  PsdProcess psd;
  ClientOptions o = worker_options({&psd}, 1);
  o.connect_timeout = 300ms;
  o.call_timeout = 800ms;
  Client client(o);
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(client.wait_ready(1500ms));  // no chief: never ready
  CHECK(std::chrono::steady_clock::now() - start >= 1400ms);
  CHECK_THROWS_WITH(client.barrier("alone", 2, 1500ms), Catch::Contains("timed out after 1.5 s waiting for 2 callers, had 1"));
}

TEST_CASE(
    "a worker index outside the job, seen before the job was set up, does not lower the replicas a "
    "sync step waits for") {
  PsdProcess psd;
  { Client stray(worker_options({&psd}, 7)); }  // says hello and leaves
  Client chief(worker_options({&psd}, 0));
  chief.create({{.name = "v", .shape = {1}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.set_ready();
  Client worker(worker_options({&psd}, 1));
  worker.declare({{.name = "v", .shape = {1}}});
  CHECK(chief.push({"v"}, {std::vector<float>{2}}, 0).status[0] == PushStatus::kAccumulated);
  CHECK(chief.stats()[0].global_step == 0);  // waits for worker 1 (stepped alone before)
  CHECK(worker.push({"v"}, {std::vector<float>{4}}, 0).status[0] != PushStatus::kStale);
  std::vector<float> v(1);
  CHECK(worker.pull({"v"}, {std::span<float>(v)}, 1).step == 1);
  CHECK(v[0] == -3.0f);
}

TEST_CASE(
    "bounded staleness: a push that moves the slowest worker on releases the pulls waiting for "
    "it") {
  PsdProcess psd;
  Client w0(worker_options({&psd}, 0)), w1(worker_options({&psd}, 1));
  w0.create({{.name = "v", .shape = {4}}});
  w0.init_job({.mode = SyncMode::kBoundedStaleness, .total_replicas = 2, .max_staleness = 0});
  w0.set_ready();
  w1.declare({{.name = "v", .shape = {4}}});
  std::vector<float> g(4, 0.0f), v(4);
  w0.push({"v"}, {std::span<const float>(g)}, 1);
  auto pulled = w0.pull_async({"v"}, {std::span<float>(v)}, 1);
  CHECK(pulled.wait_for(300ms) == std::future_status::timeout);  // worker 1 is at step 0
  w1.push({"v"}, {std::span<const float>(g)}, 1);                // no step report: the push alone
  CHECK(pulled.wait_for(5s) == std::future_status::ready);
}

TEST_CASE("psd exits by itself once the chief ends the job and the workers leave") {
  PsdProcess psd;
  {
    Client chief(worker_options({&psd}, 0));
    Client worker(worker_options({&psd}, 1));
    chief.finish();
    std::this_thread::sleep_for(300ms);
    CHECK(psd.alive());  // workers still connected
  }
  bool exited = false;
  for (int i = 0; i < 300 && !exited; ++i) {
    exited = !psd.alive();
    std::this_thread::sleep_for(10ms);
  }
  CHECK(exited);
}

TEST_CASE("StepTimes counts this process's CPU per step, not the time spent waiting") {
  ps::StepTimes times;
  // 40 ms of this process's CPU by std::clock (however loaded the machine,
  // within 10 s), then 100 ms asleep.
  const std::clock_t cpu0 = std::clock();
  const auto start = std::chrono::steady_clock::now();
  volatile double x = 0;
  while (std::clock() - cpu0 < CLOCKS_PER_SEC / 25 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
    x = x + 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double one = times.cpu_per_step_ms(1);
  CHECK(one >= 39);  // the spin
  CHECK(one < 90);   // not the sleep
  CHECK(times.cpu_per_step_ms(10) == Approx(one / 10).epsilon(0.1));
}
