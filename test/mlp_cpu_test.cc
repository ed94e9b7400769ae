// The CPU engine against a float64 reference and finite differences; towers,
// SGD, the split API and bad input on CPU engines.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <limits>
#include <string>

#include "test/mlp_engine_checks.h"
#include "test/mlp_reference.h"
#include "ps/errors.h"
#include "ps/mlp.h"

using namespace mlp_test;

namespace {

const Factory kCpu = [](const ps::MlpShape& s, const ps::EngineOptions& o) {
  return ps::make_cpu_engine(s, o);
};

}  // namespace

TEST_CASE("layout names, shapes and offsets cover one flat vector", "[mlp]") {
  const ps::MlpShape shape = make_shape(784, {512, 256}, 10, ps::Activation::kRelu);
  const ps::ParamLayout layout(shape);
  REQUIRE(layout.tensors().size() == 6);
  CHECK(layout.tensors()[0].name == "layer0/weights");
  CHECK(layout.tensors()[0].shape == std::vector<int64_t>{784, 512});
  CHECK(layout.tensors()[1].name == "layer0/biases");
  CHECK(layout.tensors()[1].shape == std::vector<int64_t>{512});
  CHECK(layout.tensors()[5].name == "layer2/biases");
  size_t next = 0;
  for (const ps::TensorSlot& t : layout.tensors()) {
    CHECK(t.offset == next);
    next += t.count;
  }
  CHECK(layout.total() == next);
  CHECK(layout.total() == 784u * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  CHECK(layout.find("layer1/weights").offset == layout.weights(1).offset);
  CHECK_THROWS_AS(layout.find("layer9/weights"), ps::ConfigError);
  CHECK(shape.to_string() == "784-512-256-10 relu");
  CHECK(make_shape(5, {}, 2, ps::Activation::kSigmoid).to_string() == "5-2 sigmoid");
  CHECK_THROWS_AS(ps::ParamLayout(make_shape(784, {0}, 10, ps::Activation::kRelu)),
                  ps::ConfigError);
  CHECK(ps::parse_activation("sigmoid") == ps::Activation::kSigmoid);
  CHECK_THROWS_AS(ps::parse_activation("tanh"), ps::ConfigError);
}

TEST_CASE("CPU gradients match float64 finite differences", "[mlp][cpu]") {
  for (ps::Activation act : {ps::Activation::kRelu, ps::Activation::kSigmoid}) {
    const ps::MlpShape shape = make_shape(6, {5, 4}, 3, act);
    INFO(shape.to_string());
    const int B = 4;
    const std::vector<float> params = random_params(shape, 42);
    const Batch batch = random_batch(shape, B, 43);
    ps::EngineOptions opt;
    opt.max_batch = B;
    auto engine = ps::make_cpu_engine(shape, opt);
    std::copy(params.begin(), params.end(), engine->host_params().begin());
    engine->upload_params();
    engine->compute_gradients(batch.x, batch.labels);

    std::vector<double> p = to_double(params);
    std::vector<double> fd(p.size());
    const double h = 1e-6;
    for (size_t i = 0; i < p.size(); ++i) {
      const double saved = p[i];
      p[i] = saved + h;
      const double up = reference(shape, p, batch.x.data(), batch.labels.data(), B, false).loss;
      p[i] = saved - h;
      const double down = reference(shape, p, batch.x.data(), batch.labels.data(), B, false).loss;
      p[i] = saved;
      fd[i] = (up - down) / (2 * h);
    }
    const RefResult ref = reference(shape, p, batch.x.data(), batch.labels.data(), B, true);
    for (const ps::TensorSlot& t : engine->layout().tensors()) {
      INFO(t.name);
      CHECK(rel_error(engine->host_grads().data() + t.offset, fd.data() + t.offset, t.count) <=
            1e-4);
      CHECK(rel_error(ref.grads.data() + t.offset, fd.data() + t.offset, t.count) <= 1e-6);
    }
  }
}

TEST_CASE("the TF32-operand reference rounds to 10 mantissa bits, ties away from zero", "[mlp]") {
  const double ulp = std::ldexp(1.0, -10);  // TF32 spacing at 1
  CHECK(round_to_tf32(1.0) == 1.0);
  CHECK(round_to_tf32(1.0 + ulp / 4) == 1.0);
  CHECK(round_to_tf32(1.0 + ulp / 2) == 1.0 + ulp);  // a tie goes away from zero
  CHECK(round_to_tf32(-(1.0 + ulp / 2)) == -(1.0 + ulp));
  CHECK(round_to_tf32(1.0 + 0.75 * ulp) == 1.0 + ulp);
  CHECK(round_to_tf32(3.0 * std::ldexp(1.0, -130)) == 3.0 * std::ldexp(1.0, -130));  // subnormal
  CHECK(std::isinf(round_to_tf32(INFINITY)));
  CHECK(std::isnan(round_to_tf32(NAN)));

  // Rounding the operands moves a gradient by about TF32's 2^-11 relative
  // step, far more than float64 rounding and far less than 1.
  const ps::MlpShape shape = make_shape(50, {33}, 10, ps::Activation::kSigmoid);
  const std::vector<double> params = to_double(random_params(shape, 9));
  const Batch batch = random_batch(shape, 20, 10);
  const RefResult exact = reference(shape, params, batch.x.data(), batch.labels.data(), 20, true);
  const RefResult tf32 =
      reference(shape, params, batch.x.data(), batch.labels.data(), 20, true, GemmOperands::kTf32);
  const double err = rel_error(tf32.grads.data(), exact.grads.data(), exact.grads.size());
  CHECK(err > 1e-5);
  CHECK(err < 1e-2);
}

TEST_CASE("CPU forward, loss and gradients match the float64 reference", "[mlp][cpu]") {
  const std::vector<ps::MlpShape> shapes = {
      make_shape(6, {5, 4}, 3, ps::Activation::kRelu),
      make_shape(6, {5, 4}, 3, ps::Activation::kSigmoid),
      make_shape(784, {37}, 10, ps::Activation::kRelu),
      make_shape(50, {129, 33}, 10, ps::Activation::kSigmoid),
      make_shape(20, {}, 7, ps::Activation::kRelu),  // no hidden layer
      make_shape(13, {8, 9, 10}, 2, ps::Activation::kRelu),
  };
  for (const auto& shape : shapes)
    for (int B : {1, 7, 100}) check_against_reference(kCpu, shape, B, 1e-4);
}

TEST_CASE("CPU apply_sgd and train_step", "[mlp][cpu]") {
  check_sgd(kCpu, make_shape(30, {17, 11}, 5, ps::Activation::kRelu), 16);
  check_sgd(kCpu, make_shape(30, {17}, 5, ps::Activation::kSigmoid), 9);
}

TEST_CASE("CPU split API", "[mlp][cpu]") {
  check_split_api(kCpu, make_shape(30, {17, 11}, 5, ps::Activation::kRelu), 12);
}

TEST_CASE("CPU towers average to the single-engine gradient", "[mlp][cpu][towers]") {
  check_towers(kCpu, make_shape(784, {37, 20}, 10, ps::Activation::kRelu), 100, 2);
  check_towers(kCpu, make_shape(40, {13}, 4, ps::Activation::kSigmoid), 7, 2);  // uneven split
  check_towers(kCpu, make_shape(40, {13}, 4, ps::Activation::kRelu), 10, 3);
  auto towers = ps::Towers::make(make_shape(10, {4}, 3, ps::Activation::kRelu),
                                 ps::EngineOptions{.prefer_gpu = false}, 2);
  CHECK(towers.size() == 2);
  CHECK_FALSE(towers.engine(1).on_gpu());
}

TEST_CASE("CPU engine refuses bad input", "[mlp][cpu]") { check_bad_input(kCpu); }

TEST_CASE("CPU engine refuses a batch larger than the machine's memory before allocating it",
          "[mlp][cpu]") {
  // 2^31-1 rows of 784 inputs and their activations: about 9 TB.
  const ps::MlpShape shape = make_shape(784, {100}, 10, ps::Activation::kRelu);
  ps::EngineOptions huge;
  huge.max_batch = std::numeric_limits<int>::max();
  CHECK_THROWS_AS(ps::make_cpu_engine(shape, huge), ps::ConfigError);
  CHECK_THROWS_WITH(
      ps::make_cpu_engine(shape, huge),
      Catch::Contains("a batch of 2147483647 examples") && Catch::Contains("lower the batch size"));
  ps::EngineOptions huge_eval;
  huge_eval.eval_batch = std::numeric_limits<int>::max();
  CHECK_THROWS_WITH(ps::make_cpu_engine(shape, huge_eval),
                    Catch::Contains("evaluation in batches of 2147483647"));
  ps::EngineOptions usual;
  usual.max_batch = 1024;
  CHECK(ps::make_cpu_engine(shape, usual)->max_batch() == 1024);
}

TEST_CASE("engine factories", "[mlp]") {
  const ps::MlpShape shape = make_shape(10, {4}, 3, ps::Activation::kRelu);
  auto cpu = ps::make_engine(shape, ps::EngineOptions{.prefer_gpu = false});
  CHECK_FALSE(cpu->on_gpu());
  CHECK(cpu->device_description().find("CPU") != std::string::npos);
  if (ps::cuda_device_count() == 0) {
    CHECK_THROWS_AS(ps::make_cuda_engine(shape), ps::Error);
    CHECK_FALSE(ps::make_engine(shape)->on_gpu());  // falls back to the CPU
  }
  CHECK_THROWS_AS(ps::make_cpu_engine(shape, ps::EngineOptions{.max_batch = 0}), ps::ConfigError);
}

// meson.build runs this program once per CPU build with PS_CPU_ISA set: each
// run must measure the build it names, and a wrong name must not fall back.
TEST_CASE("PS_CPU_ISA picks the build that runs, and refuses an unknown one", "[mlp][cpu]") {
  const ps::MlpShape shape = make_shape(10, {4}, 3, ps::Activation::kRelu);
  const char* asked = std::getenv("PS_CPU_ISA");
  const std::string isa = asked ? asked : "";
  const std::string description = ps::make_cpu_engine(shape)->device_description();
  INFO("PS_CPU_ISA=" << isa << ": " << description);
  if (isa == "avx512") CHECK(description.find("AVX-512") != std::string::npos);
  if (isa == "avx2") CHECK(description.find("AVX2+FMA") != std::string::npos);
  if (isa == "baseline") CHECK(description.find("AVX") == std::string::npos);

  ::setenv("PS_CPU_ISA", "sse9", 1);
  CHECK_THROWS_WITH(ps::make_cpu_engine(shape),
                    "PS_CPU_ISA=sse9: unknown (expected baseline, avx2 or avx512)");
  if (asked)
    ::setenv("PS_CPU_ISA", isa.c_str(), 1);
  else
    ::unsetenv("PS_CPU_ISA");
}
