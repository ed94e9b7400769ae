// A Shard on a test event loop with its compute pool, driven with its plain
// request types (server/shard_requests.h), for shard_test.cc and
// shard_refusal_test.cc: helpers to create, push and pull, a PullReply
// that collects into vectors, and a digest of everything a refused request
// must leave as it was.
#pragma once

#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "server/compute_pool.h"
#include "server/shard.h"
#include "test/kj_test_loop.h"

namespace ps::test {

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
  void value(std::size_t i, uint64_t version,
             std::shared_ptr<const std::vector<float>> v) override {
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

  ps::CreateReply create(std::vector<ps::CreateRequest::Tensor> tensors,
                         bool validate_only = false) {
    ps::CreateRequest request;
    request.tensors = std::move(tensors);
    request.validate_only = validate_only;
    ps::CreateReply reply;
    shard.create(request, reply);
    return reply;
  }
  void create_sgd(const std::string& name, std::vector<float> init, float lr) {
    const uint64_t n = init.size();
    create({{ps::TensorSpec{.name = name,
                            .shape = {n},
                            .optimizer = ps::OptimizerConfig::sgd(lr),
                            .init = ps::InitConfig::from_values(std::move(init))},
             std::nullopt}});
  }

  void sync_job(uint32_t replicas, uint32_t total) {
    shard.init_job(ps::JobConfig{
        .mode = ps::SyncMode::kSync, .replicas_to_aggregate = replicas, .total_replicas = total});
    shard.set_ready();
  }

  static ps::PushRequest request(const std::vector<Grad>& grads, int64_t step = 0, uint64_t id = 0,
                                 int64_t done_step = -1) {
    ps::PushRequest r;
    for (const Grad& g : grads) {
      r.grads.push_back({g.name, std::span<const float>(g.values), g.values.size() * sizeof(float),
                         std::nullopt});
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
  ps::PushReply push(const ps::Caller& c, const std::vector<Grad>& grads, int64_t step = 0,
                     uint64_t id = 0, int64_t done_step = -1) {
    return push_request(c, request(grads, step, id, done_step));
  }

  CollectedPull pull(const ps::Caller& c, std::vector<std::string_view> names,
                     int64_t min_step = 0) {
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
inline std::vector<float> sgd(std::vector<float> w, const std::vector<double>& g, double lr) {
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<float>(static_cast<double>(w[i]) - lr * g[i]);
  return w;
}

}  // namespace ps::test
