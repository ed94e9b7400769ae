#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "server/initializer.h"
#include "ps/errors.h"
#include "ps/job.h"
#include "server/tensor_store.h"

using namespace ps;

namespace {
TensorSpec spec(std::string name, std::vector<uint64_t> shape, InitConfig init = {}) {
  TensorSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.init = std::move(init);
  s.optimizer = OptimizerConfig::sgd(1.0f);
  return s;
}
std::vector<float> read(const StoredTensor& t) {
  std::vector<float> v(t.size());
  t.read(v);
  return v;
}
}  // namespace

TEST_CASE("create is idempotent for the same shape and refuses another") {
  TensorStore store;
  auto [a, created] = store.create(spec("w", {2, 3}, InitConfig::constant(1.5f)), std::nullopt);
  REQUIRE(created);
  a->apply(std::vector<float>(6, 0.5f), 1.0f);
  auto [b, created_again] =
      store.create(spec("w", {2, 3}, InitConfig::constant(9.0f)), std::nullopt);
  CHECK_FALSE(created_again);
  CHECK(a == b);
  CHECK(read(*b) == std::vector<float>(6, 1.0f));  // kept, not re-initialised
  CHECK_THROWS_WITH(store.create(spec("w", {3, 2}), std::nullopt),
                    Catch::Contains("exists with shape [2, 3]"));
  CHECK(store.count() == 1);
  CHECK(store.bytes() == 24);
}

TEST_CASE("a view never changes: updates while it is held go to a copy") {
  TensorStore store;
  auto [t, created] = store.create(spec("w", {4}, InitConfig::constant(2.0f)), std::nullopt);
  REQUIRE(created);
  StoredTensor::View before = t->view();
  CHECK(before.version == 0);
  t->apply(std::vector<float>(4, 0.5f), 1.0f);  // SGD lr 1: 2 - 0.5
  CHECK(*before.values == std::vector<float>(4, 2.0f));
  CHECK(read(*t) == std::vector<float>(4, 1.5f));
  StoredTensor::View after = t->view();
  CHECK(after.version == 1);
  CHECK(after.values != before.values);
  // With no view held the update is in place.
  const float* storage = after.values->data();
  before = {};
  after = {};
  t->apply(std::vector<float>(4, 0.5f), 1.0f);
  StoredTensor::View now = t->view();
  CHECK(now.values->data() == storage);
  CHECK(*now.values == std::vector<float>(4, 1.0f));
}

TEST_CASE("apply skips its overflow check only for a gradient known to be within the safe bound") {
  // SGD at learning rate 3e38: a step of 1.0 from -3e38 passes -FLT_MAX.
  TensorSpec s = spec("w", {2}, InitConfig::constant(-3e38f));
  s.optimizer = OptimizerConfig::sgd(3e38f);
  TensorStore store;
  auto [t, created] = store.create(s, std::nullopt);
  REQUIRE(created);
  const float bound = t->safe_gradient_bound(1.0f);
  REQUIRE(bound > 0);
  REQUIRE(bound < 1.0f);
  // Known as it is, above the bound: tried first and refused, nothing changed.
  const std::vector<float> g{1.0f, 1.0f};
  KnownUpdate known;
  known.grad_max = 1.0f;
  CHECK_FALSE(t->update_finite(g, 1.0f, known.grad_max));
  CHECK_FALSE(t->apply(g, 1.0f, true, known));
  CHECK(t->version() == 0);
  CHECK(read(*t) == std::vector<float>(2, -3e38f));
  // Within the bound: applied without the check, and finite as the bound promises.
  const std::vector<float> small{bound, -bound};
  known.grad_max = bound;
  CHECK(t->update_finite(small, 1.0f, known.grad_max));
  CHECK(t->apply(small, 1.0f, true, known));
  CHECK(t->version() == 1);
  const std::vector<float> expected{-3e38f - 3e38f * bound, -3e38f + 3e38f * bound};
  CHECK(read(*t) == expected);
  for (float x : read(*t)) CHECK(std::isfinite(x));
  // Adam has no bound: a gradient said to be tiny is still tried.
  TensorSpec a = spec("a", {1}, InitConfig::constant(-3e38f));
  a.optimizer = OptimizerConfig::adam(3e38f);
  auto [adam, made] = store.create(a, std::nullopt);
  REQUIRE(made);
  CHECK(adam->safe_gradient_bound(1.0f) == 0);
  known.grad_max = 0;
  CHECK_FALSE(adam->apply(std::vector<float>{1.0f}, 1.0f, true, known));
  CHECK(adam->version() == 0);
}

