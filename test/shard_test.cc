// ps::Shard driven directly with its plain request types
// (server/shard_requests.h): no socket, no psd process. Round trips with
// exact SGD values, async and sync aggregation, retried pushes, and every
// refusal push, pull and create can give, each leaving the shard as it was.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "server/compute_pool.h"
#include "server/shard.h"
#include "test/kj_test_loop.h"

namespace {

using ps::GradientStatus;

// A pull's reply as plain vectors; checks Shard calls it in its documented order.
struct CollectedPull final : ps::PullReply {
  bool started = false, stepped = false, finished = false;
  std::vector<Tensor> layout;
  int64_t global_step = -1;
  std::vector<std::vector<float>> values;
  std::vector<uint64_t> versions;
  std::vector<bool> shared;

  void start(std::span<const Tensor> tensors) override {
    REQUIRE_FALSE(started);
    started = true;
    layout.assign(tensors.begin(), tensors.end());
    values.resize(tensors.size());
    versions.assign(tensors.size(), 0);
    shared.assign(tensors.size(), false);
  }
  void step(int64_t s) override {
    REQUIRE(started);
    stepped = true;
    global_step = s;
  }
  void value(std::size_t i, uint64_t version, std::shared_ptr<const std::vector<float>> v) override {
    REQUIRE(stepped);
    versions.at(i) = version;
    values.at(i) = *v;
  }
  void in_shared(std::size_t i, uint64_t version) override {
    versions.at(i) = version;
    shared.at(i) = true;
  }
  void done() override { finished = true; }
};

struct Grad {
  std::string name;
  std::vector<float> values;
};

// Everything a refused request must leave as it was.
struct Digest {
  std::vector<std::vector<float>> values;
  std::vector<uint64_t> versions;
  uint64_t pushes, pulls, creates, stale, steps_applied, duplicates, tensors;
  int64_t step;
  bool operator==(const Digest&) const = default;
};

struct Fixture {
  ps::test::Loop io;
  ps::ComputePool pool{2};
  ps::Shard shard;
  ps::Caller chief{.worker_index = 0, .is_chief = true, .peer = "w0"};
  ps::Caller w1{.worker_index = 1, .is_chief = false, .peer = "w1"};
  ps::Caller w2{.worker_index = 2, .is_chief = false, .peer = "w2"};
  ps::Caller anon{.worker_index = -1, .is_chief = false, .peer = "anon"};

  explicit Fixture(ps::ShardOptions options = {}) : shard(options, pool, io.port.getTimer()) {
    spdlog::set_level(spdlog::level::warn);
    for (auto* c : {&chief, &w1, &w2}) shard.hello(*c);
  }
  ~Fixture() { pool.join(); }

  ps::CreateReply create(std::vector<ps::CreateRequest::Tensor> tensors, bool validate_only = false) {
    ps::CreateRequest request;
    request.tensors = std::move(tensors);
    request.validate_only = validate_only;
    ps::CreateReply reply;
    shard.create(request, reply);
    return reply;
  }
  void create_sgd(const std::string& name, std::vector<float> init, float lr) {
    const uint64_t n = init.size();
    create({{ps::TensorSpec{.name = name, .shape = {n}, .optimizer = ps::OptimizerConfig::sgd(lr),
                            .init = ps::InitConfig::from_values(std::move(init))},
             std::nullopt}});
  }

  void sync_job(uint32_t replicas, uint32_t total) {
    shard.init_job(ps::JobConfig{.mode = ps::SyncMode::kSync, .replicas_to_aggregate = replicas,
                                 .total_replicas = total});
    shard.set_ready();
  }

  static ps::PushRequest request(const std::vector<Grad>& grads, int64_t step = 0, uint64_t id = 0,
                                 int64_t done_step = -1) {
    ps::PushRequest r;
    for (const Grad& g : grads) {
      r.grads.push_back({g.name, std::span<const float>(g.values), g.values.size() * sizeof(float), std::nullopt});
    }
    r.step = step;
    r.request_id = id;
    r.done_step = done_step;
    return r;
  }

