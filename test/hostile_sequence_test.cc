// Hostile sequences of requests against a real psd: what one request alone
// cannot do, a client does across several (a job configured with absurd
// numbers, then a wait that psd reports on). psd refuses the bad input with a
// clear error and serves on.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <capnp/ez-rpc.h>
#include <kj/async-io.h>

#include "ps/client.h"
#include "ps/embedding.h"
#include "schema/ps.capnp.h"
#include "test/psd_process.h"
#include "test/raw_shard.h"

using namespace ps;
using ps::test::PsdProcess;
using namespace std::chrono_literals;

namespace {

// test/raw_shard.h's connection, with initJob.
struct Raw : ps::test::RawShard {
  using RawShard::RawShard;
  // The error initJob gives (empty: accepted).
  std::string init_job(wire::SyncMode mode, uint32_t aggregate, uint32_t total) {
    auto req = shard.initJobRequest();
    auto c = req.initConfig();
    c.setMode(mode);
    c.setReplicasToAggregate(aggregate);
    c.setTotalReplicas(total);
    kj::Maybe<kj::Exception> result = kj::runCatchingExceptions([&] { req.send().wait(ws()); });
    KJ_IF_MAYBE (e, result) {
      return e->getDescription().cStr();
    }
    return "";
  }
};

uint64_t rss_bytes(pid_t pid) { return ps::test::status_bytes(pid, "VmRSS"); }

ClientOptions options_for(const PsdProcess& psd) {
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  return o;
}

}  // namespace

