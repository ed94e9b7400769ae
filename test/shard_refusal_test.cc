// Every refusal of ps::Shard's push, pull, create, initJob and report, each
// naming the problem and leaving the shard as it was (shard_fixture.h's
// Digest). Driven with the plain request types: no socket, no psd.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>

#include "test/shard_fixture.h"

using namespace ps::test;

TEST_CASE("every push refusal names the problem and changes nothing") {
  Fixture f;
  f.create_sgd("w", {1, 2, 3, 4}, 0.5f);
  f.create_sgd("b", {0}, 1.0f);
  f.push(f.chief, {{"w", {1, 1, 1, 1}}}, 0, 1);  // something to leave unchanged
  const std::vector<float> good{1, 1, 1, 1};

  refused(
      f,
      [&] {
        f.push(f.chief, {{"w", good}, {"nope", {1}}});
      },
      "unknown tensor 'nope'");
  refused(
      f,
      [&] {
        f.push(f.chief, {{"w", {1, 2, 3}}});
      },
      "expects 4 floats (16 bytes), got 12 bytes");
  refused(
      f,
      [&] {
        auto r = Fixture::request({{"w", good}});
        r.grads[0].bytes = 13;  // not whole floats
        f.push_request(f.chief, r);
      },
      "got 13 bytes");
  refused(
      f,
      [&] {
        f.push(f.chief, {{"b", {1}}, {"w", {1, NAN, 1, 1}}});
      },
      "contains NaN or Inf");
  refused(
      f,
      [&] {
        f.push(f.chief, {{"w", {1, 1, INFINITY, 1}}});
      },
      "contains NaN or Inf");
  refused(
      f,
      [&] {
        f.push(f.chief, {{"w", good}, {"w", good}});
      },
      "'w' appears twice in one request");
  refused(
      f,
      [&] {
        f.push(f.chief, {{"w", good}}, -1);
      },
      "push: step -1 is out of range");
  refused(
      f,
      [&] {
        f.push(f.chief, {{"w", good}}, ps::kMaxStep + 1);
      },
      "is out of range [0, 2^62]");
  refused(
      f,
      [&] {
        f.push(f.chief, {{"w", good}}, 0, 0, ps::kMaxStep + 1);
      },
      "push (doneStep)");
  refused(
      f,
      [&] {
        f.push(f.anon, {{"w", good}}, 0, 0, 3);
      },
      "only workers report steps");
  refused(
      f,
      [&] {
        f.push({.worker_index = -2}, {{"w", good}});
      },
      "worker index -2 is invalid");
  refused(
      f,
      [&] {
        auto r = Fixture::request({{"w", good}});
        r.grads[0].shared = ps::SharedSliceRef{1, 0, 16};
        f.push_request(f.chief, r);
      },
      "both values and a shared slice");
  refused(
      f,
      [&] {
        auto r = Fixture::request({{"w", good}});
        r.grads[0] = {"w", {}, 0, ps::SharedSliceRef{1, 0, 16}};
        f.push_request(f.chief, r);
      },
      "this connection has no shared memory region (attachMemory first)");
  // The request id of a refused push was not recorded: the same id goes through later.
  auto later = f.push(f.chief, {{"w", good}}, 0, 99);
  CHECK(later.status == std::vector<GradientStatus>{GradientStatus::kApplied});
}

TEST_CASE("push refusals by the job's rules: ready, worker range, sync's steps and sums") {
  Fixture s;
  s.create_sgd("w", {1, 2}, 0.5f);
  s.shard.init_job(
      ps::JobConfig{.mode = ps::SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 3});
  refused(
      s,
      [&] {
        s.push(s.chief, {{"w", {1, 1}}});
      },
      "the chief has not finished initialising the model");
  s.shard.set_ready();
  refused(
      s,
      [&] {
        s.push({.worker_index = 3}, {{"w", {1, 1}}});
      },
      "worker index 3 is outside the job's 3 workers");
  refused(
      s,
      [&] {
        s.push(s.anon, {{"w", {1, 1}}});
      },
      "sync mode needs a worker index");
  refused(
      s,
      [&] {
        s.push(s.w1, {{"w", {1, 1}}}, 1);
      },
      "gradient for step 1, but the job is at step 0");
  // Two workers' sum of FLT_MAX would overflow: over FLT_MAX / 2 is refused.
  refused(
      s,
      [&] {
        s.push(s.w1, {{"w", {FLT_MAX, 1}}});
      },
      "would overflow");
  CHECK(s.push(s.w1, {{"w", {FLT_MAX / 4, 1}}}).status ==
        std::vector<GradientStatus>{GradientStatus::kAccumulated});
}

