// libpsclient against a shard that restarts from an older checkpoint in the
// middle of a sync-mode pull (test/lying_shard.h playing psd): one part of
// the pull (the dense tensors or the rows) comes from the old process, the
// other is retried on the new one.
// The worker must read what the restarted shard has, not chase a step that
// only the dead process knew (a real psd killed under load did this once:
// every re-read went back to the restart's step, and the call failed).
#include <atomic>
#include <cstring>

#include <catch2/catch.hpp>
#include <kj/exception.h>

#include "ps/client.h"
#include "test/lying_shard.h"

using ps::test::LyingShard;

namespace ps {
namespace {

constexpr int64_t kOldStep = 26;  // where the killed psd was
constexpr int64_t kNewStep = 12;  // the checkpoint the new one restored

// Each float of `bytes` set to `value`.
void fill(kj::ArrayPtr<kj::byte> bytes, float value) {
  for (std::size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float))
    std::memcpy(bytes.begin() + i, &value, sizeof(float));
}

}  // namespace

TEST_CASE("a shard restarted behind during a sync pull_with_rows is read at the step it has",
          "[restart]") {
  // Which process answers: the first connection's hello is the old psd's,
  // every later one the new psd's. The old one answers one part, then dies
  // before the other (that call fails as a lost connection does).
  const bool rows_lost = GENERATE(true, false);
  INFO("the old psd died before answering the " << (rows_lost ? "rows" : "tensors"));
  std::atomic<int> hellos{0};
  std::atomic<int> pull_calls{0}, row_calls{0};
  auto restarted = [&hellos] { return hellos.load() > 1; };
  LyingShard shard({
      .hello =
          [&hellos](wire::ShardInfo::Builder info) {
            const bool fresh = ++hellos > 1;
            info.setInstanceId(fresh ? 2 : 1);
            info.setGlobalStep(fresh ? kNewStep : kOldStep);
            info.setTensors(1);
            auto job = info.getJob();
            job.setMode(wire::SyncMode::SYNC);
            job.setReplicasToAggregate(1);
            job.setTotalReplicas(1);
          },
      .pull =
          [&restarted, &pull_calls, rows_lost](auto params, auto results) {
            ++pull_calls;
            if (!restarted() && !rows_lost)
              kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "psd was killed"));
            if (restarted()) CHECK(params.getMinStep() <= kNewStep);
            const float value = restarted() ? kNewStep : kOldStep;
            auto tensors = results.initTensors(params.getNames().size());
            for (unsigned i = 0; i < tensors.size(); ++i) {
              tensors[i].setName(params.getNames()[i]);
              fill(tensors[i].initValues(4 * sizeof(float)), value);
            }
            results.setStep(restarted() ? kNewStep : kOldStep);
          },
      .pull_rows =
          [&restarted, &row_calls, rows_lost](auto params, auto results) {
            ++row_calls;
            if (!restarted() && rows_lost)
              kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "psd was killed"));
            // What the restarted psd has: it never gets past its own step,
            // whatever min_step asks (no worker pushes in this test).
            if (restarted()) CHECK(params.getMinStep() <= kNewStep);
            const int64_t step = restarted() ? kNewStep : kOldStep;
            fill(results.initRows(params.getIds().size() * 2 * sizeof(float)), float(step));
            results.setStep(step);
          },
  });
  ClientOptions options = shard.options();
  options.reconnect_timeout = std::chrono::milliseconds(5000);
  options.worker_index = 0;
  Client client(options);
  client.declare({{.name = "w", .shape = {4}}});
  client.declare_tables({{.name = "emb", .dim = 2, .rows = 100}});

  std::vector<float> w(4), rows(6);
  const std::vector<int64_t> ids{3, 7, 9};
  const PullResult got = client.pull_with_rows({"w"}, {std::span<float>(w)},
                                               {{"emb", ids, std::span<float>(rows)}}, kOldStep);
  CHECK(got.step == kNewStep);  // the oldest step read
  CHECK(w == std::vector<float>(4, float(rows_lost ? kOldStep : kNewStep)));
  CHECK(rows == std::vector<float>(6, float(rows_lost ? kNewStep : kOldStep)));
  CHECK(hellos == 2);
  // The lost call and its retry, the other part once: no chase after the old step.
  CHECK(row_calls == (rows_lost ? 2 : 1));
  CHECK(pull_calls == (rows_lost ? 1 : 2));

  // The next step's read finds every part at the new psd's step: from then
  // on the shard is read at one step with the rest again.
  const PullResult next = client.pull_with_rows({"w"}, {std::span<float>(w)},
                                                {{"emb", ids, std::span<float>(rows)}}, kNewStep);
  CHECK(next.step == kNewStep);
  CHECK(w == std::vector<float>(4, float(kNewStep)));
  CHECK(rows == std::vector<float>(6, float(kNewStep)));
  CHECK(row_calls == (rows_lost ? 3 : 2));
  CHECK(pull_calls == (rows_lost ? 2 : 3));
}

}  // namespace ps
