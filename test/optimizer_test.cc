// Every optimizer against a float64 transcription of TensorFlow 1.x's update
// rule, over several steps with varying gradients and sync-mode scales.
#include <catch2/catch.hpp>

#include <capnp/message.h>

#include "common/wire_convert.h"

#include <cmath>
#include <limits>
#include <random>

#include "server/optimizer.h"
#include "ps/errors.h"

using ps::OptimizerConfig;

namespace {

struct Reference {
  OptimizerConfig c;
  std::vector<double> w, s0, s1;

  Reference(const OptimizerConfig& cfg, const std::vector<float>& w0)
      : c(cfg), w(w0.begin(), w0.end()) {
    const std::size_t n = w.size();
    switch (c.kind) {
      case ps::OptimizerKind::kAdagrad:
        s0.assign(n, c.initial_accumulator);
        break;
      case ps::OptimizerKind::kRmsProp:
        s0.assign(n, 1.0);
        s1.assign(n, 0.0);
        break;
      default:
        s0.assign(n, 0.0);
        s1.assign(n, 0.0);
    }
  }

  double lr(int64_t step) const {
    double base = c.learning_rate;
    if (c.schedule == ps::LrSchedule::kExponentialDecay) {
      double p = double(step) / double(c.decay_steps);
      if (c.staircase) p = std::floor(p);
      return base * std::pow(double(c.decay_rate), p);
    }
    if (c.schedule == ps::LrSchedule::kPiecewise) {
      int k = 0;
      for (auto b : c.boundaries) k += step > b;
      return base * std::pow(double(c.decay_rate), k);
    }
    if (c.schedule == ps::LrSchedule::kCosineDecay) {
      const double p =
          std::min<double>(double(step), double(c.decay_steps)) / double(c.decay_steps);
      return base *
             (c.alpha + (1.0 - c.alpha) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * p)));
    }
    return base;
  }

  void apply(const std::vector<float>& gf, int64_t step, double scale) {
    const double a = lr(step);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double g = double(gf[i]) * scale;
      switch (c.kind) {
        case ps::OptimizerKind::kSgd:
          w[i] -= a * g;
          break;
        case ps::OptimizerKind::kMomentum:
          s0[i] = c.momentum * s0[i] + g;
          w[i] -= c.nesterov ? a * (g + c.momentum * s0[i]) : a * s0[i];
          break;
        case ps::OptimizerKind::kAdam: {
          const double t = double(step + 1);
          const double lr_t =
              a * std::sqrt(1 - std::pow(double(c.beta2), t)) / (1 - std::pow(double(c.beta1), t));
          s0[i] = c.beta1 * s0[i] + (1 - double(c.beta1)) * g;
          s1[i] = c.beta2 * s1[i] + (1 - double(c.beta2)) * g * g;
          w[i] -= lr_t * s0[i] / (std::sqrt(s1[i]) + c.epsilon);
          break;
        }
        case ps::OptimizerKind::kAdagrad:
          s0[i] += g * g;
          w[i] -= a * g / std::sqrt(s0[i]);
          break;
        case ps::OptimizerKind::kRmsProp:
          s0[i] = c.decay * s0[i] + (1 - double(c.decay)) * g * g;
          s1[i] = c.momentum * s1[i] + a * g / std::sqrt(s0[i] + c.epsilon);
          w[i] -= s1[i];
          break;
      }
    }
  }
};

void check_matches(const OptimizerConfig& config) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t n = 1000;  // not a multiple of the vector width
  std::vector<float> w(n + 3);
  for (auto& x : w) x = dist(rng);
  w.resize(n);
  Reference ref(config, w);
  auto opt = ps::make_optimizer(config);
  auto slots = opt->make_slots(n);
  std::vector<float> g(n);
  for (int step = 0; step < 8; ++step) {
    for (auto& x : g) x = dist(rng);
    const float scale = step % 2 ? 1.0f : 1.0f / 3.0f;
    opt->apply(w, g, slots, step, scale);
    ref.apply(g, step, scale);
  }
  // Norm-wise relative error: elementwise ratios blow up where a weight
  // crosses zero, yet float32 cannot do better there than its rounding.
  double diff = 0, norm = 0, worst_abs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff += (double(w[i]) - ref.w[i]) * (double(w[i]) - ref.w[i]);
    norm += ref.w[i] * ref.w[i];
    worst_abs = std::max(worst_abs, std::fabs(double(w[i]) - ref.w[i]));
  }
  const double relative = std::sqrt(diff / norm);
  INFO("relative error " << relative << ", worst absolute " << worst_abs);
  CHECK(relative < 1e-6);
  CHECK(worst_abs < 1e-5);
}

}  // namespace