  ps::PushReply push_request(const ps::Caller& c, const ps::PushRequest& r) {
    ps::PushReply reply;
    io.wait(shard.push(c, r, reply));
    return reply;
  }
  ps::PushReply push(const ps::Caller& c, const std::vector<Grad>& grads, int64_t step = 0, uint64_t id = 0,
                     int64_t done_step = -1) {
    return push_request(c, request(grads, step, id, done_step));
  }

  CollectedPull pull(const ps::Caller& c, std::vector<std::string_view> names, int64_t min_step = 0) {
    ps::PullRequest r;
    r.names = std::move(names);
    r.min_step = min_step;
    CollectedPull reply;
    io.wait(shard.pull(c, r, reply));
    CHECK(reply.finished);
    return reply;
  }

  std::vector<float> values(const std::string& name) {
    ps::StoredTensor& t = shard.store().get(name);
    std::vector<float> v(t.size());
    t.read(v);
    return v;
  }

  Digest digest() {
    Digest d{};
    for (ps::StoredTensor* t : shard.store().all()) {
      d.values.emplace_back(t->size());
      d.versions.push_back(t->read(d.values.back()));
    }
    const auto& c = shard.counters();
    d.pushes = c.pushes;
    d.pulls = c.pulls;
    d.creates = c.creates;
    d.stale = c.stale;
    d.steps_applied = c.steps_applied;
    d.duplicates = c.duplicate_requests;
    d.tensors = shard.store().count();
    d.step = shard.job().global_step();
    return d;
  }
};

// `call` throws a RequestError whose message contains `expected`, and the shard is as it was.
template <typename F>
void refused(Fixture& f, F&& call, const std::string& expected) {
  const Digest before = f.digest();
  try {
    call();
    FAIL("not refused; expected: " << expected);
  } catch (const ps::RequestError& e) {
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(expected) != std::string::npos);
  }
  CHECK(f.digest() == before);
}

// SGD in float64: w - lr * g.
std::vector<float> sgd(std::vector<float> w, const std::vector<double>& g, double lr) {
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(static_cast<double>(w[i]) - lr * g[i]);
  return w;
}

}  // namespace

TEST_CASE("create, push and pull round trips with exact SGD values") {
  // Both paths: updates and reads on the event loop, and on the compute pool.
  const uint64_t inline_bytes = GENERATE(uint64_t{1} << 20, uint64_t{0});
  ps::ShardOptions options;
  options.inline_bytes = inline_bytes;
  Fixture f(options);
  f.create_sgd("w", {1, 2, 3, 4}, 0.5f);
  f.create_sgd("b", {10, 20}, 0.25f);
  CHECK(f.shard.counters().creates == 2);

  auto first = f.pull(f.chief, {"w", "b"});
  CHECK(first.layout.size() == 2);
  CHECK(first.layout[0].name == "w");
  CHECK(first.layout[0].bytes == 16);
  CHECK(first.values[0] == std::vector<float>{1, 2, 3, 4});
  CHECK(first.values[1] == std::vector<float>{10, 20});
  CHECK(first.versions == std::vector<uint64_t>{0, 0});
  CHECK(first.global_step == 0);

  auto reply = f.push(f.chief, {{"w", {1, 1, 2, -2}}, {"b", {4, -8}}});
  CHECK(reply.status == std::vector<GradientStatus>{GradientStatus::kApplied, GradientStatus::kApplied});
  CHECK(reply.step == 0);
  CHECK_FALSE(reply.stop);

  auto second = f.pull(f.w1, {"b", "w"});
  CHECK(second.values[1] == sgd({1, 2, 3, 4}, {1, 1, 2, -2}, 0.5));
  CHECK(second.values[0] == sgd({10, 20}, {4, -8}, 0.25));
  CHECK(second.versions == std::vector<uint64_t>{1, 1});
  CHECK(f.shard.counters().pushes == 2);
  CHECK(f.shard.counters().pulls == 4);
  CHECK(f.shard.counters().bytes_in == 24);

  // Creating the same spec again finds it; validating counts without creating.
  ps::TensorSpec w{.name = "w", .shape = {4}, .optimizer = ps::OptimizerConfig::sgd(0.5f),
                   .init = ps::InitConfig::from_values({1, 2, 3, 4})};
  auto again = f.create({{w, std::nullopt}});
  REQUIRE(again.tensors.size() == 1);
  CHECK_FALSE(again.tensors[0].created);
  CHECK(again.tensors[0].tensor == &f.shard.store().get("w"));
  auto check = f.create({{ps::TensorSpec{.name = "new", .shape = {8}}, std::nullopt}}, /*validate_only=*/true);
  CHECK(check.tensors.empty());
  CHECK(check.pending_tensors == 1);
  CHECK(check.pending_bytes == 32);
  CHECK(f.shard.store().find("new") == nullptr);
}