TEST_CASE("--allow_nonfinite: NaN and Inf gradients are applied") {
  ps::ShardOptions options;
  options.allow_nonfinite = true;
  Fixture f(options);
  f.create_sgd("w", {1, 2}, 1.0f);
  CHECK(f.push(f.chief, {{"w", {NAN, 1}}}).status ==
        std::vector<GradientStatus>{GradientStatus::kApplied});
  auto v = f.values("w");
  CHECK(std::isnan(v[0]));
  CHECK(v[1] == 1);
}

TEST_CASE("every pull refusal names the problem, starts no reply and changes nothing") {
  ps::ShardOptions options;
  options.max_message_bytes = 1000;
  Fixture f(options);
  f.create_sgd("w", {1, 2, 3, 4}, 0.5f);
  f.create_sgd("big", std::vector<float>(200, 1.0f), 0.5f);
  auto refused_pull = [&](ps::PullRequest r, const std::string& expected) {
    CollectedPull reply;
    refused(
        f, [&] { f.io.wait(f.shard.pull(f.chief, r, reply)); }, expected);
    CHECK_FALSE(reply.started);
  };
  refused_pull({.names = {"w", "nope"}}, "unknown tensor 'nope'");
  refused_pull({.names = {"w"}, .into = {{1, 0, 16}, {1, 16, 16}}},
               "pull: 2 shared slices for 1 tensors");
  refused_pull({.names = {"w"}, .into = {{1, 0, 8}}},
               "shared slice for 'w' holds 8 bytes, the tensor 16");
  refused_pull({.names = {"w"}, .into = {{1, 0, 16}}},
               "this connection has no shared memory region");
  refused_pull({.names = {"big", "big"}}, "over this psd's message limit of 1000");
  refused_pull({.names = {"w"}, .min_step = ps::kMaxStep + 1}, "pull: step");
  // A slice of 0 bytes means "in the reply"; a negative min step, none.
  CollectedPull ok;
  f.io.wait(f.shard.pull(f.chief, {.names = {"w"}, .min_step = -5, .into = {{1, 0, 0}}}, ok));
  CHECK(ok.values[0] == std::vector<float>{1, 2, 3, 4});
  CHECK_FALSE(ok.shared[0]);
}

TEST_CASE("every create refusal names the problem and creates nothing") {
  Fixture f;
  f.create_sgd("w", {1, 2}, 0.5f);
  ps::TensorSpec a{.name = "a", .shape = {2}};
  ps::TensorSpec bad{.name = "bad", .shape = {2}, .init = ps::InitConfig::from_values({1, 2, 3})};
  refused(
      f,
      [&] {
        f.create({{a, std::nullopt}, {a, std::nullopt}});
      },
      "tensor 'a' appears twice in one request");
  refused(
      f,
      [&] {
        f.create({{a, std::nullopt}, {bad, std::nullopt}});
      },
      "'bad'");
  refused(
      f,
      [&] {
        ps::CreateRequest r{.tensors = {{a, std::nullopt}}, .values_left_out = true};
        ps::CreateReply reply;
        f.shard.create(r, reply);
      },
      "values may be left out only when validating");
  refused(
      f,
      [&] {
        ps::CreateRequest r{.tensors = {{a, std::nullopt}}, .pending_tensors = 1};
        ps::CreateReply reply;
        f.shard.create(r, reply);
      },
      "pending tensors are counted only when validating");
  CHECK(f.shard.store().find("a") == nullptr);
}