TEST_CASE("SGD matches the float64 reference") { check_matches(OptimizerConfig::sgd(0.1f)); }
TEST_CASE("momentum matches the float64 reference") {
  check_matches(OptimizerConfig::with_momentum(0.05f, 0.9f));
}
TEST_CASE("Nesterov momentum matches the float64 reference") {
  check_matches(OptimizerConfig::with_momentum(0.05f, 0.9f, true));
}
TEST_CASE("Adam matches the float64 reference") { check_matches(OptimizerConfig::adam(0.01f)); }
TEST_CASE("Adagrad matches the float64 reference") {
  check_matches(OptimizerConfig::adagrad(0.1f));
}
TEST_CASE("RMSProp matches the float64 reference") {
  check_matches(OptimizerConfig::rmsprop(0.01f, 0.9f, 0.5f));
}

TEST_CASE("learning-rate schedules match tf.train semantics") {
  auto c = OptimizerConfig::sgd(0.1f);
  c.schedule = ps::LrSchedule::kExponentialDecay;
  c.decay_rate = 0.5f;
  c.decay_steps = 10;
  CHECK(c.learning_rate_at(0) == Approx(0.1));
  CHECK(c.learning_rate_at(10) == Approx(0.05));
  CHECK(c.learning_rate_at(5) == Approx(0.1 * std::pow(0.5, 0.5)));
  c.staircase = true;
  CHECK(c.learning_rate_at(15) == Approx(0.05));
  check_matches(c);

  auto p = OptimizerConfig::adam(0.01f);
  p.schedule = ps::LrSchedule::kPiecewise;
  p.decay_rate = 0.1f;
  p.boundaries = {2, 5};
  // tf.train.piecewise_constant: a boundary's step still has the old rate.
  CHECK(p.learning_rate_at(1) == Approx(0.01));
  CHECK(p.learning_rate_at(2) == Approx(0.01));
  CHECK(p.learning_rate_at(3) == Approx(0.001));
  CHECK(p.learning_rate_at(5) == Approx(0.001));
  CHECK(p.learning_rate_at(6) == Approx(0.0001));
  check_matches(p);

  // tf.compat.v1.train.cosine_decay: lr at step 0, half of it (above alpha)
  // half-way, alpha * lr from decay_steps on.
  auto cos = OptimizerConfig::sgd(0.1f);
  cos.schedule = ps::LrSchedule::kCosineDecay;
  cos.decay_steps = 10;
  CHECK(cos.learning_rate_at(0) == Approx(0.1));
  CHECK(cos.learning_rate_at(5) == Approx(0.05));
  CHECK(cos.learning_rate_at(10) == Approx(0.0).margin(1e-9));
  CHECK(cos.learning_rate_at(25) == Approx(0.0).margin(1e-9));
  cos.alpha = 0.2f;
  CHECK(cos.learning_rate_at(5) == Approx(0.02 + 0.8 * 0.05));
  CHECK(cos.learning_rate_at(2) ==
        Approx(0.1 * (0.2 + 0.8 * 0.5 * (1 + std::cos(0.2 * 3.14159265358979323846)))));
  CHECK(cos.learning_rate_at(40) == Approx(0.02));
  check_matches(cos);
  auto cos_adam = OptimizerConfig::adam(0.01f);
  cos_adam.schedule = ps::LrSchedule::kCosineDecay;
  cos_adam.decay_steps = 7;
  check_matches(cos_adam);
}