TEST_CASE("async: every worker's push is applied on arrival") {
  Fixture f;
  f.create_sgd("w", {0, 0}, 1.0f);
  f.push(f.chief, {{"w", {1, 2}}});
  f.push(f.w1, {{"w", {10, 20}}}, 7);
  f.push(f.w2, {{"w", {100, 200}}}, 3);
  auto p = f.pull(f.chief, {"w"});
  CHECK(p.values[0] == std::vector<float>{-111, -222});
  CHECK(p.versions[0] == 3);
  // A push's step is the worker's progress in async mode.
  CHECK(f.shard.job().worker(1).step == 7);
}

TEST_CASE("sync: N replicas averaged, one push per worker per step, stale pushes dropped") {
  ps::ShardOptions options;
  options.inline_bytes = GENERATE(uint64_t{1} << 20, uint64_t{0});
  Fixture f(options);
  f.create_sgd("w", {1, 1, 1}, 0.5f);
  f.create_sgd("b", {0}, 1.0f);
  f.sync_job(/*replicas=*/2, /*total=*/3);

  // Worker 0 first: counted, nothing applied yet.
  auto r0 = f.push(f.chief, {{"w", {2, 4, 6}}, {"b", {1}}}, 0);
  CHECK(r0.status == std::vector<GradientStatus>{GradientStatus::kAccumulated, GradientStatus::kAccumulated});
  CHECK(f.values("w") == std::vector<float>{1, 1, 1});
  // Its second push for the same step is a duplicate, dropped.
  auto dup = f.push(f.chief, {{"w", {100, 100, 100}}}, 0);
  CHECK(dup.status == std::vector<GradientStatus>{GradientStatus::kDuplicate});

  // A pull for step 1 waits until the step is committed.
  ps::PullRequest later;
  later.names = {"w"};
  later.min_step = 1;
  CollectedPull waiting;
  auto pending = f.shard.pull(f.w2, later, waiting);
  CHECK(waiting.started);
  CHECK_FALSE(waiting.stepped);

  // Worker 1 completes the step: the average of the two is applied.
  auto r1 = f.push(f.w1, {{"w", {4, 0, -2}}, {"b", {3}}}, 0);
  CHECK(r1.status == std::vector<GradientStatus>{GradientStatus::kAccumulated, GradientStatus::kAccumulated});
  CHECK(f.shard.job().global_step() == 1);
  CHECK(f.shard.counters().steps_applied == 1);
  f.io.wait(kj::mv(pending));
  CHECK(waiting.finished);
  CHECK(waiting.global_step == 1);
  CHECK(waiting.values[0] == sgd({1, 1, 1}, {3, 2, 2}, 0.5));
  CHECK(waiting.versions[0] == 1);
  CHECK(f.pull(f.chief, {"b"}).values[0] == std::vector<float>{-2});

  // Worker 2 (a backup) comes late with a gradient for step 0: stale, dropped.
  const uint64_t stale_before = f.shard.counters().stale;
  auto late = f.push(f.w2, {{"w", {9, 9, 9}}, {"b", {9}}}, 0);
  CHECK(late.status == std::vector<GradientStatus>{GradientStatus::kStale, GradientStatus::kStale});
  CHECK(late.step == 1);
  CHECK(f.shard.counters().stale == stale_before + 2);
  CHECK(f.shard.job().worker(2).stale == 2);
  CHECK(f.values("w") == sgd({1, 1, 1}, {3, 2, 2}, 0.5));

  // Step 1: two gradients complete 'w'; a third (a backup worker's) is
  // stale, while its 'b' still counts. The step commits once 'b' has two.
  f.push(f.w2, {{"w", {1, 1, 1}}}, 1);
  f.push(f.chief, {{"w", {3, 3, 3}}}, 1);
  auto backup = f.push(f.w1, {{"w", {5, 5, 5}}, {"b", {1}}}, 1);
  CHECK(backup.status == std::vector<GradientStatus>{GradientStatus::kStale, GradientStatus::kAccumulated});
  CHECK(f.shard.job().global_step() == 1);
  f.push(f.w2, {{"b", {3}}}, 1);
  CHECK(f.shard.job().global_step() == 2);
  auto after = f.pull(f.chief, {"w", "b"}, 2);
  CHECK(after.values[0] == sgd(sgd({1, 1, 1}, {3, 2, 2}, 0.5), {2, 2, 2}, 0.5));
  CHECK(after.values[1] == std::vector<float>{-4});
}

