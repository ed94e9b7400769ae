// Durability against real psd processes: checkpoints on SIGTERM and on
// request, restore at start (skipping damaged files), re-sharding a
// checkpoint N -> M, and psd killed with SIGKILL mid-training.
// One test program per area: its cases share the helpers at its top;
// splitting it would duplicate them.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include <capnp/ez-rpc.h>

#include "common/checkpoint/checkpoint_file.h"
#include "schema/ps.capnp.h"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/training_session.h"
#include "test/http_test_util.h"
#include "test/psd_process.h"
#include "test/raw_shard.h"

using namespace ps;
using ps::test::PsdProcess;
using ps::test::TempDir;
using namespace std::chrono_literals;

namespace {

ClientOptions options_for(const std::vector<const PsdProcess*>& shards, int worker = -1) {
  ClientOptions o;
  for (auto* s : shards) o.ps_hosts.push_back(s->address());
  o.worker_index = worker;
  o.is_chief = worker == 0;
  o.reconnect_timeout = 10s;
  return o;
}

std::vector<std::string> ckpt_args(const TempDir& dir, double secs = 0) {
  return {"--checkpoint_dir", dir.path(), "--checkpoint_secs", std::to_string(secs)};
}

// The gradient of 0.5 |w - target|^2: depends on w, so a wrong restore of
// values or optimizer state shows in every later step.
void gradient(std::span<const float> w, std::span<float> g) {
  for (std::size_t i = 0; i < w.size(); ++i) g[i] = w[i] - std::sin(0.01f * static_cast<float>(i));
}

// A client with no worker index (client id `client`, 0: none) that pushes
// {1, 2} to tensor 'w' with a request id it picks.
struct RawPusher : ps::test::RawShard {
  explicit RawPusher(const PsdProcess& psd, uint64_t client = 0)
      : RawShard(psd.address(), -1, false, client) {}
  wire::PushStatus push(uint64_t id) {
    auto req = shard.pushRequest();
    req.setRequestId(id);
    auto g = req.initGrads(1);
    g[0].setName("w");
    const float grad[2] = {1, 2};
    g[0].setValues(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(grad), sizeof(grad)));
    return req.send().wait(ws()).getStatus()[0];
  }
};

}  // namespace

TEST_CASE(
    "psd writes a checkpoint on SIGTERM and restores it on restart, optimizer state included") {
  TempDir dir;
  const TensorSpec spec{.name = "w",
                        .shape = {100},
                        .optimizer = OptimizerConfig::adam(0.05f),
                        .init = InitConfig::uniform(-1, 1, 7)};
  std::vector<float> w(100), g(100), reference(100);
  // Reference: 8 Adam steps on one psd without interruption.
  {
    PsdProcess psd;
    Client c(options_for({&psd}));
    c.create({spec});
    for (int s = 0; s < 8; ++s) {
      c.pull("w", w);
      gradient(w, g);
      c.push("w", g);
    }
    c.pull("w", reference);
  }
  int port = 0;
  {
    PsdProcess psd(ckpt_args(dir));
    port = psd.port();
    Client c(options_for({&psd}));
    c.create({spec});
    for (int s = 0; s < 4; ++s) {
      c.pull("w", w);
      gradient(w, g);
      c.push("w", g);
    }
    CHECK(psd.stop() == 0);
    CHECK_THAT(psd.log(), Catch::Contains("checkpoint of step 0 written"));
  }
  REQUIRE(list_checkpoints(dir.path(), 0, 1).size() == 1);
  PsdProcess psd(ckpt_args(dir), port);
  CHECK_THAT(psd.log(), Catch::Contains("restored"));
  Client c(options_for({&psd}));
  c.declare({spec});
  auto list = c.list();
  REQUIRE(list.size() == 1);
  CHECK(list[0].version == 4);  // Adam's step count came back too
  for (int s = 0; s < 4; ++s) {
    c.pull("w", w);
    gradient(w, g);
    c.push("w", g);
  }
  c.pull("w", w);
  CHECK(w == reference);  // bit for bit: values, both Adam moments and the step
}

