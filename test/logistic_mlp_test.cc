// LogisticMlp (the wide & deep dense head) against a float64 reference:
// loss, parameter gradients, input gradient and logit gradient; the
// reference's own gradient against finite differences; bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "ps/errors.h"
#include "ps/logistic_mlp.h"
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
  const ps::MlpShape shape{.inputs = 1, .hidden = {}, .classes = 1};
  ps::LogisticMlp head(shape, 2);
  head.params()[0] = 1;  // weight; bias 0
  const std::vector<float> x{200, -200}, labels{0, 1};
  std::vector<float> dlogit(2);
  const double loss = head.compute_gradients(x, labels, {}, {}, dlogit);
  CHECK(loss == Approx(200).epsilon(1e-6));
  CHECK(dlogit[0] == Approx(0.5));
  CHECK(dlogit[1] == Approx(-0.5));
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
  const ps::MlpShape shape{.inputs = 3, .hidden = {4}, .classes = 1};
  CHECK_THROWS_AS(ps::LogisticMlp(ps::MlpShape{.inputs = 3, .hidden = {4}, .classes = 2}, 4),
                  ps::ConfigError);
  CHECK_THROWS_AS(ps::LogisticMlp(shape, 0), ps::ConfigError);
  ps::LogisticMlp head(shape, 4);
  std::fill(head.grads().begin(), head.grads().end(), -3.0f);
  const std::vector<float> x(6, 1.0f), labels{0, 1};
  std::vector<float> short_dx(5, -3.0f);
  CHECK_THROWS_AS(head.compute_gradients(std::vector<float>(5, 1.0f), labels),
                  ps::Error);                                                         // x size
  CHECK_THROWS_AS(head.compute_gradients(x, std::vector<float>{0, 2}), ps::Error);    // label > 1
  CHECK_THROWS_AS(head.compute_gradients(x, std::vector<float>{0, NAN}), ps::Error);  // NaN label
  CHECK_THROWS_AS(head.compute_gradients(x, labels, std::vector<float>{1}),
                  ps::Error);                                                   // extra size
  CHECK_THROWS_AS(head.compute_gradients(x, labels, {}, short_dx), ps::Error);  // dx size
  CHECK_THROWS_AS(head.compute_gradients(std::vector<float>(15, 1.0f), std::vector<float>(5, 0)),
                  ps::Error);                                  // > max
  CHECK_THROWS_AS(head.compute_gradients({}, {}), ps::Error);  // empty
  CHECK(std::all_of(head.grads().begin(), head.grads().end(), [](float g) { return g == -3.0f; }));
}
