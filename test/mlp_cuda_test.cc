// The CUDA engine against the float64 reference (and the CPU engine): several
// shapes and batch sizes, NaN-poisoned outputs, towers, SGD, bad input.
// Exits 77 (meson: SKIP) when there is no CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

#include "test/mlp_engine_checks.h"
#include "test/mlp_reference.h"
#include "ps/errors.h"
#include "ps/mlp.h"

using namespace mlp_test;

namespace {

const Factory kGpu = [](const ps::MlpShape& s, const ps::EngineOptions& o) {
  return ps::make_cuda_engine(s, o);
};
const Factory kGpuTf32 = [](const ps::MlpShape& s, const ps::EngineOptions& o) {
  ps::EngineOptions t = o;
  t.tf32 = true;
  return ps::make_cuda_engine(s, t);
};

}  // namespace

TEST_CASE("GPU forward, loss and gradients match the float64 reference", "[mlp][cuda]") {
  const std::vector<ps::MlpShape> shapes = {
      make_shape(784, {100}, 10, ps::Activation::kRelu),
      make_shape(784, {37}, 10, ps::Activation::kRelu),
      make_shape(784, {129, 37}, 10, ps::Activation::kSigmoid),
      make_shape(6, {5, 4}, 3, ps::Activation::kRelu),
      make_shape(20, {}, 7, ps::Activation::kRelu),
      make_shape(33, {1030}, 40, ps::Activation::kRelu),  // wide: several bias-grad column tiles
  };
  for (const auto& shape : shapes)
    for (int B : {1, 7, 100, 1000}) check_against_reference(kGpu, shape, B, 1e-4);
}

TEST_CASE("GPU with TF32 matches the TF32-operand reference", "[mlp][cuda]") {
  // Against plain float64, TF32 rounding can flip a ReLU whose input is near
  // zero, and one flip moves a layer-0 gradient by several percent; against a
  // reference that rounds its products' operands the same way, what is left
  // is float32 accumulation. Several seeds, so some of them flip.
  const ps::MlpShape shape = make_shape(784, {129, 37}, 10, ps::Activation::kRelu);
  for (uint64_t seed = 1; seed <= 5; ++seed)
    check_against_reference(kGpuTf32, shape, 100, 5e-3, seed, GemmOperands::kTf32);
  check_against_reference(kGpuTf32, make_shape(784, {100}, 10, ps::Activation::kRelu), 1000, 5e-3,
                          1, GemmOperands::kTf32);
}

TEST_CASE("GPU matches the CPU engine on a large batch", "[mlp][cuda]") {
  const ps::MlpShape shape = make_shape(784, {256, 128}, 10, ps::Activation::kRelu);
  const int B = 5000;  // several bias-gradient partial rows
  ps::EngineOptions opt;
  opt.max_batch = B;
  auto gpu = ps::make_cuda_engine(shape, opt);
  auto cpu = ps::make_cpu_engine(shape, opt);
  const std::vector<float> params = random_params(shape, 77);
  const Batch batch = random_batch(shape, B, 78);
  for (auto* e : {gpu.get(), cpu.get()}) {
    std::copy(params.begin(), params.end(), e->host_params().begin());
    e->upload_params();
  }
  std::fill(gpu->host_grads().begin(), gpu->host_grads().end(), kNaN);
  const ps::StepStats a = gpu->compute_gradients(batch.x, batch.labels);
  const ps::StepStats b = cpu->compute_gradients(batch.x, batch.labels);
  CHECK(a.loss == Approx(b.loss).epsilon(1e-5));
  CHECK(std::abs(a.correct - b.correct) <= 2);
  for (const ps::TensorSlot& t : gpu->layout().tensors()) {
    INFO(t.name);
    CHECK(rel_error(gpu->host_grads().data() + t.offset, cpu->host_grads().data() + t.offset,
                    t.count) <= 1e-4);
  }
}

TEST_CASE("GPU apply_sgd and train_step", "[mlp][cuda]") {
  check_sgd(kGpu, make_shape(30, {17, 11}, 5, ps::Activation::kRelu), 16);
  check_sgd(kGpu, make_shape(784, {129}, 10, ps::Activation::kSigmoid), 100);
}

TEST_CASE("GPU split API and graphs per batch size", "[mlp][cuda]") {
  check_split_api(kGpu, make_shape(784, {100}, 10, ps::Activation::kRelu), 100);
  check_split_api(kGpu, make_shape(30, {17, 11}, 5, ps::Activation::kRelu), 12);
}

TEST_CASE("GPU towers average to the single-engine gradient", "[mlp][cuda][towers]") {
  // Two engines on the same device are enough to test the averaging.
  check_towers(kGpu, make_shape(784, {37, 20}, 10, ps::Activation::kRelu), 100, 2);
  check_towers(kGpu, make_shape(40, {13}, 4, ps::Activation::kSigmoid), 7, 2);
  if (ps::cuda_device_count() >= 2) {
    auto towers =
        ps::Towers::make(make_shape(784, {100}, 10, ps::Activation::kRelu), ps::EngineOptions{}, 2);
    CHECK(towers.engine(1).on_gpu());
  }
}

TEST_CASE("GPU engine refuses bad input", "[mlp][cuda]") {
  check_bad_input(kGpu);
  CHECK_THROWS_AS(ps::make_cuda_engine(make_shape(10, {4}, 3, ps::Activation::kRelu),
                                       ps::EngineOptions{.device = ps::cuda_device_count()}),
                  ps::Error);
}

int main(int argc, char** argv) {
  if (ps::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