TEST_CASE(
    "a periodic checkpoint that failed is written at a later period, though nothing changed "
    "since") {
  TempDir dir;
  const std::string shard_dir = shard_checkpoint_dir(dir.path(), 0, 1);
  PsdProcess psd(ckpt_args(dir, 0.2));  // makes shard_dir: a file there is refused at start
  std::filesystem::remove(shard_dir);
  std::ofstream(shard_dir) << "a file where the shard's directory goes: every write fails";
  Client c(options_for({&psd}));
  c.create({{.name = "w", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  c.push("w", std::vector<float>{1, 2, 3, 4});
  auto log_has = [&](const std::string& text) {
    for (int i = 0; i < 100; ++i) {
      if (psd.log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  };
  REQUIRE(log_has("periodic checkpoint failed"));
  std::filesystem::remove(shard_dir);  // the disk is fine again; the job sits idle
  // Before, the failed write counted as saved, and an idle job never was.
  REQUIRE(log_has("checkpoint of step 0 written"));
  auto files = list_checkpoints(dir.path(), 0, 1);
  REQUIRE(files.size() == 1);
  CHECK(read_checkpoint(files[0].path).tensors.at(0).values == std::vector<float>{-1, -2, -3, -4});
}

TEST_CASE("a final checkpoint that cannot be written makes psd exit 3, not 0") {
  TempDir dir;
  const std::string shard_dir = shard_checkpoint_dir(dir.path(), 0, 1);
  PsdProcess psd(ckpt_args(dir));
  {
    Client c(options_for({&psd}));
    c.create({{.name = "w", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)}});
    c.push("w", std::vector<float>{1, 2, 3, 4});
  }
  std::filesystem::remove_all(shard_dir);
  std::ofstream(shard_dir) << "a file where the shard's directory goes: the last write fails";
  // Before, psd logged the failure, then "psd exited cleanly", and exited 0:
  // a supervisor saw success while the updates were lost.
  CHECK(psd.stop() == 3);
  CHECK(psd.log().find("final checkpoint failed") != std::string::npos);
  CHECK(psd.log().find("exited without its final checkpoint") != std::string::npos);
  CHECK(psd.log().find("exited cleanly") == std::string::npos);
}

namespace {

bool connect_refused(int port) {
  const int fd = ps::test::tcp_connect(port);
  if (fd >= 0) ::close(fd);
  return fd < 0;
}

}  // namespace

TEST_CASE("from SIGTERM on, the HTTP port refuses connections as the RPC port does") {
  TempDir dir;
  const std::string http_port_file = dir.path() + "/http_port";
  auto args = ckpt_args(dir);
  for (const char* a : {"--http_port", "any", "--http_port_file"}) args.emplace_back(a);
  args.push_back(http_port_file);
  PsdProcess psd(args);
  int http_port = 0;
  std::ifstream(http_port_file) >> http_port;
  REQUIRE(http_port > 0);
  {
    // Large enough that the final checkpoint takes a while to write.
    Client c(options_for({&psd}));
    c.create({{.name = "big", .shape = {24 << 20}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  }
  REQUIRE_FALSE(connect_refused(http_port));
  ::kill(psd.pid(), SIGTERM);
  // The RPC port closes first of all; the HTTP port closed only after the
  // final checkpoint, taking probes it never answered until then.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!connect_refused(psd.port()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  CHECK(connect_refused(http_port));
  CHECK(psd.stop() == 0);
  // The probe landed while the final checkpoint was still being written.
  CHECK(psd.log().find("checkpoint of step 0 written") != std::string::npos);
}

TEST_CASE(
    "a psd of another shard count than the checkpoints beside it says so as it starts empty") {
  TempDir dir;
  for (uint32_t shard = 0; shard < 3; ++shard) {  // a 3-shard job's files, steps 5 and 7
    for (int64_t step : {5, 7}) {
      ShardCheckpoint c;
      c.shard_index = shard;
      c.num_shards = 3;
      c.global_step = step;
      write_checkpoint(dir.path(), c);
    }
  }
  PsdProcess psd(ckpt_args(dir));  // shard 0 of 1
  CHECK_THAT(psd.log(), Catch::Contains("no checkpoint to restore"));
  CHECK_THAT(psd.log(),
             Catch::Contains("holds checkpoints of a job of 3 ps shards (newest step 7), "
                             "and this psd is one of 1: it starts empty"));
  Client c(options_for({&psd}));
  CHECK(c.list().empty());
  // Its own files are restored, and then nothing is said of the others.
  c.create({{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  c.checkpoint();
  PsdProcess again(ckpt_args(dir));
  CHECK_THAT(again.log(), Catch::Contains("restored"));
  CHECK_THAT(again.log(), !Catch::Contains("ps shards"));
}

TEST_CASE("a damaged newest checkpoint is reported and skipped; the next older one is restored") {
  TempDir dir;
  int port = 0;
  {
    PsdProcess psd(ckpt_args(dir));
    port = psd.port();
    Client c(options_for({&psd}, 0));
    c.create({{.name = "x", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)}});
    c.push("x", std::vector<float>{1, 1, 1, 1});
    c.step_done(0);
    CHECK(c.checkpoint().step == 1);
    c.push("x", std::vector<float>{1, 1, 1, 1});
    c.step_done(1);
    CHECK(c.checkpoint().step == 2);
    psd.kill();
  }
  auto files = list_checkpoints(dir.path(), 0, 1);
  REQUIRE(files.size() == 2);
  REQUIRE(files[0].step == 2);
  std::filesystem::resize_file(files[0].path, std::filesystem::file_size(files[0].path) - 10);
  PsdProcess psd(ckpt_args(dir), port);
  CHECK_THAT(psd.log(), Catch::Contains("skipping checkpoint " + files[0].path) &&
                            Catch::Contains("truncated"));
  Client c(options_for({&psd}));
  CHECK(c.stats()[0].global_step == 1);
  CHECK(c.stats()[0].last_checkpoint_step == 1);
  c.declare({{.name = "x", .shape = {4}}});
  CHECK(c.pull("x") == std::vector<float>{-1, -1, -1, -1});
  // The unreadable file is set aside: this run's next checkpoint (step 2
  // again) is the newest and is kept (the damaged step 2 must not stay the
  // newest by name, or pruning could remove this run's own files).
  CHECK(std::filesystem::exists(files[0].path + ".unreadable"));
  Client worker(options_for({&psd}, 0));
  worker.declare({{.name = "x", .shape = {4}}});
  worker.push("x", std::vector<float>{1, 1, 1, 1});
  worker.step_done(1);
  CHECK(worker.checkpoint().step == 2);
  auto now = list_checkpoints(dir.path(), 0, 1);
  REQUIRE(!now.empty());
  CHECK(now[0].step == 2);
  CHECK_NOTHROW(read_checkpoint(now[0].path));
}

TEST_CASE(
    "a newest checkpoint that reads back but cannot be restored leaves nothing behind; the older "
    "one is restored") {
  TempDir dir;
  int port = 0;
  {
    PsdProcess psd(ckpt_args(dir));
    port = psd.port();
    Client c(options_for({&psd}, 0));
    c.create({{.name = "x", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)},
              {.name = "y", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)}});
    c.push("x", std::vector<float>{1, 1, 1, 1});
    c.step_done(0);
    CHECK(c.checkpoint().step == 1);
    c.step_done(1);
    CHECK(c.checkpoint().step == 2);
    psd.kill();
  }
  auto files = list_checkpoints(dir.path(), 0, 1);
  REQUIRE(files.size() == 2);
  // The newest file, rewritten with a checksum-valid but impossible content:
  // "x" twice, with two shapes (fuzz/checkpoint_fuzz's kind of input). psd
  // must refuse the file whole, not restore the tensors before the second
  // "x" and then be unable to restore the older file over them.
  ShardCheckpoint bad = read_checkpoint(files[0].path);
  TensorCheckpoint twice = bad.tensors.at(0);
  REQUIRE(twice.spec.name == "x");
  twice.spec.shape = {2};
  twice.values = {7, 7};
  bad.tensors.push_back(twice);
  REQUIRE(write_checkpoint(dir.path(), bad) == files[0].path);

  PsdProcess psd(ckpt_args(dir), port);
  CHECK_THAT(psd.log(), Catch::Contains("skipping checkpoint " + files[0].path) &&
                            Catch::Contains("appears twice"));
  Client c(options_for({&psd}));
  CHECK(c.stats()[0].global_step == 1);
  CHECK(c.stats()[0].tensors == 2);
  c.declare({{.name = "x", .shape = {4}}, {.name = "y", .shape = {2}}});
  CHECK(c.pull("x") == std::vector<float>{-1, -1, -1, -1});
  CHECK(c.pull("y") == std::vector<float>{0, 0});
}

TEST_CASE("a push retried with the same request id is applied once") {
  PsdProcess psd;
  Client c(options_for({&psd}));
  c.create({{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  RawPusher raw(psd);
  auto push = [&](uint64_t id) { return raw.push(id); };
  CHECK(push(77) == wire::PushStatus::APPLIED);
  CHECK(push(77) == wire::PushStatus::APPLIED);      // the same answer again...
  CHECK(c.pull("w") == std::vector<float>{-1, -2});  // ...but applied once
  CHECK(push(78) == wire::PushStatus::APPLIED);
  CHECK(c.pull("w") == std::vector<float>{-2, -4});
}

TEST_CASE(
    "a client without a worker index keeps its own request-id window, across other clients' "
    "pushes and a restart") {
  TempDir dir;
  auto psd = std::make_unique<PsdProcess>(ckpt_args(dir));
  const int port = psd->port();
  {
    Client c(options_for({psd.get()}));
    c.create({{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  }
  {
    RawPusher a(*psd, 0xA11CE);
    CHECK(a.push(77) == wire::PushStatus::APPLIED);
  }
  {
    // Another such client pushes more than a window holds (512).
    RawPusher b(*psd, 0xB0B);
    for (uint64_t id = 1000; id < 1600; ++id) REQUIRE(b.push(id) == wire::PushStatus::APPLIED);
  }
  auto w_now = [&] {
    Client c(options_for({psd.get()}));
    c.declare({{.name = "w", .shape = {2}}});
    return c.pull("w");
  };
  CHECK(w_now() == std::vector<float>{-601, -1202});
  {
    RawPusher a_again(*psd, 0xA11CE);  // a's retry, on a new connection
    CHECK(a_again.push(77) == wire::PushStatus::APPLIED);
  }
  CHECK(w_now() == std::vector<float>{-601, -1202});  // answered, not applied again
  REQUIRE(psd->stop() == 0);
  psd = std::make_unique<PsdProcess>(ckpt_args(dir), port);
  {
    RawPusher a_after_restart(*psd, 0xA11CE);
    CHECK(a_after_restart.push(77) == wire::PushStatus::APPLIED);
  }
  CHECK(w_now() == std::vector<float>{-601, -1202});
}

TEST_CASE("psd restarted by SIGTERM under load: every push is applied exactly once") {
  TempDir dir;
  auto psd = std::make_unique<PsdProcess>(ckpt_args(dir));
  const int port = psd->port();
  const int workers = 2, pushes = 300;
  {
    Client chief(options_for({psd.get()}, 0));
    chief.create({{.name = "n", .shape = {16}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  }
  std::atomic<int> done{0}, failures{0}, pushed{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        Client c(options_for({psd.get()}, w + 1));
        c.declare({{.name = "n", .shape = {16}}});
        std::vector<float> g(16, 1.0f);
        for (int i = 0; i < pushes; ++i) {
          c.push("n", g);
          ++pushed;
          std::this_thread::sleep_for(1ms);
        }
      } catch (const std::exception& e) {
        UNSCOPED_INFO("worker " << w << ": " << e.what());
        ++failures;
      }
      ++done;
    });
  }
  while (pushed < 100) std::this_thread::sleep_for(1ms);
  CHECK(done == 0);
  CHECK(psd->stop() == 0);  // checkpoint on the way out
  psd = std::make_unique<PsdProcess>(ckpt_args(dir), port);
  for (auto& t : threads) t.join();
  REQUIRE(failures == 0);
  Client c(options_for({psd.get()}));
  c.declare({{.name = "n", .shape = {16}}});
  CHECK(c.pull("n")[0] == -static_cast<float>(workers * pushes));
}

TEST_CASE(
    "psd SIGKILLed mid-training (sync) and restarted: workers reconnect and finish from the "
    "restored step") {
  TempDir dir;
  auto psd = std::make_unique<PsdProcess>(ckpt_args(dir, 0.1));
  const int port = psd->port();
  const int workers = 2, steps = 60;
  const JobConfig job{.mode = SyncMode::kSync,
                      .replicas_to_aggregate = 2,
                      .total_replicas = 2,
                      .train_steps = steps};
  std::atomic<int> failures{0};
  std::atomic<int64_t> progress{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        Client client(options_for({psd.get()}, w));
        TrainingSession session(client, {.job = job});
        std::vector<float> v(64), g(64, 1.0f);
        session.add_variable({.name = "v", .shape = {64}, .optimizer = OptimizerConfig::sgd(0.01f)},
                             v, g);
        session.initialize();
        while (!session.should_stop()) {
          auto out = session.run_step([&] { std::this_thread::sleep_for(5ms); });
          progress = std::max<int64_t>(progress, out.global_step);
        }
      } catch (const std::exception& e) {
        UNSCOPED_INFO("worker " << w << ": " << e.what());
        ++failures;
      }
    });
  }
  while (progress < 25) std::this_thread::sleep_for(5ms);
  psd->kill();
  std::this_thread::sleep_for(300ms);  // the workers are retrying meanwhile
  psd = std::make_unique<PsdProcess>(ckpt_args(dir, 0.1), port);
  const std::string log = psd->log();
  CHECK_THAT(log, Catch::Contains("restored"));
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  Client observer(options_for({psd.get()}));
  auto st = observer.stats()[0];
  CHECK(st.global_step == steps);
  // Each step applied its update exactly once: v = -0.01 * steps (the
  // checkpoint's steps plus those trained after the restart).
  observer.declare({{.name = "v", .shape = {64}}});
  CHECK(observer.pull("v")[0] == Approx(-0.01f * steps).epsilon(1e-5));
}

TEST_CASE(
    "a sync worker waiting for the next step when psd restarts without its gradient gets the "
    "restored step") {
  // The chief's gradient for step 0 reached psd after the checkpoint and
  // died with it; step 1, which the chief waits for, needs it again. The
  // step psd came back at was the one the chief had last seen, so nothing
  // looked rolled back: the pull waited for a step psd could not reach, and
  // psd for the gradient, until call_timeout.
  TempDir dir;
  auto psd = std::make_unique<PsdProcess>(ckpt_args(dir));
  const int port = psd->port();
  auto worker = [&](int w) {
    ClientOptions o = options_for({psd.get()}, w);
    o.call_timeout = 15s;
    return o;
  };
  Client chief(worker(0)), other(worker(1));
  const TensorSpec spec{.name = "v", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)};
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create({spec});
  chief.set_ready();
  other.declare({spec});
  REQUIRE(other.wait_ready(5s));
  REQUIRE(chief.checkpoint().step == 0);
  const std::vector<float> g0(4, 1.0f), g1(4, 3.0f);
  REQUIRE(chief.push({"v"}, {g0}, 0).status == std::vector{PushStatus::kAccumulated});
  std::vector<float> v(4);
  auto waiting = chief.pull_async({"v"}, {v}, 1);
  REQUIRE(waiting.wait_for(100ms) ==
          std::future_status::timeout);  // step 1 needs the other's gradient
  psd->kill();
  psd = std::make_unique<PsdProcess>(ckpt_args(dir), port);  // step 0, without the chief's gradient
  CHECK(waiting.get().step == 0);
  CHECK(chief.rollbacks() == 1);
  // Both give step 0's gradient to the restarted psd: the step closes once.
  CHECK(chief.push({"v"}, {g0}, 0).status == std::vector{PushStatus::kAccumulated});
  CHECK(other.push({"v"}, {g1}, 0).status == std::vector{PushStatus::kAccumulated});
  CHECK(chief.pull({"v"}, {v}, 1).step == 1);
  CHECK(v == std::vector<float>(4, -2.0f));  // -(1 + 3) / 2
}

TEST_CASE(
    "a checkpoint at one sync step on 2 shards restores into 3 shards and trains on identically") {
  TempDir dir;
  const JobConfig job{.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 1};
  const std::vector<TensorSpec> specs = {
      {.name = "big",
       .shape = {3000},
       .optimizer = OptimizerConfig::adam(0.02f),
       .init = InitConfig::normal(0, 1, 3)},
      {.name = "b", .shape = {7}, .optimizer = OptimizerConfig::with_momentum(0.05f, 0.9f)}};
  auto train = [&](TrainingSession& session, std::vector<std::vector<float>>& v,
                   std::vector<std::vector<float>>& g, int steps) {
    for (int s = 0; s < steps; ++s) {
      session.run_step([&] {
        for (std::size_t i = 0; i < v.size(); ++i) gradient(v[i], g[i]);
      });
    }
  };
  auto bind = [&](TrainingSession& session, std::vector<std::vector<float>>& v,
                  std::vector<std::vector<float>>& g) {
    for (const auto& spec : specs) {
      v.emplace_back(spec.num_elements());
      g.emplace_back(spec.num_elements());
      session.add_variable(spec, v.back(), g.back());
    }
  };
  std::vector<std::vector<float>> reference;
  {
    auto args = [&](int shard) {
      auto a = ckpt_args(dir);
      a.insert(a.end(), {"--shard_index", std::to_string(shard), "--num_shards", "2"});
      return a;
    };
    PsdProcess a(args(0)), b(args(1));
    ClientOptions o = options_for({&a, &b}, 0);
    o.chunk_bytes = 4096;  // "big" goes in 3 parts
    Client client(o);
    TrainingSession session(client, {.job = job});
    std::vector<std::vector<float>> v, g;
    v.reserve(2);
    g.reserve(2);
    bind(session, v, g);
    session.initialize();
    train(session, v, g, 10);
    auto saved = client.checkpoint(10);
    CHECK(saved.step == 10);
    REQUIRE(saved.paths.size() == 2);
    for (const auto& path : saved.paths) {
      for (const auto& t : read_checkpoint(path).tensors) CHECK(t.version == 10);
    }
    CHECK_THROWS_WITH(client.checkpoint(3), Catch::Contains("has passed"));
    train(session, v, g, 5);
    session.pull();
    reference = v;
    a.kill();  // no final checkpoint: the restore below must use step 10's
    b.kill();
  }
  PsdProcess x({"--shard_index", "0", "--num_shards", "3"}),
      y({"--shard_index", "1", "--num_shards", "3"}),
      z({"--shard_index", "2", "--num_shards", "3"});
  ClientOptions o = options_for({&x, &y, &z}, 0);
  o.chunk_bytes = 8192;  // other parts than the checkpoint's: reassembled and cut anew
  Client client(o);
  TrainingSession session(client, {.job = job, .restore_from = dir.path()});
  std::vector<std::vector<float>> v, g;
  v.reserve(2);
  g.reserve(2);
  bind(session, v, g);
  session.initialize();
  CHECK(client.stats()[2].global_step == 10);
  train(session, v, g, 5);
  session.pull();
  CHECK(session.global_step() == 15);
  CHECK(v == reference);
  std::set<int> shards;
  for (const auto& t : client.list()) shards.insert(t.shards.begin(), t.shards.end());
  CHECK(shards.size() == 3);  // placed for the new job's shards
}

TEST_CASE(
    "restored into Adam from another optimizer, a tensor's first steps are Adam's first steps") {
  TempDir dir;
  const JobConfig job{.mode = SyncMode::kAsync};
  std::vector<float> v(4), g(4, 0.5f);
  {
    PsdProcess psd(ckpt_args(dir));
    Client client(options_for({&psd}, 0));
    TrainingSession session(client, {.job = job});
    session.add_variable({.name = "w", .shape = {4}, .optimizer = OptimizerConfig::sgd(0.001f)}, v,
                         g);
    session.initialize();
    for (int s = 0; s < 50; ++s) session.run_step([] {});
    client.checkpoint();
  }
  PsdProcess psd;
  Client client(options_for({&psd}, 0));
  TrainingSession session(client, {.job = job, .restore_from = dir.path()});
  session.add_variable({.name = "w", .shape = {4}, .optimizer = OptimizerConfig::adam(0.01f)}, v,
                       g);
  session.initialize();
  session.pull();
  const std::vector<float> before = v;
  for (int s = 0; s < 3; ++s) {
    session.run_step([] {});
    session.pull();
  }
  // A constant gradient: each bias-corrected Adam step moves by the learning
  // rate (g / (|g| + eps)). With the SGD count of 50 carried over, the
  // fresh moments were corrected as warm ones: 0.028 in all (after 5000
  // SGD updates, single steps of 3-6x the learning rate).
  for (std::size_t i = 0; i < v.size(); ++i) CHECK(before[i] - v[i] == Approx(0.03).epsilon(1e-3));
}

// Two shards of one job, checkpointing into one directory; shard 0 can be
// started again on its port, from its latest checkpoint.
struct TwoCheckpointingShards {
  std::vector<std::string> args(int i) const {
    return {"--checkpoint_dir", dir.path(),     "--shard_index",
            std::to_string(i),  "--num_shards", "2"};
  }
  void restart_0() { s0 = std::make_unique<PsdProcess>(args(0), port0); }

  TempDir dir;
  std::unique_ptr<PsdProcess> s0 = std::make_unique<PsdProcess>(args(0));
  PsdProcess s1{args(1)};
  const int port0 = s0->port();
};

TEST_CASE(
    "sync, 2 shards: one restarted from an older checkpoint is caught up by training, not waited "
    "for") {
  TwoCheckpointingShards shards;
  std::unique_ptr<PsdProcess>& s0 = shards.s0;
  PsdProcess& s1 = shards.s1;
  ClientOptions o;
  o.ps_hosts = {s0->address(), s1.address()};
  o.worker_index = 0;
  o.is_chief = true;
  o.reconnect_timeout = 10s;
  o.call_timeout = 20s;
  o.connect_timeout = 5s;
  Client client(o);
  TrainingSession session(client, {.job = {.mode = SyncMode::kSync,
                                           .replicas_to_aggregate = 1,
                                           .total_replicas = 1,
                                           .train_steps = 10}});
  std::vector<std::vector<float>> w(4, std::vector<float>(4)), g(4, std::vector<float>(4, 1.0f));
  for (int i = 0; i < 4; ++i) {
    std::string name = "w";
    name += std::to_string(i);
    session.add_variable({.name = name, .shape = {4}, .optimizer = OptimizerConfig::sgd(0.1f)},
                         w[i], g[i]);
  }
  session.initialize();
  for (int s = 0; s < 2; ++s) session.run_step([] {});
  REQUIRE(client.checkpoint().step == 2);
  for (int s = 0; s < 3; ++s) session.run_step([] {});
  s0->kill();
  shards.restart_0();  // back at step 2; shard 1 is at 5
  const auto start = std::chrono::steady_clock::now();
  int steps = 0;
  while (!session.should_stop() && steps < 50) {
    session.run_step([] {});
    ++steps;
  }
  // Before, the first pull re-read shard 0 waiting for step 5, which only
  // pushes at step 5 could bring: call_timeout on every step.
  CHECK(session.should_stop());
  CHECK(std::chrono::steady_clock::now() - start < 15s);
  for (const auto& st : client.stats()) CHECK(st.global_step == 10);
}

TEST_CASE(
    "psd SIGKILLed mid-training (sync) with tables and restarted: rows survive and every step's "
    "rows are applied once") {
  TempDir dir;
  auto psd = std::make_unique<PsdProcess>(ckpt_args(dir, 0.1));
  const int port = psd->port();
  const int workers = 2, steps = 60;
  const JobConfig job{.mode = SyncMode::kSync,
                      .replicas_to_aggregate = 2,
                      .total_replicas = 2,
                      .train_steps = steps};
  const TableSpec fixed{
      .name = "emb", .dim = 4, .rows = 16, .optimizer = RowOptimizerConfig::sgd(0.01f)};
  const TableSpec dyn{.name = "dyn",
                      .dim = 4,
                      .dynamic = true,
                      .placement = TablePlacement::kHash,
                      .optimizer = RowOptimizerConfig::sgd(0.01f)};
  const std::vector<int64_t> fixed_ids = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const std::vector<int64_t> dyn_ids = {-5, int64_t{1} << 40, 99};
  std::atomic<int> failures{0};
  std::atomic<int64_t> progress{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        Client client(options_for({psd.get()}, w));
        TrainingSession session(client, {.job = job});
        std::vector<float> v(8), g(8, 1.0f);
        session.add_variable({.name = "v", .shape = {8}, .optimizer = OptimizerConfig::sgd(0.01f)},
                             v, g);
        session.add_table(fixed);
        session.add_table(dyn);
        session.initialize();
        // Every worker pushes 1 for every float of every row: each step moves
        // each row by -0.01, once.
        std::vector<float> rows(fixed_ids.size() * 4), grads(rows.size(), 1.0f);
        std::vector<float> drows(dyn_ids.size() * 4), dgrads(drows.size(), 1.0f);
        while (!session.should_stop()) {
          session.set_rows("emb", fixed_ids, rows, grads);
          session.set_rows("dyn", dyn_ids, drows, dgrads);
          auto out = session.run_step([&] { std::this_thread::sleep_for(5ms); });
          progress = std::max<int64_t>(progress, out.global_step);
        }
      } catch (const std::exception& e) {
        UNSCOPED_INFO("worker " << w << ": " << e.what());
        ++failures;
      }
    });
  }
  while (progress < 25) std::this_thread::sleep_for(5ms);
  psd->kill();
  std::this_thread::sleep_for(300ms);  // the workers are retrying meanwhile
  psd = std::make_unique<PsdProcess>(ckpt_args(dir, 0.1), port);
  CHECK_THAT(psd->log(), Catch::Contains("restored"));
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  Client observer(options_for({psd.get()}));
  CHECK(observer.stats()[0].global_step == steps);
  observer.declare({{.name = "v", .shape = {8}}});
  observer.declare_tables({fixed, dyn});
  CHECK(observer.pull("v")[0] == Approx(-0.01f * steps).epsilon(1e-5));
  std::vector<float> rows(fixed_ids.size() * 4), drows(dyn_ids.size() * 4);
  observer.pull_rows("emb", fixed_ids, rows);
  observer.pull_rows("dyn", dyn_ids, drows);
  for (float r : rows) CHECK(r == Approx(-0.01f * steps).epsilon(1e-5));
  for (float r : drows) CHECK(r == Approx(-0.01f * steps).epsilon(1e-5));
  CHECK(observer.list_tables().size() == 2);
  uint64_t dyn_rows = 0;
  for (const auto& t : observer.list_tables())
    if (t.name == "dyn") dyn_rows = t.rows;
  CHECK(dyn_rows == dyn_ids.size());  // only the rows that were touched
}

TEST_CASE(
    "sync, 2 shards with a table: one restarted from an older checkpoint is caught up by "
    "training, not waited for") {
  TwoCheckpointingShards shards;
  std::unique_ptr<PsdProcess>& s0 = shards.s0;
  PsdProcess& s1 = shards.s1;
  ClientOptions o = options_for({s0.get(), &s1}, 0);
  o.call_timeout = 20s;
  o.connect_timeout = 5s;
  Client client(o);
  TrainingSession session(client, {.job = {.mode = SyncMode::kSync,
                                           .replicas_to_aggregate = 1,
                                           .total_replicas = 1,
                                           .train_steps = 10}});
  std::vector<float> w(4), g(4, 1.0f);
  session.add_variable({.name = "w", .shape = {4}, .optimizer = OptimizerConfig::sgd(0.1f)}, w, g);
  const TableSpec emb{
      .name = "emb", .dim = 2, .rows = 8, .optimizer = RowOptimizerConfig::sgd(0.1f)};
  session.add_table(emb);
  session.initialize();
  const std::vector<int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};  // 'mod': on both shards
  std::vector<float> rows(16), grads(16, 1.0f);
  auto step = [&] {
    session.set_rows("emb", ids, rows, grads);
    session.run_step([] {});
  };
  for (int s = 0; s < 2; ++s) step();
  REQUIRE(client.checkpoint().step == 2);
  for (int s = 0; s < 3; ++s) step();
  s0->kill();
  shards.restart_0();  // back at step 2; shard 1 is at 5
  const auto start = std::chrono::steady_clock::now();
  int steps = 0;
  while (!session.should_stop() && steps < 50) {
    step();
    ++steps;
  }
  CHECK(session.should_stop());
  CHECK(std::chrono::steady_clock::now() - start < 15s);
  for (const auto& st : client.stats()) CHECK(st.global_step == 10);
  // Shard 0 (even ids) trained steps 2-4 again after its restart; shard 1
  // took those pushes as stale: each shard applied each of the 10 steps once.
  client.pull_rows("emb", ids, rows);
  for (float r : rows) CHECK(r == Approx(-0.1f * 10).epsilon(1e-5));
}

TEST_CASE(
    "sync, 2 shards: a restarted shard, once at the others' step, is again read at one step with "
    "them") {
  TwoCheckpointingShards shards;
  std::unique_ptr<PsdProcess>& s0 = shards.s0;
  PsdProcess& s1 = shards.s1;
  ClientOptions o = options_for({s0.get(), &s1}, 0);
  o.call_timeout = 20s;
  o.connect_timeout = 5s;
  Client chief(o);
  const TensorSpec a{.name = "a", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  const TensorSpec b{.name = "b", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 2});
  chief.create({a, b});  // a on shard 0, b on shard 1
  chief.set_ready();
  REQUIRE(chief.list().at(0).shards == std::vector<int>{0});
  Client other(options_for({s0.get(), &s1}, 1));
  other.declare({a, b});
  const std::vector<float> one(2, 1.0f);
  std::vector<float> va(2), vb(2);
  const std::vector<std::span<float>> out = {va, vb};
  // Shard 0 restarts at the step it was at (a new process): the chief's
  // next pull finds it so, and reads both shards at step 0.
  REQUIRE(s0->stop() == 0);
  shards.restart_0();
  CHECK(chief.pull({"a", "b"}, out).step == 0);
  CHECK(chief.rollbacks() == 1);
  // Shard 1 moves to step 1 alone (worker 1's b closes it: 1 of 2 replicas).
  other.push({"b"}, {std::span<const float>(one)}, 0);
  // Shard 0 is not behind from its restart: a pull waits for it to reach
  // step 1 rather than read a at step 0 beside b at step 1.
  auto pulled = chief.pull_async({"a", "b"}, out, 0);
  const bool early = pulled.wait_for(500ms) == std::future_status::ready;
  other.push({"a"}, {std::span<const float>(one)}, 0);
  const PullResult r = pulled.get();
  CHECK_FALSE(early);
  CHECK(r.step == 1);
  CHECK(va == std::vector<float>(2, -1.0f));
  CHECK(vb == std::vector<float>(2, -1.0f));
}

TEST_CASE(
    "sync, 2 shards: a restarted shard still catching up is read at its own step after a "
    "reconnection to the same psd") {
  TwoCheckpointingShards shards;
  std::unique_ptr<PsdProcess>& s0 = shards.s0;
  PsdProcess& s1 = shards.s1;
  const TensorSpec a{.name = "a", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  const TensorSpec b{.name = "b", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  const std::vector<float> one(2, 1.0f);
  const std::vector<std::span<const float>> grads = {one, one};
  {
    ClientOptions o = options_for({s0.get(), &s1}, 0);
    o.call_timeout = 30s;
    Client setup(o);
    setup.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 1, .total_replicas = 1});
    setup.create({a, b});  // a on shard 0, b on shard 1
    setup.set_ready();
    for (int64_t s = 0; s < 2; ++s) setup.push({"a", "b"}, grads, s);
    REQUIRE(setup.checkpoint().step == 2);
    for (int64_t s = 2; s < 5; ++s) setup.push({"a", "b"}, grads, s);
  }
  // Gives up on a call after 3 s: a pull waiting for a step that never comes fails.
  ClientOptions o = options_for({s0.get(), &s1}, 0);
  o.is_chief = false;
  o.prefer_unix_socket = false;  // the push below goes out from its buffer
  o.connect_timeout = 1s;
  o.call_timeout = 3s;
  Client worker(o);
  worker.declare({a, b});
  s0->kill();
  shards.restart_0();  // back at step 2; shard 1 is at 5
  std::vector<float> va(2), vb(2);
  const std::vector<std::span<float>> out = {va, vb};
  CHECK(worker.pull({"a", "b"}, out).step == 2);
  // The connection to shard 0 is cut (a call given up), the psd the same.
  {
    ::kill(s0->pid(), SIGSTOP);
    CHECK_THROWS_AS(worker.push({"a"}, {std::span<const float>(one)}, 1), ConnectionError);
    ::kill(s0->pid(), SIGCONT);
  }
  // Shard 0 has not caught up yet: read at its step, not waited for at 5.
  CHECK(worker.pull({"a", "b"}, out).step == 2);
}

TEST_CASE(
    "sync, 2 shards: a step's pull waits for every shard its push goes to, though no id or "
    "tensor of it is there") {
  PsdProcess s0({"--shard_index", "0", "--num_shards", "2"}),
      s1({"--shard_index", "1", "--num_shards", "2"});
  Client chief(options_for({&s0, &s1}, 0));
  const TensorSpec w{.name = "w", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  const TableSpec emb{
      .name = "emb", .dim = 2, .rows = 4, .optimizer = RowOptimizerConfig::sgd(1.0f)};
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.create({w});  // on shard 0; the table's odd ids are on shard 1
  chief.create_tables({emb});
  chief.set_ready();
  const std::vector<int64_t> ids = {0};  // on shard 0
  const std::vector<float> one(2, 1.0f);
  // Worker 1's step 0 has reached shard 0; its part for shard 1 has not yet.
  capnp::EzRpcClient rpc(s0.address());
  auto shard = rpc.getMain<wire::Shard>();
  auto hello = shard.helloRequest();
  hello.setProtocolVersion(wire::K_PROTOCOL_VERSION);
  hello.setWorkerIndex(1);
  hello.send().wait(rpc.getWaitScope());
  const auto bytes = kj::arrayPtr(reinterpret_cast<const capnp::byte*>(one.data()), 8);
  {
    auto req = shard.pushRequest();
    req.setRequestId(1);
    auto g = req.initGrads(1);
    g[0].setName("w");
    g[0].setValues(bytes);
    req.send().wait(rpc.getWaitScope());
  }
  {
    auto req = shard.pushRowsRequest();
    req.setRequestId(2);
    req.setTable("emb");
    req.initIds(1).set(0, 0);
    req.setGrads(bytes);
    req.send().wait(rpc.getWaitScope());
  }
  const std::vector<RowGrads> grads = {{"emb", ids, one}};
  chief.push_and_step({"w"}, {std::span<const float>(one)}, grads, 0, 0);  // shard 0 at step 1
  std::vector<float> vw(2), rows(2);
  const std::vector<RowsInto> into = {{"emb", ids, rows}};
  auto pulled = std::async(std::launch::async, [&] {
    return chief.pull_with_rows({"w"}, {std::span<float>(vw)}, into, 1);
  });
  // Shard 1 is still at step 0: a push for step 1 there would be refused.
  const bool early = pulled.wait_for(500ms) == std::future_status::ready;
  {
    capnp::EzRpcClient rpc1(s1.address());
    auto shard1 = rpc1.getMain<wire::Shard>();
    auto hello1 = shard1.helloRequest();
    hello1.setProtocolVersion(wire::K_PROTOCOL_VERSION);
    hello1.setWorkerIndex(1);
    hello1.send().wait(rpc1.getWaitScope());
    auto req = shard1.pushRowsRequest();
    req.setRequestId(3);
    req.setTable("emb");
    req.send().wait(rpc1.getWaitScope());
  }
  CHECK_FALSE(early);
  CHECK(pulled.get().step == 1);
  CHECK(chief.push_and_step({"w"}, {std::span<const float>(one)}, grads, 1, 1).row_status ==
        std::vector<PushStatus>{PushStatus::kAccumulated});
}