TEST_CASE("initJob and report take plain types; their refusals change nothing") {
  Fixture f;
  f.create_sgd("w", {1}, 1.0f);
  const ps::JobConfig sync{
      .mode = ps::SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 3};
  refused(
      f, [&] { f.shard.init_job({.mode = ps::SyncMode::kSync, .replicas_to_aggregate = 0}); },
      "sync mode needs replicas_to_aggregate >= 1");
  f.shard.init_job(sync);
  f.shard.init_job(sync);  // the same again: idempotent
  refused(
      f, [&] { f.shard.init_job({.mode = ps::SyncMode::kAsync}); },
      "the job is already configured");
  CHECK(f.shard.job().config() == sync);

  refused(
      f, [&] { f.shard.report(f.anon, {.step = 3}); }, "only workers report progress");
  refused(
      f, [&] { f.shard.report({.worker_index = 5}, {.step = 3}); }, "outside the job's 3 workers");
  f.shard.report(f.w1, {.step = 3, .loss = NAN, .accuracy = 0.5f});
  const auto& r = f.shard.job().worker(1).report;
  REQUIRE(r.has_value());
  CHECK(r->step == 3);
  CHECK(std::isnan(r->loss));
  CHECK(r->accuracy == 0.5f);
  CHECK(r->unix_secs > 0);
}

TEST_CASE("a job's host lists are bounded: psd keeps them and sends them in every waitReady") {
  Fixture f;
  ps::JobConfig job{.mode = ps::SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 3};
  job.worker_hosts.assign(3, std::string(ps::kMaxHostListBytes / 4 - 1, 'h'));
  job.ps_hosts.assign(1,
                      std::string(ps::kMaxHostListBytes / 4, 'p'));  // 1 byte over, with the ends
  refused(
      f, [&] { f.shard.init_job(job); },
      "the host lists take 262145 bytes, more than the 262144 a job may keep");
  CHECK_FALSE(f.shard.job().configured());
  job.ps_hosts[0].pop_back();
  f.shard.init_job(job);  // at the limit
  CHECK(f.shard.job().config().worker_hosts == job.worker_hosts);
}

TEST_CASE("a shard holds at most limits.max_tables tables; a request past it creates none") {
  ps::ShardOptions options;
  options.limits.max_tables = 3;
  Fixture f(options);
  auto table = [](std::string name) {
    return ps::ShardTableSpec{.spec = {.name = std::move(name), .dim = 2, .rows = 4}};
  };
  f.shard.create_tables({table("a"), table("b")}, false);
  f.shard.create_tables({table("a"), table("b")}, false);  // again: nothing new
  refused(
      f, [&] { f.shard.create_tables({table("c"), table("d")}, false); },
      "a shard holds at most 3 tables; this one has 2 and the request adds 2");
  CHECK(f.shard.list_tables().size() == 2);
  f.shard.create_tables({table("c")}, false);
  CHECK(f.shard.list_tables().size() == 3);
}

namespace {
// The message a push at step 0 with request id `id` is refused with: on the
// event loop (a RequestError) or from the pool (a failed promise); "" if not refused.
std::string push_refusal(Fixture& f, const ps::Caller& c, const std::vector<Grad>& grads,
                         uint64_t id, int64_t done_step = -1) {
  try {
    f.push(c, grads, 0, id, done_step);
  } catch (const ps::RequestError& e) {
    return e.what();
  } catch (const kj::Exception& e) {
    return e.getDescription().cStr();
  }
  return "";
}
}  // namespace