TEST_CASE("bad specs are refused with the tensor's name") {
  TensorStore store(
      StoreLimits{.max_tensor_bytes = 1024, .max_total_bytes = 2048, .max_tensors = 3});
  CHECK_THROWS_WITH(store.create(spec("", {1}), std::nullopt), Catch::Contains("names"));
  CHECK_THROWS_WITH(store.create(spec("z", {3, 0}), std::nullopt),
                    Catch::Contains("zero dimension"));
  CHECK_THROWS_WITH(store.create(spec("big", {1000}), std::nullopt),
                    Catch::Contains("over this shard's limit"));
  CHECK_THROWS_WITH(store.create(spec("huge", {1ull << 40, 1ull << 40}), std::nullopt),
                    Catch::Contains("limit"));
  CHECK_THROWS_WITH(store.create(spec("v", {3}, InitConfig::from_values({1, 2})), std::nullopt),
                    Catch::Contains("2 initial values"));
  CHECK_THROWS_WITH(store.create(spec("n", {1}, InitConfig::from_values({NAN})), std::nullopt),
                    Catch::Contains("NaN"));
  auto bad = spec("o", {1});
  bad.optimizer.learning_rate = -1;
  CHECK_THROWS_AS(store.create(bad, std::nullopt), RequestError);
  // Lists psd keeps with a tensor are bounded: dimensions (a split tensor's
  // whole shape too) and a piecewise schedule's boundaries.
  CHECK_THROWS_WITH(store.create(spec("d17", std::vector<uint64_t>(17, 1)), std::nullopt),
                    Catch::Contains("'d17' has more than 16 dimensions"));
  CHECK_THROWS_WITH(
      store.create(spec("p/part_0", {1}), PartMeta{"p", std::vector<uint64_t>(17, 1), 0, 0, 1}),
      Catch::Contains("'p/part_0' has more than 16 dimensions"));
  auto piecewise = spec("pw", {1});
  piecewise.optimizer.schedule = LrSchedule::kPiecewise;
  piecewise.optimizer.boundaries.assign(ps::kMaxBoundaries + 1, 5);
  CHECK_THROWS_WITH(store.create(piecewise, std::nullopt),
                    Catch::Contains("at most 1024 boundaries, not 1025"));
  piecewise.optimizer.boundaries.pop_back();
  CHECK_NOTHROW(store.validate(piecewise, std::nullopt));
  CHECK(TensorStore::footprint(piecewise, 1, std::nullopt) ==
        TensorStore::footprint(spec("pw", {1}), 1, std::nullopt) + 2 * 8 * 1024);
  // Initializers that would fill the tensor with NaN/Inf, or break their
  // distribution's preconditions: each is refused.
  const float inf = std::numeric_limits<float>::infinity();
  const InitConfig bad_inits[] = {InitConfig::constant(NAN),
                                  InitConfig::constant(inf),
                                  InitConfig::uniform(0, inf, 1),
                                  InitConfig::uniform(1, -1, 1),
                                  InitConfig::uniform(-3e38f, 3e38f, 1),
                                  InitConfig::normal(0, inf, 1),
                                  InitConfig::normal(NAN, 1, 1),
                                  InitConfig::normal(0, 0, 1),
                                  InitConfig::truncated_normal(0, -1, 1),
                                  InitConfig::normal(3e38f, 1e37f, 1)};
  for (const auto& init : bad_inits) {
    INFO("initializer a=" << init.a << " b=" << init.b);
    CHECK_THROWS_WITH(store.create(spec("i", {2}, init), std::nullopt),
                      Catch::Contains("'i': initializer"));
  }
  // An update count past the largest step (a crafted restore) made Adam's
  // bias correction NaN.
  auto counted = spec("c", {1});
  counted.optimizer = OptimizerConfig::adam(0.1f);
  counted.version = uint64_t{1} << 63;
  CHECK_THROWS_WITH(store.create(counted, std::nullopt), Catch::Contains("updates applied"));
  counted.version = ps::kMaxStep;
  CHECK_NOTHROW(store.validate(counted, std::nullopt));
  CHECK(store.count() == 0);
  store.create(spec("a", {256}), std::nullopt);
  store.create(spec("b", {200}), std::nullopt);
  CHECK_THROWS_WITH(store.create(spec("c", {100}), std::nullopt), Catch::Contains("memory limit"));
  store.create(spec("d", {1}), std::nullopt);
  CHECK_THROWS_WITH(store.create(spec("e", {1}), std::nullopt), Catch::Contains("maximum number"));
}