TEST_CASE("optimizer configurations that cannot train are refused") {
  auto bad_lr = OptimizerConfig::sgd(-1.0f);
  CHECK_THROWS_AS(ps::make_optimizer(bad_lr), ps::RequestError);
  auto nan_lr = OptimizerConfig::sgd(std::nanf(""));
  CHECK_THROWS_AS(ps::make_optimizer(nan_lr), ps::RequestError);
  auto bad_beta = OptimizerConfig::adam(0.1f, 1.0f);
  CHECK_THROWS_AS(ps::make_optimizer(bad_beta), ps::RequestError);
  CHECK_THROWS_AS(OptimizerConfig::from_name("lbfgs", 0.1f), ps::ConfigError);
  // epsilon 0 divides 0 by 0 where a gradient is 0 (NaN weights from finite gradients).
  CHECK_THROWS_WITH(ps::make_optimizer(OptimizerConfig::adam(0.1f, 0.9f, 0.999f, 0.0f)),
                    Catch::Contains("epsilon"));
  CHECK_THROWS_WITH(ps::make_optimizer(OptimizerConfig::rmsprop(0.1f, 0.9f, 0.0f, 0.0f)),
                    Catch::Contains("epsilon"));
  CHECK_NOTHROW(
      ps::make_optimizer(OptimizerConfig::with_momentum(0.1f, 0.9f, false)));  // no epsilon there
  // A rate above 1 grows the learning rate without bound (Inf after a few
  // dozen decay periods); a piecewise one is refused only where it overflows.
  auto growing = OptimizerConfig::sgd(0.1f);
  growing.schedule = ps::LrSchedule::kExponentialDecay;
  growing.decay_steps = 1;
  growing.decay_rate = 10.0f;
  CHECK_THROWS_WITH(ps::make_optimizer(growing), Catch::Contains("decay rate"));
  auto warmup = OptimizerConfig::sgd(0.1f);
  warmup.schedule = ps::LrSchedule::kPiecewise;
  warmup.decay_rate = 10.0f;
  warmup.boundaries = {10, 20};
  CHECK_NOTHROW(ps::make_optimizer(warmup));
  warmup.boundaries.assign(40, 5);
  CHECK_THROWS_WITH(ps::make_optimizer(warmup), Catch::Contains("overflows"));
  CHECK(OptimizerConfig::from_name("nesterov", 0.1f).nesterov);
  auto cos = OptimizerConfig::sgd(0.1f);
  cos.schedule = ps::LrSchedule::kCosineDecay;
  cos.decay_steps = 0;
  CHECK_THROWS_WITH(ps::make_optimizer(cos), Catch::Contains("decay steps"));
  cos.decay_steps = 100;
  cos.alpha = 1.5f;
  CHECK_THROWS_WITH(ps::make_optimizer(cos), Catch::Contains("alpha"));
  cos.alpha = 0.1f;
  CHECK_NOTHROW(ps::make_optimizer(cos));
}

TEST_CASE("the vectorised updates equal the plain float32 formula bit for bit") {
  // psd's loops are built for SSE2 and AVX2 (common/vector_clones.h) and the
  // CPU picks one: both must give exactly what one float operation after
  // another gives, so that shards on different CPUs agree (no FMA, which
  // rounds once where the formula rounds twice).
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t n = 1003;  // a tail after the last full vector
  std::vector<float> w(n), g(n);
  for (auto& x : w) x = dist(rng);
  for (auto& x : g) x = dist(rng);

  auto sgd_config = OptimizerConfig::sgd(0.1f);
  auto sgd = ps::make_optimizer(sgd_config);
  std::vector<std::vector<float>> no_slots;
  std::vector<float> w_sgd = w;
  sgd->apply(w_sgd, g, no_slots, 0, 0.5f);
  const float a = 0.1f * 0.5f;
  // volatile: keep the compiler from fusing the reference into an FMA.
  for (std::size_t i = 0; i < n; ++i) {
    volatile float product = a * g[i];
    CHECK(w_sgd[i] == w[i] - product);
  }

  auto adam_config = OptimizerConfig::adam(0.01f);
  auto adam = ps::make_optimizer(adam_config);
  auto slots = adam->make_slots(n);
  std::vector<float> w_adam = w;
  adam->apply(w_adam, g, slots, 0, 1.0f);
  const float b1 = adam_config.beta1, b2 = adam_config.beta2, eps = adam_config.epsilon;
  const float lr_t = static_cast<float>(0.01 * std::sqrt(1.0 - std::pow(double(b2), 1.0)) /
                                        (1.0 - std::pow(double(b1), 1.0)));
  int mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) {
    volatile float m1 = b1 * 0.0f, m2 = (1.0f - b1) * g[i];
    const float m = m1 + m2;
    volatile float v1 = b2 * 0.0f, v2 = (1.0f - b2) * g[i];
    volatile float v3 = v2 * g[i];
    const float v = v1 + v3;
    volatile float step = lr_t * m;
    const float expected = w[i] - step / (std::sqrt(v) + eps);
    mismatches += slots[0][i] != m || slots[1][i] != v || w_adam[i] != expected;
  }
  CHECK(mismatches == 0);
}