TEST_CASE("an async push refused for an overflowing update counts no step report and no request id") {
  ps::ShardOptions options;
  options.inline_bytes = GENERATE(uint64_t{1} << 20, uint64_t{0});  // on the loop, on the pool
  Fixture f(options);
  f.create_sgd("w", {3e38f, 0}, 1.0f);
  const Digest before = f.digest();
  CHECK_THAT(push_refusal(f, f.w1, {{"w", {-3e38f, 1}}}, 5, /*done_step=*/0),
             Catch::Contains("NaN or Inf"));
  CHECK(f.digest() == before);
  CHECK(f.shard.job().worker(1).step == 0);
  // The same id is a new request: applied, its step report counted.
  auto later = f.push(f.w1, {{"w", {1, 1}}}, 0, 5, 0);
  CHECK(later.status == std::vector<GradientStatus>{GradientStatus::kApplied});
  CHECK(later.step == 1);
  CHECK(f.values("w") == std::vector<float>{3e38f - 1, -1});
  CHECK(f.shard.counters().duplicate_requests == 0);
}

namespace {
// A sync job (1 gradient of 3 workers a step) of "a", trainable, and "b",
// non-trainable (updated on arrival), whose first value overflows with a
// gradient of -3e38.
void sync_job_with_a_nontrainable_tensor(Fixture& f) {
  f.create_sgd("a", {0}, 0.5f);
  f.create({{ps::TensorSpec{.name = "b",
                            .shape = {2},
                            .optimizer = ps::OptimizerConfig::sgd(1.0f),
                            .init = ps::InitConfig::from_values({3e38f, 0}),
                            .trainable = false},
             std::nullopt}});
  f.sync_job(1, 3);
}
}  // namespace

TEST_CASE("sync: a push refused for a non-trainable tensor's update counts none of its gradients") {
  // A non-trainable tensor is updated on arrival even in sync mode; its
  // update is checked before the push's trainable gradients count toward the step.
  ps::ShardOptions options;
  options.inline_bytes = GENERATE(uint64_t{1} << 20, uint64_t{0});  // on the loop, on the pool
  Fixture f(options);
  sync_job_with_a_nontrainable_tensor(f);
  const Digest before = f.digest();
  CHECK_THAT(push_refusal(f, f.w1, {{"a", {1}}, {"b", {-3e38f, 1}}}, 5),
             Catch::Contains("NaN or Inf"));
  CHECK(f.digest() == before);
  CHECK(f.shard.counters().rejected == 0);  // counted once, by the service that answers the call
  // The same id is a new request: a's gradient commits the step, b's is applied.
  auto later = f.push(f.w1, {{"a", {1}}, {"b", {1, 1}}}, 0, 5);
  CHECK(later.status ==
        std::vector<GradientStatus>{GradientStatus::kAccumulated, GradientStatus::kApplied});
  CHECK(f.shard.job().global_step() == 1);
  CHECK(f.values("a") == std::vector<float>{-0.5f});
  CHECK(f.values("b") == std::vector<float>{3e38f - 1, -1});
}

TEST_CASE("sync: a stale push is answered stale whatever its non-trainable updates would do") {
  // Nothing of a push for a step already done is applied: it is not refused
  // for an update that would overflow (a backup worker's push failed so).
  Fixture f;
  sync_job_with_a_nontrainable_tensor(f);
  f.push(f.w1, {{"a", {1}}, {"b", {1, 1}}});  // commits step 0
  REQUIRE(f.shard.job().global_step() == 1);
  const Digest before = f.digest();
  auto late = f.push(f.w2, {{"a", {1}}, {"b", {-3e38f, 1}}}, 0);
  CHECK(late.status == std::vector<GradientStatus>{GradientStatus::kStale, GradientStatus::kStale});
  CHECK(f.values("b") == before.values[1]);
  CHECK(f.shard.job().global_step() == 1);
}

TEST_CASE("a fixed table too large to count is refused, not allocated") {
  // Its size saturates at UINT64_MAX; with the table's bookkeeping added it
  // must stay there, not wrap to a size that passes the memory check.
  Fixture f;
  const ps::ShardTableSpec huge{.spec = {.name = "huge", .dim = 4, .rows = UINT64_MAX}};
  refused(f, [&] { f.shard.create_tables({huge}, false); }, "over its limit");
  CHECK(f.shard.list_tables().empty());
}
