// CudaLogisticMlp (the wide & deep head on a GPU) against the float64
// reference of test/logistic_mlp_reference.h: loss, parameter gradients,
// input gradient, logit gradient and probabilities, in FP32 (against plain
// float64) and in TF32 (against the reference with TF32-rounded product
// operands); new params() are used by the next call; bad input. Exits 77
// (meson: SKIP) when there is no CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "ps/errors.h"
#include "ps/logistic_mlp.h"
#include "ps/mlp.h"
#include "test/logistic_head_checks.h"
#include "test/logistic_mlp_reference.h"

using namespace logistic_test;

namespace {

// How close a result must be to its reference: |got - ref| <= rel * |ref| +
// floor * (largest |ref| of the quantity). FP32 rounds each partial sum to
// float. In TF32 the reference rounds the products' operands as the GPU does,
// but sums in float64 what the GPU sums in float from operands it rounded
// after its own float rounding, so the bound is looser and follows the
// magnitudes the layers carry, as mlp_cuda's TF32 bound does (docs/ctr.md).
// TF32 also flips the odd hidden ReLU whose input is near zero, which moves
// that unit's whole contribution to the input gradient: there, a few
// elements (`outliers`, a share of the quantity) may be off, as long as the
// quantity as a whole is within `norm` in relative L2 error.
struct Tolerance {
  double rel, floor, loss;
  double outliers = 0, norm = 0;
};
constexpr Tolerance kFp32{1e-4, 1e-5, 1e-5};
constexpr Tolerance kTf32{5e-3, 5e-3, 1e-3, 5e-3, 2e-2};

template <typename Got>
void check_close(const char* what, const Got& got, const std::vector<double>& ref,
                 const Tolerance& tol) {
  REQUIRE(got.size() == ref.size());
  double largest = 0;
  for (double r : ref) largest = std::max(largest, std::abs(r));
  size_t bad = 0, first_bad = 0;
  double worst = 0, err2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    const double allowed = tol.rel * std::abs(ref[i]) + tol.floor * largest;
    if (!(err <= allowed)) {
      if (bad++ == 0) first_bad = i;
    }
    worst = std::max(worst, largest > 0 ? err / largest : err);
    err2 += err * err;
    ref2 += ref[i] * ref[i];
  }
  const double rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  INFO(what << ": " << bad << " of " << ref.size() << " outside the tolerance (first at "
            << first_bad << "); worst error / largest |ref| " << worst << "; relative L2 error "
            << rel_l2);
  CHECK(static_cast<double>(bad) <= tol.outliers * static_cast<double>(ref.size()));
  if (tol.norm > 0) CHECK(rel_l2 <= tol.norm);
  if (tol.outliers > 0)
    std::printf("TF32 %-6s %zu of %zu elements outside the tolerance, relative L2 error %.2g\n",
                what, bad, ref.size(), rel_l2);
}

// One compute_gradients and one predict of `head` on case c, against the reference.
void check_head(ps::CudaLogisticMlp& head, const Case& c, bool tf32) {
  const Tolerance& tol = tf32 ? kTf32 : kFp32;
  const int B = static_cast<int>(c.labels.size());
  std::copy(c.params.begin(), c.params.end(), head.params().begin());
  std::vector<float> dx(c.x.size(), NAN), dlogit(B, NAN), probs(B, NAN);
  const double loss = head.compute_gradients(c.x, c.labels, c.extra, dx, dlogit);
  const Ref r = reference(c.shape, to_double(c.params), to_double(c.x), to_double(c.labels),
                          to_double(c.extra),
                          tf32 ? mlp_test::GemmOperands::kTf32 : mlp_test::GemmOperands::kFloat64);
  CHECK(loss == Approx(r.loss).epsilon(tol.loss));
  check_close("grads", head.grads(), r.grads, tol);
  check_close("dx", dx, r.dx, tol);
  check_close("dlogit", dlogit, r.dlogit, tol);
  head.predict(c.x, c.extra, probs);
  check_close("probs", probs, r.probs, tol);
}

}  // namespace

TEST_CASE("CudaLogisticMlp matches the float64 reference", "[logistic_mlp][cuda]") {
  struct Shape {
    ps::MlpShape shape;
    int max_batch;
    std::vector<int> batches;
  };
  // ctr_trainer's head (13 dense + 26 fields x 16), a sigmoid-hidden net and
  // logistic regression; for each a full batch, smaller ones, one example.
  const ps::MlpShape ctr{.inputs = 13 + 26 * 16, .hidden = {256, 128}, .classes = 1};
  const ps::MlpShape sigmoid{
      .inputs = 37, .hidden = {24, 9}, .classes = 1, .activation = ps::Activation::kSigmoid};
  const ps::MlpShape logistic{.inputs = 9, .hidden = {}, .classes = 1};
  std::vector<Shape> cases;
  cases.push_back({ctr, 512, {512, 100, 1}});
  cases.push_back({sigmoid, 64, {64, 13, 1}});
  cases.push_back({logistic, 32, {32, 5}});
  for (bool tf32 : {false, true})
    for (const Shape& s : cases) {
      ps::CudaLogisticMlp head(s.shape, s.max_batch, 0, tf32);
      for (int B : s.batches)
        for (bool with_extra : {false, true}) {
          INFO(s.shape.to_string()
               << " max_batch " << s.max_batch << " B " << B << " extra " << with_extra << " tf32 "
               << tf32 << " on " << head.device_description());
          // The same head for every batch: each call uploads params() and the batch anew.
          check_head(head, make_case(s.shape, B, with_extra, 200 + B + with_extra), tf32);
        }
    }
}

TEST_CASE("CudaLogisticMlp: results without dx or dlogit, and extreme logits",
          "[logistic_mlp][cuda]") {
  check_extreme_logits<ps::CudaLogisticMlp>();
}

TEST_CASE("CudaLogisticMlp: predict over more than max_batch examples", "[logistic_mlp][cuda]") {
  const ps::MlpShape shape{.inputs = 6, .hidden = {8}, .classes = 1};
  const Case c = make_case(shape, 50, true, 4);
  ps::CudaLogisticMlp small(shape, 7);
  std::copy(c.params.begin(), c.params.end(), small.params().begin());
  std::vector<float> probs(50);
  small.predict(c.x, c.extra, probs);
  const Ref r = reference(shape, to_double(c.params), to_double(c.x), to_double(c.labels),
                          to_double(c.extra));
  check_close("probs", probs, r.probs, kFp32);
}

TEST_CASE("CudaLogisticMlp refuses bad input and changes nothing", "[logistic_mlp][cuda]") {
  check_refuses_bad_input<ps::CudaLogisticMlp>();
  const ps::MlpShape shape{.inputs = 3, .hidden = {4}, .classes = 1};
  CHECK_THROWS_AS(ps::CudaLogisticMlp(shape, 4, ps::cuda_device_count()),
                  ps::Error);  // no such device
}

int main(int argc, char** argv) {
  if (ps::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