TEST_CASE(
    "an update that would overflow is found before it is applied, and apply_if_finite changes "
    "nothing") {
  const std::vector<OptimizerConfig> configs = {
      OptimizerConfig::sgd(3e38f),
      OptimizerConfig::with_momentum(3e38f, 0.9f),
      OptimizerConfig::with_momentum(1.5e38f, 0.9f, true),  // steps lr * (g + 0.9 acc)
      OptimizerConfig::adam(3e38f),
      OptimizerConfig::adagrad(3e38f),
      OptimizerConfig::rmsprop(3e38f, 0.9f, 0.5f)};
  for (const auto& config : configs) {
    INFO("optimizer kind " << static_cast<int>(config.kind));
    auto opt = ps::make_optimizer(config);
    const std::vector<float> g{1.0f, 1.0f, 1.0f};
    // From 0 one step of about lr stays finite: the check agrees with apply.
    std::vector<float> w(3, 0.0f);
    auto slots = opt->make_slots(w.size());
    REQUIRE(opt->result_finite(w, g, slots, 0, 1.0f));
    REQUIRE(opt->apply_if_finite(w, g, slots, 0, 1.0f));
    for (float x : w) CHECK((std::isfinite(x) && x < -1e37f));
    // From -3e38 the same step would pass -FLT_MAX: refused, nothing changed.
    std::fill(w.begin(), w.end(), -3e38f);
    const std::vector<float> w_before = w;
    const auto slots_before = slots;
    CHECK_FALSE(opt->result_finite(w, g, slots, 1, 1.0f));
    CHECK_FALSE(opt->apply_if_finite(w, g, slots, 1, 1.0f));
    CHECK(w == w_before);
    CHECK(slots == slots_before);
  }
}

TEST_CASE(
    "SGD's and Adagrad's safe gradient bounds keep the largest finite weights finite at every step "
    "of the schedule") {
  // psd applies a gradient within the bound without trying it first: the
  // worst case, a weight at +-FLT_MAX and a gradient at the bound pushing
  // it out, must stay finite at every step, schedules that raise the rate
  // included, for a sync average's scale too.
  const float big = std::numeric_limits<float>::max();
  auto piecewise_up = [](OptimizerConfig c) {  // x10 past each of three boundaries
    c.schedule = ps::LrSchedule::kPiecewise;
    c.decay_rate = 10;
    c.boundaries = {10, 20, 30};
    return c;
  };
  auto cosine = [](OptimizerConfig c) {
    c.schedule = ps::LrSchedule::kCosineDecay;
    c.decay_steps = 50;
    c.alpha = 0.5f;
    return c;
  };
  const std::vector<OptimizerConfig> configs = {
      OptimizerConfig::sgd(1e-3f),        OptimizerConfig::sgd(1),
      OptimizerConfig::sgd(1e30f),        piecewise_up(OptimizerConfig::sgd(1e20f)),
      cosine(OptimizerConfig::sgd(0.1f)), OptimizerConfig::adagrad(0.1f),
      OptimizerConfig::adagrad(1e30f),    piecewise_up(OptimizerConfig::adagrad(1e20f))};
  int checked = 0;
  for (const auto& config : configs) {
    const auto opt = ps::make_optimizer(config);
    for (float scale : {1.0f, 1.0f / 3, 0.25f}) {
      const float bound = opt->safe_gradient_bound(scale);
      INFO("optimizer kind " << static_cast<int>(config.kind) << " lr " << config.learning_rate
                             << " scale " << scale << " bound " << bound);
      REQUIRE(bound > 0);
      for (int64_t step : {0, 15, 25, 35, 1000}) {
        for (float acc : {0.1f, std::numeric_limits<float>::denorm_min(), big}) {
          std::vector<float> w{big, -big, 0.0f, big};
          const std::vector<float> g{-bound, bound, bound, -bound / 3};
          auto slots = opt->make_slots(w.size());
          for (auto& slot : slots) std::fill(slot.begin(), slot.end(), acc);
          opt->apply(w, g, slots, step, scale);
          for (float x : w) CHECK(std::isfinite(x));
          for (const auto& slot : slots)
            for (float x : slot) CHECK((std::isfinite(x) && x > 0));
          ++checked;
        }
      }
    }
  }
  CHECK(checked == 8 * 3 * 5 * 3);
  // Where the slots' own size matters, no bound.
  for (const auto& config :
       {OptimizerConfig::with_momentum(0.1f, 0.9f), OptimizerConfig::adam(0.1f),
        OptimizerConfig::rmsprop(0.1f, 0.9f, 0.5f)})
    CHECK(ps::make_optimizer(config)->safe_gradient_bound(1) == 0);
}

TEST_CASE("a cosine schedule crosses the wire whole (schedule, decay steps, alpha)") {
  auto c = OptimizerConfig::adam(0.002f);
  c.schedule = ps::LrSchedule::kCosineDecay;
  c.decay_steps = 12345;
  c.alpha = 0.1f;
  capnp::MallocMessageBuilder message;
  auto spec = message.initRoot<ps::wire::OptimizerSpec>();
  ps::to_wire(c, spec);
  const OptimizerConfig back = ps::from_wire(spec.asReader());
  CHECK(back.schedule == ps::LrSchedule::kCosineDecay);
  CHECK(back.decay_steps == 12345);
  CHECK(back.alpha == 0.1f);
  CHECK(back.learning_rate_at(12345) == Approx(0.0002));
}
