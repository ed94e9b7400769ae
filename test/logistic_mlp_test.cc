// LogisticMlp (the wide & deep dense head) against a float64 reference:
// loss, parameter gradients, input gradient and logit gradient; the
// reference's own gradient against finite differences; bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "ps/errors.h"
#include "ps/logistic_mlp.h"
#include "test/logistic_head_checks.h"
#include "test/logistic_mlp_reference.h"

using namespace logistic_test;

TEST_CASE("LogisticMlp matches the float64 reference", "[logistic_mlp]") {
  const std::vector<ps::MlpShape> shapes = {
      {.inputs = 13 + 4 * 8, .hidden = {32, 16}, .classes = 1},
      {.inputs = 5, .hidden = {7}, .classes = 1, .activation = ps::Activation::kSigmoid},
      {.inputs = 9, .hidden = {}, .classes = 1},  // logistic regression
  };
  for (const auto& shape : shapes)
    for (int B : {1, 13, 64})
      for (bool with_extra : {false, true}) {
        INFO(shape.to_string() << " B " << B << " extra " << with_extra);
        const Case c = make_case(shape, B, with_extra, 100 + B);
        ps::LogisticMlp head(shape, 64);
        std::copy(c.params.begin(), c.params.end(), head.params().begin());
        std::vector<float> dx(c.x.size(), NAN), dlogit(B, NAN), probs(B, NAN);
        const double loss = head.compute_gradients(c.x, c.labels, c.extra, dx, dlogit);
        const Ref r = reference(shape, to_double(c.params), to_double(c.x), to_double(c.labels),
                                to_double(c.extra));
        CHECK(loss == Approx(r.loss).epsilon(1e-5));
        for (size_t i = 0; i < r.grads.size(); ++i)
          REQUIRE(head.grads()[i] == Approx(r.grads[i]).margin(1e-6).epsilon(1e-4));
        for (size_t i = 0; i < r.dx.size(); ++i)
          REQUIRE(dx[i] == Approx(r.dx[i]).margin(1e-6).epsilon(1e-4));
        for (int i = 0; i < B; ++i)
          REQUIRE(dlogit[i] == Approx(r.dlogit[i]).margin(1e-7).epsilon(1e-5));
        head.predict(c.x, c.extra, probs);
        for (int i = 0; i < B; ++i) REQUIRE(probs[i] == Approx(r.probs[i]).margin(1e-6));
      }
}

TEST_CASE("The float64 reference's gradients match finite differences", "[logistic_mlp]") {
  const ps::MlpShape shape{
      .inputs = 4, .hidden = {5, 3}, .classes = 1, .activation = ps::Activation::kSigmoid};
  const Case c = make_case(shape, 6, true, 9);
  std::vector<double> p = to_double(c.params), x = to_double(c.x);
  const std::vector<double> y = to_double(c.labels), e = to_double(c.extra);
  const Ref r = reference(shape, p, x, y, e);
  const double h = 1e-6;
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double up = reference(shape, p, x, y, e).loss;
    p[i] = keep - h;
    const double down = reference(shape, p, x, y, e).loss;
    p[i] = keep;
    REQUIRE(r.grads[i] == Approx((up - down) / (2 * h)).margin(1e-7));
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = reference(shape, p, x, y, e).loss;
    x[i] = keep - h;
    const double down = reference(shape, p, x, y, e).loss;
    x[i] = keep;
    REQUIRE(r.dx[i] == Approx((up - down) / (2 * h)).margin(1e-7));
  }
}

TEST_CASE("LogisticMlp: extreme logits give a finite loss", "[logistic_mlp]") {
  check_extreme_logits<ps::LogisticMlp>();
}

TEST_CASE("LogisticMlp: predict over more than max_batch examples", "[logistic_mlp]") {
  const ps::MlpShape shape{.inputs = 6, .hidden = {8}, .classes = 1};
  const Case c = make_case(shape, 50, true, 4);
  ps::LogisticMlp small(shape, 7), big(shape, 50);
  std::copy(c.params.begin(), c.params.end(), small.params().begin());
  std::copy(c.params.begin(), c.params.end(), big.params().begin());
  std::vector<float> a(50), b(50);
  small.predict(c.x, c.extra, a);
  big.predict(c.x, c.extra, b);
  for (int i = 0; i < 50; ++i) CHECK(a[i] == Approx(b[i]).margin(1e-7));
}

TEST_CASE("LogisticMlp refuses bad input and changes nothing", "[logistic_mlp]") {
  check_refuses_bad_input<ps::LogisticMlp>();
}