TEST_CASE("a retried push with the same request id is applied once") {
  Fixture f;
  f.create_sgd("w", {0, 0}, 1.0f);
  auto first = f.push(f.w1, {{"w", {1, 1}}}, 0, /*id=*/42, /*done_step=*/0);
  CHECK(first.status == std::vector<GradientStatus>{GradientStatus::kApplied});
  CHECK(first.step == 1);  // async: the step report moved the global step
  auto retry = f.push(f.w1, {{"w", {1, 1}}}, 0, 42, 0);
  CHECK(retry.status == first.status);
  CHECK(retry.step == 1);  // its step report is not counted again
  CHECK(f.shard.job().global_step() == 1);
  CHECK(f.values("w") == std::vector<float>{-1, -1});
  CHECK(f.shard.counters().duplicate_requests == 1);
  CHECK(f.shard.counters().pushes == 1);
  // Ids are per worker: another worker's 42 is a request of its own.
  f.push(f.w2, {{"w", {1, 1}}}, 0, 42);
  CHECK(f.values("w") == std::vector<float>{-2, -2});
}

TEST_CASE("a retried sync push is answered with the step it was first answered at") {
  Fixture s;
  s.create_sgd("w", {0}, 1.0f);
  s.sync_job(1, 3);
  auto once = s.push(s.w1, {{"w", {4}}}, 0, 7);
  CHECK(once.step == 0);
  CHECK(s.shard.job().global_step() == 1);
  auto again = s.push(s.w1, {{"w", {4}}}, 0, 7);
  CHECK(again.step == 0);
  CHECK(again.status == std::vector<GradientStatus>{GradientStatus::kAccumulated});
  CHECK(s.values("w") == std::vector<float>{-4});
}

