// ps::Shard driven directly with its plain request types
// (server/shard_requests.h): no socket, no psd process. Round trips with
// exact SGD values, async and sync aggregation, retried pushes, shared
// memory. The refusals are in shard_refusal_test.cc.
#include <catch2/catch.hpp>

#include <cmath>

#include "test/shard_fixture.h"

using namespace ps::test;

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
  CHECK(reply.status ==
        std::vector<GradientStatus>{GradientStatus::kApplied, GradientStatus::kApplied});
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
  ps::TensorSpec w{.name = "w",
                   .shape = {4},
                   .optimizer = ps::OptimizerConfig::sgd(0.5f),
                   .init = ps::InitConfig::from_values({1, 2, 3, 4})};
  auto again = f.create({{w, std::nullopt}});
  REQUIRE(again.tensors.size() == 1);
  CHECK_FALSE(again.tensors[0].created);
  CHECK(again.tensors[0].tensor == &f.shard.store().get("w"));
  auto check = f.create({{ps::TensorSpec{.name = "new", .shape = {8}}, std::nullopt}},
                        /*validate_only=*/true);
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
  CHECK(r0.status ==
        std::vector<GradientStatus>{GradientStatus::kAccumulated, GradientStatus::kAccumulated});
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
  CHECK(r1.status ==
        std::vector<GradientStatus>{GradientStatus::kAccumulated, GradientStatus::kAccumulated});
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
  CHECK(backup.status ==
        std::vector<GradientStatus>{GradientStatus::kStale, GradientStatus::kAccumulated});
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

TEST_CASE("gradients and values through the caller's shared memory, and its refusals") {
  Fixture f;
  f.create_sgd("w", {1, 2, 3, 4}, 0.5f);
  ps::Caller c{
      .worker_index = 1, .peer = "w1", .shared = ps::SharedRegion::create(4096), .shared_id = 1};
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

  refused(
      f,
      [&] {
        shared_push({2, 64, 16});
      },
      "push: no shared memory region 2 on this connection");
  refused(
      f,
      [&] {
        shared_push({1, 4088, 16});
      },
      "shared slice of 16 bytes at 4088 lies outside the region of 4096 bytes");
  floats[17] = NAN;
  refused(
      f,
      [&] {
        shared_push({1, 64, 16});
      },
      "contains NaN or Inf");
  refused(
      f,
      [&] {
        CollectedPull r;
        f.io.wait(f.shard.pull(c, {.names = {"w"}, .into = {{1, 4090, 16}}}, r));
      },
      "pull: shared slice of 16 bytes at 4090 lies outside the region");
}

TEST_CASE("an async checkpoint at the step a stepDone reaches keeps its request id") {
  std::shared_ptr<ps::ShardCheckpoint> saved;
  {
    Fixture f;
    f.create_sgd("w", {0}, 1.0f);
    auto at_one = f.shard.snapshot_at_step(1);
    CHECK(f.shard.step_done_request(f.w1, 0, /*request_id=*/9).first == 1);
    saved = f.io.wait(kj::mv(at_one));
  }
  REQUIRE(saved->global_step == 1);
  // Restarted from it, the stepDone retried (its reply lost) is not counted again.
  Fixture r;
  for (auto* w : {&r.chief, &r.w1, &r.w2}) r.shard.goodbye(*w);
  r.shard.restore(*saved);
  for (auto* w : {&r.chief, &r.w1, &r.w2}) r.shard.hello(*w);
  CHECK(r.shard.step_done_request(r.w1, 0, 9).first == 1);
  CHECK(r.shard.job().global_step() == 1);
  CHECK(r.shard.counters().duplicate_requests == 1);
}

TEST_CASE("the request log keeps a window per worker and per client id, bounded, across a save") {
  using ps::RecentRequest;
  using ps::RequestLog;
  RequestLog log(/*per_window=*/3, /*max_clients=*/2);
  auto client = [](uint64_t id) { return RequestLog::requester(-1, id); };
  log.record(client(1), RecentRequest{10, 0, {}});
  log.record(client(2), RecentRequest{20, 0, {}});
  for (int w = 0; w < 5; ++w) log.record(RequestLog::requester(w, 99), RecentRequest{30, 0, {}});
  CHECK(log.find(client(1), 10) != nullptr);
  CHECK(log.find(client(2), 10) == nullptr);                    // each client its own window
  CHECK(log.find(RequestLog::requester(3, 1), 30) != nullptr);  // a worker's is by index alone
  // A third client's window drops the least recently used one (client 1's
  // was recorded into first); workers' windows are not bounded by it.
  log.record(client(2), RecentRequest{21, 0, {}});
  log.record(client(3), RecentRequest{40, 0, {}});
  CHECK(log.client_windows() == 2);
  CHECK(log.find(client(1), 10) == nullptr);
  CHECK(log.find(client(2), 20) != nullptr);
  CHECK(log.find(client(3), 40) != nullptr);
  for (int w = 0; w < 5; ++w) CHECK(log.find(RequestLog::requester(w, 0), 30) != nullptr);
  // A window holds the last per_window ids.
  for (uint64_t id = 41; id <= 43; ++id) log.record(client(3), RecentRequest{id, 0, {}});
  CHECK(log.find(client(3), 40) == nullptr);
  CHECK(log.find(client(3), 41) != nullptr);
  // Clients that gave no id share one window, kept with the workers'.
  log.record(client(0), RecentRequest{50, 0, {}});
  std::map<int, std::vector<RecentRequest>> by_worker;
  std::map<uint64_t, std::vector<RecentRequest>> by_client;
  log.save(by_worker, by_client);
  CHECK(by_worker.size() == 6);  // workers 0-4 and the clients without an id (-1)
  CHECK(by_worker.at(-1).at(0).id == 50);
  CHECK(by_client.size() == 2);
  RequestLog restored(3, 2);
  restored.load(by_worker, by_client);
  CHECK(restored.find(client(2), 21) != nullptr);
  CHECK(restored.find(client(3), 43) != nullptr);
  CHECK(restored.find(client(0), 50) != nullptr);
  CHECK(restored.find(RequestLog::requester(4, 0), 30) != nullptr);
}
