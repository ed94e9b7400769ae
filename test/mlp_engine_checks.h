// Checks shared by the CPU and the CUDA engine tests: each takes a factory,
// so the same expectations hold for both engines.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "test/mlp_reference.h"
#include "ps/errors.h"
#include "ps/mlp.h"

namespace mlp_test {

using Factory =
    std::function<std::unique_ptr<ps::MlpEngine>(const ps::MlpShape&, const ps::EngineOptions&)>;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline std::vector<double> to_double(std::span<const float> v) { return {v.begin(), v.end()}; }

inline ps::MlpShape make_shape(int inputs, std::vector<int> hidden, int classes,
                               ps::Activation act) {
  ps::MlpShape s;
  s.inputs = inputs;
  s.hidden = std::move(hidden);
  s.classes = classes;
  s.activation = act;
  return s;
}

// Loss, #correct, every weight and bias gradient and the logits against the
// float64 reference (its products' operands rounded as `gemm` says);
// gradients and logits poisoned with NaN first, so every element must have
// been written.
inline void check_against_reference(const Factory& factory, const ps::MlpShape& shape, int B,
                                    double tol, uint64_t seed = 1,
                                    GemmOperands gemm = GemmOperands::kFloat64) {
  INFO("shape " << shape.to_string() << ", batch " << B);
  ps::EngineOptions opt;
  opt.max_batch = B;
  opt.eval_batch = std::max(1, B / 2 + 1);  // predict()/evaluate() take two chunks
  auto engine = factory(shape, opt);
  const std::vector<float> params = random_params(shape, seed);
  const Batch batch = random_batch(shape, B, seed + 7);
  std::copy(params.begin(), params.end(), engine->host_params().begin());
  engine->upload_params();
  std::fill(engine->host_grads().begin(), engine->host_grads().end(), kNaN);

  const RefResult ref =
      reference(shape, to_double(params), batch.x.data(), batch.labels.data(), B, true, gemm);
  const ps::StepStats stats = engine->compute_gradients(batch.x, batch.labels);
  CHECK(stats.count == B);
  CHECK(std::abs(stats.loss - ref.loss) <= tol * std::max(1.0, std::abs(ref.loss)));
  CHECK(std::abs(stats.correct - ref.correct) <= 1);  // an arg-max near-tie may flip
  REQUIRE_FALSE(any_nan(engine->host_grads().data(), engine->host_grads().size()));
  for (const ps::TensorSlot& t : engine->layout().tensors()) {
    const double err =
        rel_error(engine->host_grads().data() + t.offset, ref.grads.data() + t.offset, t.count);
    INFO("gradient of " << t.name);
    CHECK(err <= tol);
  }

  std::vector<float> logits(static_cast<size_t>(B) * shape.classes, kNaN);
  engine->predict(batch.x, logits);
  REQUIRE_FALSE(any_nan(logits.data(), logits.size()));
  CHECK(rel_error(logits.data(), ref.logits.data(), logits.size()) <= tol);

  const ps::EvalStats eval = engine->evaluate(batch.x, batch.labels);
  CHECK(eval.count == B);
  CHECK(std::abs(eval.loss - ref.loss) <= tol * std::max(1.0, std::abs(ref.loss)));
  CHECK(std::abs(eval.correct - ref.correct) <= 1);
}

// apply_sgd: params == old - lr * grads; train_step == compute_gradients + apply_sgd.
inline void check_sgd(const Factory& factory, const ps::MlpShape& shape, int B) {
  ps::EngineOptions opt;
  opt.max_batch = B;
  auto engine = factory(shape, opt);
  const std::vector<float> params = random_params(shape, 3);
  const Batch batch = random_batch(shape, B, 4);
  std::copy(params.begin(), params.end(), engine->host_params().begin());
  engine->upload_params();
  const float lr = 0.37f;
  engine->compute_gradients(batch.x, batch.labels);
  const std::vector<float> grads(engine->host_grads().begin(), engine->host_grads().end());
  engine->apply_sgd(lr);
  std::vector<double> expected(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    expected[i] = static_cast<double>(params[i]) - double(lr) * grads[i];
  CHECK(rel_error(engine->host_params().data(), expected.data(), expected.size()) <= 1e-6);
  engine->download_params();  // the engine's own copy got the same update
  CHECK(rel_error(engine->host_params().data(), expected.data(), expected.size()) <= 1e-6);

  // train_step from the same start gives the same parameters.
  auto engine2 = factory(shape, opt);
  std::copy(params.begin(), params.end(), engine2->host_params().begin());
  engine2->upload_params();
  const ps::StepStats s = engine2->train_step(batch.x, batch.labels, lr);
  CHECK(s.count == B);
  engine2->download_params();
  CHECK(rel_error(engine2->host_params().data(), expected.data(), expected.size()) <= 1e-5);

  // A few steps lower the loss on a fixed batch.
  const double before = engine2->evaluate(batch.x, batch.labels).loss;
  for (int i = 0; i < 20; ++i) engine2->train_step(batch.x, batch.labels, 0.1f);
  CHECK(engine2->evaluate(batch.x, batch.labels).loss < before);
}

// Split API: prefetch of the next batch while a step runs gives the same
// results as one call at a time.
inline void check_split_api(const Factory& factory, const ps::MlpShape& shape, int B) {
  ps::EngineOptions opt;
  opt.max_batch = B;
  auto engine = factory(shape, opt);
  auto single = factory(shape, opt);
  const std::vector<float> params = random_params(shape, 5);
  for (auto* e : {engine.get(), single.get()}) {
    std::copy(params.begin(), params.end(), e->host_params().begin());
    e->upload_params();
  }
  std::vector<Batch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(random_batch(shape, B - i, 10 + i));
  engine->prefetch(batches[0].x, batches[0].labels);
  for (int i = 0; i < 4; ++i) {
    engine->start_step();
    if (i + 1 < 4) engine->prefetch(batches[i + 1].x, batches[i + 1].labels);
    const ps::StepStats a = engine->finish_step();
    const ps::StepStats b = single->compute_gradients(batches[i].x, batches[i].labels);
    CHECK(a.count == b.count);
    CHECK(a.loss == Approx(b.loss).epsilon(1e-6));
    CHECK(rel_error(engine->host_grads().data(), single->host_grads().data(), params.size()) <=
          1e-6);
  }
  // Training steps, queued without waiting, then one finish.
  engine->prefetch(batches[0].x, batches[0].labels);
  engine->start_train_step(0.05f);
  engine->start_train_step(0.05f);
  CHECK(engine->finish_step().count == B);
  single->train_step(batches[0].x, batches[0].labels, 0.05f);
  single->train_step(batches[0].x, batches[0].labels, 0.05f);
  engine->download_params();
  single->download_params();
  CHECK(rel_error(engine->host_params().data(), single->host_params().data(), params.size()) <=
        1e-6);
}

// N towers on a split batch give the gradient of one engine on the whole batch.
inline void check_towers(const Factory& factory, const ps::MlpShape& shape, int B, int n) {
  ps::EngineOptions opt;
  opt.max_batch = B;
  auto single = factory(shape, opt);
  std::vector<std::unique_ptr<ps::MlpEngine>> engines;
  ps::EngineOptions tower_opt = opt;
  tower_opt.max_batch = (B + n - 1) / n;
  for (int i = 0; i < n; ++i) engines.push_back(factory(shape, tower_opt));
  ps::Towers towers(std::move(engines));
  CHECK(towers.size() == n);
  CHECK(towers.max_batch() >= B);

  const std::vector<float> params = random_params(shape, 21);
  const Batch batch = random_batch(shape, B, 22);
  std::copy(params.begin(), params.end(), single->host_params().begin());
  single->upload_params();
  std::copy(params.begin(), params.end(), towers.host_params().begin());
  towers.upload_params();
  const ps::StepStats a = single->compute_gradients(batch.x, batch.labels);
  const ps::StepStats b = towers.compute_gradients(batch.x, batch.labels);
  CHECK(b.count == B);
  CHECK(b.correct == a.correct);
  CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
  for (const ps::TensorSlot& t : towers.layout().tensors()) {
    INFO("gradient of " << t.name);
    CHECK(rel_error(towers.host_grads().data() + t.offset, single->host_grads().data() + t.offset,
                    t.count) <= 1e-5);
  }
  // SGD on the towers keeps every tower identical and equal to one engine's update.
  const ps::EvalStats eval_a = single->evaluate(batch.x, batch.labels);
  const ps::EvalStats eval_b = towers.evaluate(batch.x, batch.labels);
  CHECK(eval_b.loss == Approx(eval_a.loss).epsilon(1e-5));
  single->apply_sgd(0.5f);
  towers.apply_sgd(0.5f);
  for (int i = 0; i < n; ++i) {
    towers.engine(i).download_params();
    CHECK(rel_error(towers.engine(i).host_params().data(), single->host_params().data(),
                    params.size()) <= 1e-5);
  }
  CHECK_THROWS_AS(towers.compute_gradients(random_batch(shape, towers.max_batch() + 1, 1).x,
                                           random_batch(shape, towers.max_batch() + 1, 1).labels),
                  ps::Error);
}

// Bad input is refused with ps::Error and the engine stays usable.
inline void check_bad_input(const Factory& factory) {
  const ps::MlpShape shape = make_shape(6, {5}, 3, ps::Activation::kRelu);
  ps::EngineOptions opt;
  opt.max_batch = 8;
  auto engine = factory(shape, opt);
  const Batch ok = random_batch(shape, 8, 1);
  const Batch big = random_batch(shape, 9, 1);
  CHECK_THROWS_AS(engine->compute_gradients(big.x, big.labels), ps::Error);
  CHECK_THROWS_WITH(engine->compute_gradients(big.x, big.labels), Catch::Contains("exceeds"));
  Batch bad = ok;
  bad.labels[3] = 3;
  CHECK_THROWS_WITH(engine->compute_gradients(bad.x, bad.labels), Catch::Contains("label 3"));
  bad.labels[3] = -1;
  CHECK_THROWS_AS(engine->compute_gradients(bad.x, bad.labels), ps::Error);
  CHECK_THROWS_AS(engine->evaluate(bad.x, bad.labels), ps::Error);
  CHECK_THROWS_WITH(
      engine->compute_gradients(std::span<const float>(ok.x).first(ok.x.size() - 1), ok.labels),
      Catch::Contains("expected"));
  CHECK_THROWS_AS(engine->compute_gradients(ok.x, std::span<const int32_t>()), ps::Error);
  CHECK_THROWS_AS(engine->evaluate(std::span<const float>(ok.x).first(5), ok.labels), ps::Error);
  std::vector<float> logits(7);
  CHECK_THROWS_AS(engine->predict(ok.x, logits), ps::Error);
  CHECK_THROWS_AS(engine->finish_step(), ps::Error);
  CHECK_THROWS_AS(engine->start_step(), ps::Error);  // nothing staged yet
  CHECK_THROWS_AS(engine->apply_sgd(std::nanf("")), ps::Error);
  // Still works.
  const ps::StepStats s = engine->compute_gradients(ok.x, ok.labels);
  CHECK(s.count == 8);
  CHECK(std::isfinite(s.loss));
}

}  // namespace mlp_test