TEST_CASE("every push refusal names the problem and changes nothing") {
  Fixture f;
  f.create_sgd("w", {1, 2, 3, 4}, 0.5f);
  f.create_sgd("b", {0}, 1.0f);
  f.push(f.chief, {{"w", {1, 1, 1, 1}}}, 0, 1);  // something to leave unchanged
  const std::vector<float> good{1, 1, 1, 1};

  refused(f, [&] { f.push(f.chief, {{"w", good}, {"nope", {1}}}); }, "unknown tensor 'nope'");
  refused(f, [&] { f.push(f.chief, {{"w", {1, 2, 3}}}); }, "expects 4 floats (16 bytes), got 12 bytes");
  refused(f, [&] {
    auto r = Fixture::request({{"w", good}});
    r.grads[0].bytes = 13;  // not whole floats
    f.push_request(f.chief, r);
  }, "got 13 bytes");
  refused(f, [&] { f.push(f.chief, {{"b", {1}}, {"w", {1, NAN, 1, 1}}}); }, "contains NaN or Inf");
  refused(f, [&] { f.push(f.chief, {{"w", {1, 1, INFINITY, 1}}}); }, "contains NaN or Inf");
  refused(f, [&] { f.push(f.chief, {{"w", good}, {"w", good}}); }, "'w' appears twice in one request");
  refused(f, [&] { f.push(f.chief, {{"w", good}}, -1); }, "push: step -1 is out of range");
  refused(f, [&] { f.push(f.chief, {{"w", good}}, ps::kMaxStep + 1); }, "is out of range [0, 2^62]");
  refused(f, [&] { f.push(f.chief, {{"w", good}}, 0, 0, ps::kMaxStep + 1); }, "push (doneStep)");
  refused(f, [&] { f.push(f.anon, {{"w", good}}, 0, 0, 3); }, "only workers report steps");
  refused(f, [&] { f.push({.worker_index = -2}, {{"w", good}}); }, "worker index -2 is invalid");
  refused(f, [&] {
    auto r = Fixture::request({{"w", good}});
    r.grads[0].shared = ps::SharedSliceRef{1, 0, 16};
    f.push_request(f.chief, r);
  }, "both values and a shared slice");
  refused(f, [&] {
    auto r = Fixture::request({{"w", good}});
    r.grads[0] = {"w", {}, 0, ps::SharedSliceRef{1, 0, 16}};
    f.push_request(f.chief, r);
  }, "this connection has no shared memory region (attachMemory first)");
  // The request id of a refused push was not recorded: the same id goes through later.
  auto later = f.push(f.chief, {{"w", good}}, 0, 99);
  CHECK(later.status == std::vector<GradientStatus>{GradientStatus::kApplied});
}

TEST_CASE("push refusals by the job's rules: ready, worker range, sync's steps and sums") {
  Fixture s;
  s.create_sgd("w", {1, 2}, 0.5f);
  s.shard.init_job(ps::JobConfig{.mode = ps::SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 3});
  refused(s, [&] { s.push(s.chief, {{"w", {1, 1}}}); }, "the chief has not finished initialising the model");
  s.shard.set_ready();
  refused(s, [&] { s.push({.worker_index = 3}, {{"w", {1, 1}}}); }, "worker index 3 is outside the job's 3 workers");
  refused(s, [&] { s.push(s.anon, {{"w", {1, 1}}}); }, "sync mode needs a worker index");
  refused(s, [&] { s.push(s.w1, {{"w", {1, 1}}}, 1); },
          "gradient for step 1, but the job is at step 0");
  // Two workers' sum of FLT_MAX would overflow: over FLT_MAX / 2 is refused.
  refused(s, [&] { s.push(s.w1, {{"w", {FLT_MAX, 1}}}); }, "would overflow");
  CHECK(s.push(s.w1, {{"w", {FLT_MAX / 4, 1}}}).status == std::vector<GradientStatus>{GradientStatus::kAccumulated});
}

TEST_CASE("--allow_nonfinite: NaN and Inf gradients are applied") {
  ps::ShardOptions options;
  options.allow_nonfinite = true;
  Fixture f(options);
  f.create_sgd("w", {1, 2}, 1.0f);
  CHECK(f.push(f.chief, {{"w", {NAN, 1}}}).status == std::vector<GradientStatus>{GradientStatus::kApplied});
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
    refused(f, [&] { f.io.wait(f.shard.pull(f.chief, r, reply)); }, expected);
    CHECK_FALSE(reply.started);
  };
  refused_pull({.names = {"w", "nope"}}, "unknown tensor 'nope'");
  refused_pull({.names = {"w"}, .into = {{1, 0, 16}, {1, 16, 16}}}, "pull: 2 shared slices for 1 tensors");
  refused_pull({.names = {"w"}, .into = {{1, 0, 8}}}, "shared slice for 'w' holds 8 bytes, the tensor 16");
  refused_pull({.names = {"w"}, .into = {{1, 0, 16}}}, "this connection has no shared memory region");
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
  refused(f, [&] { f.create({{a, std::nullopt}, {a, std::nullopt}}); }, "tensor 'a' appears twice in one request");
  refused(f, [&] { f.create({{a, std::nullopt}, {bad, std::nullopt}}); }, "'bad'");
  refused(f, [&] {
    ps::CreateRequest r{.tensors = {{a, std::nullopt}}, .values_left_out = true};
    ps::CreateReply reply;
    f.shard.create(r, reply);
  }, "values may be left out only when validating");
  refused(f, [&] {
    ps::CreateRequest r{.tensors = {{a, std::nullopt}}, .pending_tensors = 1};
    ps::CreateReply reply;
    f.shard.create(r, reply);
  }, "pending tensors are counted only when validating");
  CHECK(f.shard.store().find("a") == nullptr);
}