TEST_CASE("a job of more workers than psd can tell apart is refused") {
  PsdProcess psd;
  Raw tool(psd.address());
  // Worker indices are 31-bit: a larger count would refuse every worker.
  const std::string error = tool.init_job(wire::SyncMode::ASYNC, 0, 4'000'000'000u);
  CHECK_THAT(error, Catch::Contains("at most"));
  CHECK(tool.init_job(wire::SyncMode::ASYNC, 0, 4) == "");
  Raw worker(psd.address(), 3);  // served on
  CHECK(psd.alive());
}

TEST_CASE("many barriers waiting in a job of many workers are described in a few lines") {
  PsdProcess psd;
  Raw chief(psd.address(), 0, true);
  REQUIRE(chief.init_job(wire::SyncMode::ASYNC, 0, 1024) == "");
  // One client, 2,000 barriers no one else enters: psd describes each
  // wait older than 5 s, every second, and in each stats reply.
  Raw waiter(psd.address(), 1);
  std::vector<capnp::RemotePromise<wire::Shard::BarrierResults>> waiting;
  for (int i = 0; i < 2000; ++i) {
    auto barrier = waiter.shard.barrierRequest();
    barrier.setName("b" + std::to_string(i));
    barrier.setCount(2);
    barrier.setTimeoutMs(30'000);
    waiting.push_back(barrier.send());
  }
  // The event loop runs meanwhile, so that the calls go out.
  waiter.rpc.getIoProvider().getTimer().afterDelay(7 * kj::SECONDS).wait(waiter.ws());
  Raw probe(psd.address(), 2);
  const auto start = std::chrono::steady_clock::now();
  auto stats = probe.shard.statsRequest().send().wait(probe.ws());
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 1s);
  std::size_t bytes = 0, lines = 0;
  for (auto w : stats.getStats().getWaits()) {
    bytes += w.size();
    ++lines;
  }
  INFO(lines << " lines, " << bytes << " bytes");
  CHECK(bytes < 16384);
  CHECK(lines >= 1);
  CHECK(psd.alive());
}

TEST_CASE("hellos with worker indices beyond any job leave psd no record of them") {
  // No job yet (or one of totalReplicas 0): psd keeps a record per worker
  // index it has seen, so a client that reconnects under ever new indices
  // would grow them, and every stats reply, without bound.
  PsdProcess psd;
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    const int index = i == 0 ? 2'147'483'647 : 65'536 + i;
    capnp::EzRpcClient rpc(psd.address());
    auto shard = rpc.getMain<wire::Shard>();
    auto req = shard.helloRequest();
    req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
    req.setWorkerIndex(index);
    kj::Maybe<kj::Exception> error =
        kj::runCatchingExceptions([&] { req.send().wait(rpc.getWaitScope()); });
    KJ_IF_MAYBE (e, error) {
      CHECK_THAT(e->getDescription().cStr(), Catch::Contains("at most"));
      ++refused;
    }
  }
  CHECK(refused == 300);
  Raw probe(psd.address());
  auto stats = probe.shard.statsRequest().send().wait(probe.ws());
  CHECK(stats.getStats().getWorkers().size() == 0);
  Raw worker(psd.address(), 65'535);  // the largest index served
  CHECK(psd.alive());
}

TEST_CASE("checkpoints asked for far steps do not hold psd's memory budget while they wait") {
  ps::test::TempDir dir;
  PsdProcess psd({"--max_memory_mb", "64", "--checkpoint_dir", dir.path()});
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  Client client(o);
  constexpr std::size_t kFloats = 4 << 20;  // 16 MiB, and as much to snapshot
  client.create({{.name = "w", .shape = {kFloats}, .optimizer = OptimizerConfig::sgd(0.0f)}});
  // Tiny requests for a step the job may never reach.
  Raw asker(psd.address());
  std::vector<capnp::RemotePromise<wire::Shard::CheckpointResults>> waiting;
  for (int i = 0; i < 8; ++i) {
    auto req = asker.shard.checkpointRequest();
    req.setStep(1'000'000'000 + i);
    waiting.push_back(req.send());
  }
  asker.rpc.getIoProvider().getTimer().afterDelay(500 * kj::MILLISECONDS).wait(asker.ws());
  // A worker's 16 MiB push still fits.
  std::vector<float> grad(kFloats, 1.0f);
  CHECK_NOTHROW(client.push("w", grad));
  // When a step comes, its checkpoints that fit are written, the rest refused.
  std::vector<capnp::RemotePromise<wire::Shard::CheckpointResults>> at_one;
  for (int i = 0; i < 6; ++i) {
    auto req = asker.shard.checkpointRequest();
    req.setStep(1);
    at_one.push_back(req.send());
  }
  asker.rpc.getIoProvider().getTimer().afterDelay(200 * kj::MILLISECONDS).wait(asker.ws());
  Raw worker(psd.address(), 0);
  auto done = worker.shard.stepDoneRequest();
  done.setStep(0);
  CHECK(done.send().wait(worker.ws()).getGlobalStep() == 1);
  int written = 0, refused = 0;
  for (auto& p : at_one) {
    kj::Maybe<kj::Exception> error = kj::runCatchingExceptions([&] { p.wait(asker.ws()); });
    KJ_IF_MAYBE (e, error) {
      CHECK_THAT(e->getDescription().cStr(), Catch::Contains("no memory for a snapshot"));
      ++refused;
    } else {
      ++written;
    }
  }
  CHECK(written >= 1);
  CHECK(refused >= 1);
  CHECK(psd.alive());
}

// A one-float tensor or a one-row table takes psd far more memory than its
// values (the objects, the maps' nodes, the names): counted, so that a client
// creating many cannot take psd past --max_memory_mb.
TEST_CASE("many tiny tensors cannot take psd past its memory budget") {
  PsdProcess psd({"--max_memory_mb", "64"});
  Client client(options_for(psd));
  const uint64_t before = rss_bytes(psd.pid());
  const std::string pad(400, 'x');
  std::size_t created = 0;
  std::string refusal;
  for (int batch = 0; batch < 100 && refusal.empty(); ++batch) {
    std::vector<TensorSpec> specs;
    for (int k = 0; k < 1000; ++k)
      specs.push_back({.name = std::to_string(batch * 1000 + k) + pad, .shape = {1}});
    try {
      client.create(specs);
      created += specs.size();
    } catch (const RequestError& e) {
      refusal = e.what();
    }
  }
  CHECK_THAT(refusal, Catch::Contains("memory limit"));
  CHECK(created < 64'000);
  CHECK(rss_bytes(psd.pid()) - before < (uint64_t{64} << 20));
  client.create({{.name = "after", .shape = {1}}});  // served on, if not for more tensors
}

TEST_CASE("many tiny tables cannot take psd past its memory budget") {
  PsdProcess psd({"--max_memory_mb", "64"});
  Client client(options_for(psd));
  const uint64_t before = rss_bytes(psd.pid());
  std::size_t created = 0;
  std::string refusal;
  for (int batch = 0; batch < 40 && refusal.empty(); ++batch) {
    std::vector<TableSpec> specs;
    for (int k = 0; k < 500; ++k)
      specs.push_back({.name = "t" + std::to_string(batch * 500 + k), .dim = 1, .rows = 1});
    try {
      client.create_tables(specs);
      created += specs.size();
    } catch (const RequestError& e) {
      refusal = e.what();
    }
  }
  CHECK_THAT(refusal, Catch::Contains("memory limit"));
  CHECK(created < 8'200);
  CHECK(rss_bytes(psd.pid()) - before < (uint64_t{64} << 20));
  std::vector<float> row(1);
  client.pull_rows("t0", std::vector<int64_t>{0}, row);
  CHECK(row[0] == 0.0f);
}