TEST_CASE("a check with values left out counts the limits and the slots, not the values") {
  TensorStore store(
      StoreLimits{.max_tensor_bytes = 1024, .max_total_bytes = 1024, .max_tensors = 8});
  using Values = TensorStore::Values;
  auto given = spec("v", {3}, InitConfig::from_values({}));
  CHECK_THROWS_WITH(store.validate(given, std::nullopt), Catch::Contains("0 initial values"));
  CHECK_NOTHROW(store.validate(given, std::nullopt, nullptr, Values::kLeftOut));
  // Restored slots: their number still counts, their lengths do not.
  auto restored = spec("m", {3});
  restored.optimizer = OptimizerConfig::adam(0.1f);
  restored.slots = {{}, {}};
  CHECK_THROWS_WITH(store.validate(restored, std::nullopt),
                    Catch::Contains("a restored slot of 0"));
  CHECK_NOTHROW(store.validate(restored, std::nullopt, nullptr, Values::kLeftOut));
  restored.slots = {{}};
  CHECK_THROWS_WITH(store.validate(restored, std::nullopt, nullptr, Values::kLeftOut),
                    Catch::Contains("restored with 1 optimizer slots"));
  // Limits count everything checked into one Pending.
  TensorStore::Pending pending;
  store.validate(spec("a", {150}, InitConfig::from_values({})), std::nullopt, &pending,
                 Values::kLeftOut);
  CHECK_THROWS_WITH(store.validate(spec("b", {150}), std::nullopt, &pending, Values::kLeftOut),
                    Catch::Contains("memory limit"));
  CHECK(store.count() == 0);
}

TEST_CASE("a part must fit its logical tensor") {
  TensorStore store;
  PartMeta part{"big", {10}, 8, 1, 2};
  CHECK_THROWS_WITH(store.create(spec("big/part_1", {3}), part), Catch::Contains("does not fit"));
  CHECK(store.create(spec("big/part_1", {2}), part).second);
  PartMeta other{"big", {10}, 6, 1, 2};
  CHECK_THROWS_WITH(store.create(spec("big/part_1", {2}), other), Catch::Contains("part layout"));
  // Offsets and shapes whose arithmetic overflows fit nothing: 2^33 x
  // (2^31 + 1) elements wrap to 2^33, where a part of 2 would seem to fit.
  CHECK_THROWS_WITH(
      store.create(spec("wrap/part_0", {2}),
                   PartMeta{"wrap", {uint64_t{1} << 33, (uint64_t{1} << 31) + 1}, 0, 0, 2}),
      Catch::Contains("does not fit"));
  CHECK_THROWS_WITH(
      store.create(spec("wrap/part_1", {2}), PartMeta{"wrap", {10}, UINT64_MAX, 1, 2}),
      Catch::Contains("does not fit"));
}

TEST_CASE("initializers produce the documented distributions") {
  std::vector<float> v(20000);
  initialize(v, InitConfig::glorot_uniform(3), {100, 200}, 0);
  const float limit = std::sqrt(6.0f / 300.0f);
  double mean = 0;
  for (float x : v) {
    REQUIRE(std::fabs(x) <= limit);
    mean += x;
  }
  CHECK(std::fabs(mean / v.size()) < 0.01 * limit);

  // A 3x3 convolution kernel, 16 channels in, 32 out: TensorFlow's fans are
  // 9 * 16 and 9 * 32, so the values fill [-sqrt(6 / 432), sqrt(6 / 432)].
  std::vector<float> kernel(3 * 3 * 16 * 32);
  initialize(kernel, InitConfig::glorot_uniform(5), {3, 3, 16, 32}, 0);
  const float conv_limit = std::sqrt(6.0f / 432.0f);
  float largest = 0;
  for (float x : kernel) largest = std::max(largest, std::fabs(x));
  CHECK(largest <= conv_limit);
  CHECK(largest > 0.99f * conv_limit);
  uint64_t fan_in = 0, fan_out = 0;
  glorot_fans({3, 3, 16, 32}, &fan_in, &fan_out);
  CHECK((fan_in == 144 && fan_out == 288));
  glorot_fans({7}, &fan_in, &fan_out);
  CHECK((fan_in == 7 && fan_out == 7));

  initialize(v, InitConfig::truncated_normal(1.0f, 0.5f, 4), {20000}, 0);
  double m = 0, sq = 0;
  for (float x : v) {
    REQUIRE(std::fabs(x - 1.0f) <= 1.0f + 1e-6f);
    m += x;
    sq += (x - 1.0) * (x - 1.0);
  }
  CHECK(m / v.size() == Approx(1.0).margin(0.02));
  CHECK(std::sqrt(sq / v.size()) ==
        Approx(0.5 * 0.8796).epsilon(0.03));  // stddev of N truncated at 2 sigma

  std::vector<float> a(100), b(100), c(100);
  initialize(a, InitConfig::normal(0, 1, 9), {100}, 0);
  initialize(b, InitConfig::normal(0, 1, 9), {100}, 0);
  initialize(c, InitConfig::normal(0, 1, 9), {100}, 1);
  CHECK(a == b);  // same seed, same part: same values
  CHECK(a != c);  // another part: another stream

  initialize(a, InitConfig::uniform(-2, -1, 1), {100}, 0);
  for (float x : a) REQUIRE((x >= -2 && x < -1));
}