TEST_CASE("initJob and report take plain types; their refusals change nothing") {
  Fixture f;
  f.create_sgd("w", {1}, 1.0f);
  const ps::JobConfig sync{.mode = ps::SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 3};
  refused(f, [&] { f.shard.init_job({.mode = ps::SyncMode::kSync, .replicas_to_aggregate = 0}); },
          "sync mode needs replicas_to_aggregate >= 1");
  CHECK_FALSE(f.shard.job().configured());
  f.shard.init_job(sync);
  f.shard.init_job(sync);  // the same again: idempotent
  refused(f, [&] { f.shard.init_job({.mode = ps::SyncMode::kAsync}); }, "the job is already configured");
  CHECK(f.shard.job().config() == sync);

  refused(f, [&] { f.shard.report(f.anon, {.step = 3}); }, "only workers report progress");
  refused(f, [&] { f.shard.report({.worker_index = 5}, {.step = 3}); }, "outside the job's 3 workers");
  f.shard.report(f.w1, {.step = 3, .loss = NAN, .accuracy = 0.5f});
  const auto& r = f.shard.job().worker(1).report;
  REQUIRE(r.has_value());
  CHECK(r->step == 3);
  CHECK(std::isnan(r->loss));
  CHECK(r->accuracy == 0.5f);
  CHECK(r->unix_secs > 0);
}

TEST_CASE("gradients and values through the caller's shared memory, and its refusals") {
  Fixture f;
  f.create_sgd("w", {1, 2, 3, 4}, 0.5f);
  ps::Caller c{.worker_index = 1, .peer = "w1", .shared = ps::SharedRegion::create(4096), .shared_id = 1};
  auto* floats = reinterpret_cast<float*>(c.shared->data());
  const std::vector<float> g{2, 2, -2, 4};
  std::copy(g.begin(), g.end(), floats + 16);  // at byte 64
  auto shared_push = [&](ps::SharedSliceRef slice) {
    ps::PushRequest r;
    r.grads.push_back({"w", {}, 0, slice});
    return f.push_request(c, r);
  };
  CHECK(shared_push({1, 64, 16}).status == std::vector<GradientStatus>{GradientStatus::kApplied});
  const std::vector<float> after = sgd({1, 2, 3, 4}, {2, 2, -2, 4}, 0.5);
  CHECK(f.values("w") == after);
  CHECK(f.shard.counters().shared_bytes == 16);

  // Pulled into the region at byte 256: nothing in the reply.
  CollectedPull reply;
  f.io.wait(f.shard.pull(c, {.names = {"w"}, .into = {{1, 256, 16}}}, reply));
  CHECK(reply.shared[0]);
  CHECK(reply.values[0].empty());
  CHECK(reply.versions[0] == 1);
  CHECK(std::vector<float>(floats + 64, floats + 68) == after);

  refused(f, [&] { shared_push({2, 64, 16}); }, "push: no shared memory region 2 on this connection");
  refused(f, [&] { shared_push({1, 4088, 16}); }, "shared slice of 16 bytes at 4088 lies outside the region of 4096 bytes");
  floats[17] = NAN;
  refused(f, [&] { shared_push({1, 64, 16}); }, "contains NaN or Inf");
  refused(f, [&] {
    CollectedPull r;
    f.io.wait(f.shard.pull(c, {.names = {"w"}, .into = {{1, 4090, 16}}}, r));
  }, "pull: shared slice of 16 bytes at 4090 lies outside the region");
}
