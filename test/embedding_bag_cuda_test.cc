// The CUDA embedding bag against the float64 reference and the CPU one.
// Exits 77 (meson: SKIP) when there is no CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>

#include "ps/mlp.h"
#include "test/embedding_bag_checks.h"

using namespace emb_test;

namespace {

std::unique_ptr<ps::CudaEmbeddingBag> gpu;

const Forward kForward = [](auto rows, int dim, auto offsets, auto index, ps::BagCombiner c,
                            auto out) { gpu->forward(rows, dim, offsets, index, c, out); };
const Backward kBackward = [](auto grad_out, int dim, auto offsets, auto index, ps::BagCombiner c,
                              auto grad_rows) {
  gpu->backward(grad_out, dim, offsets, index, c, grad_rows);
};

}  // namespace

TEST_CASE("GPU embedding bag matches the float64 reference, repeated ids summed",
          "[embedding_bag][cuda]") {
  check_against_reference(kForward, kBackward, 1, 1, 1, 1, 1);
  check_against_reference(kForward, kBackward, 7, 16, 5, 6, 2);  // atomics on the same rows
  check_against_reference(kForward, kBackward, 100, 3, 1000, 3, 3);
  check_against_reference(kForward, kBackward, 512 * 26, 16, 20000, 1, 4);
  check_against_reference(kForward, kBackward, 300, 64, 50, 40, 5);
  // Buffers shrink again after a large call: the grown device buffers are reused.
  check_against_reference(kForward, kBackward, 3, 2, 2, 2, 6);
}

TEST_CASE("GPU embedding bag: a hot id hit by every bag", "[embedding_bag][cuda]") {
  const int D = 32, N = 100000;
  const std::vector<float> rows(D, 1.0f);  // U = 1
  const std::vector<int64_t> offsets = ps::fixed_offsets(N, 1);
  const std::vector<int32_t> index(N, 0);
  const std::vector<float> grad_out(static_cast<size_t>(N) * D, 0.5f);
  std::vector<float> grad_rows(D);
  gpu->backward(grad_out, D, offsets, index, ps::BagCombiner::kSum, grad_rows);
  for (float g : grad_rows) CHECK(g == Approx(0.5 * N).epsilon(1e-5));
}

TEST_CASE("GPU embedding bag refuses bad input and writes nothing", "[embedding_bag][cuda]") {
  check_bad_input(kForward, kBackward);
  CHECK_THROWS_AS(ps::CudaEmbeddingBag(ps::cuda_device_count()), ps::Error);
}

int main(int argc, char** argv) {
  if (ps::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  gpu = std::make_unique<ps::CudaEmbeddingBag>(0);
  const int rc = Catch::Session().run(argc, argv);
  gpu.reset();
  return rc;
}
