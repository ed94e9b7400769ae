// Checks that every logistic head (ps::LogisticMlp, ps::CudaLogisticMlp)
// must pass in the same way: extreme logits give a finite loss and exact
// gradients, and bad input is refused and changes nothing. Include after
// catch2/catch.hpp.
//
//   TEST_CASE("...") { logistic_test::check_extreme_logits<ps::LogisticMlp>(); }
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "ps/errors.h"
#include "ps/mlp.h"

namespace logistic_test {

// One weight of 1 and logits of +-200: the loss is 200 (no overflow), the
// logit gradients +-1/2, the weight's 200; also with no dx or dlogit asked for.
template <class Head>
void check_extreme_logits() {
  const ps::MlpShape shape{.inputs = 1, .hidden = {}, .classes = 1};
  Head head(shape, 2);
  head.params()[0] = 1;  // weight; bias 0
  const std::vector<float> x{200, -200}, labels{0, 1};
  std::vector<float> dlogit(2);
  const double loss = head.compute_gradients(x, labels, {}, {}, dlogit);
  CHECK(loss == Approx(200).epsilon(1e-6));
  CHECK(dlogit[0] == Approx(0.5));
  CHECK(dlogit[1] == Approx(-0.5));
  CHECK(head.grads()[0] == Approx(200));  // d/dw: 0.5 * 200 + (-0.5) * (-200)
  CHECK(head.compute_gradients(x, labels) == Approx(200).epsilon(1e-6));
}

// A shape with two classes or a max_batch of 0 is refused; so is every
// malformed call, leaving params, grads and the caller's buffers as they were.
template <class Head>
void check_refuses_bad_input() {
  const ps::MlpShape shape{.inputs = 3, .hidden = {4}, .classes = 1};
  CHECK_THROWS_AS(Head(ps::MlpShape{.inputs = 3, .hidden = {4}, .classes = 2}, 4), ps::ConfigError);
  CHECK_THROWS_AS(Head(shape, 0), ps::ConfigError);
  Head head(shape, 4);
  std::fill(head.params().begin(), head.params().end(), 0.5f);
  std::fill(head.grads().begin(), head.grads().end(), -3.0f);
  const std::vector<float> x(6, 1.0f), labels{0, 1};
  std::vector<float> short_dx(5, -3.0f), dlogit(2, -3.0f), long_dlogit(3, -3.0f);
  CHECK_THROWS_AS(head.compute_gradients(std::vector<float>(5, 1.0f), labels),
                  ps::Error);                                                         // x size
  CHECK_THROWS_AS(head.compute_gradients(x, std::vector<float>{0, 2}), ps::Error);    // label > 1
  CHECK_THROWS_AS(head.compute_gradients(x, std::vector<float>{0, NAN}), ps::Error);  // NaN label
  CHECK_THROWS_AS(head.compute_gradients(x, labels, std::vector<float>{1}),
                  ps::Error);  // extra size
  CHECK_THROWS_AS(head.compute_gradients(x, labels, {}, short_dx, dlogit), ps::Error);  // dx size
  CHECK_THROWS_AS(head.compute_gradients(x, labels, {}, {}, long_dlogit),
                  ps::Error);  // dlogit size
  CHECK_THROWS_AS(head.compute_gradients(std::vector<float>(15, 1.0f), std::vector<float>(5, 0)),
                  ps::Error);                                  // > max
  CHECK_THROWS_AS(head.compute_gradients({}, {}), ps::Error);  // empty
  std::vector<float> probs(3);
  CHECK_THROWS_AS(head.predict(x, {}, probs), ps::Error);  // x holds 2 examples, not 3
  auto all = [](const auto& v, float want) {
    return std::all_of(v.begin(), v.end(), [want](float f) { return f == want; });
  };
  CHECK(all(head.params(), 0.5f));
  CHECK(all(head.grads(), -3.0f));
  CHECK(all(short_dx, -3.0f));
  CHECK(all(dlogit, -3.0f));
  CHECK(all(long_dlogit, -3.0f));
}

}  // namespace logistic_test
