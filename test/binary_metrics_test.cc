// Log-loss and AUC against direct float64 computations; AUC exact with ties
// against a brute-force count over all positive/negative pairs.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "ps/binary_metrics.h"
#include "ps/errors.h"

namespace {

// Share of (positive, negative) pairs ranked right, a tie counting 1/2.
double brute_force_auc(const std::vector<float>& y, const std::vector<double>& s) {
  double good = 0, pairs = 0;
  for (size_t i = 0; i < y.size(); ++i)
    for (size_t j = 0; j < y.size(); ++j)
      if (y[i] == 1 && y[j] == 0) {
        pairs += 1;
        good += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
      }
  return good / pairs;
}

}  // namespace

TEST_CASE("roc_auc equals the pairwise count, ties included", "[metrics]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + trial % 60;
    const int levels = 1 + trial % 7;  // few distinct scores: many ties
    std::uniform_int_distribution<int> level(0, levels - 1);
    std::bernoulli_distribution click(0.3);
    std::vector<float> y(n);
    std::vector<double> s(n);
    for (int i = 0; i < n; ++i) {
      y[i] = click(rng) ? 1.0f : 0.0f;
      s[i] = trial % 2 ? level(rng) * 0.25 : std::uniform_real_distribution<double>(0, 1)(rng);
    }
    y[0] = 1;  // both classes present
    y[1] = 0;
    INFO("trial " << trial << " n " << n);
    REQUIRE(ps::roc_auc(y, s) == Approx(brute_force_auc(y, s)).margin(1e-12));
    const std::vector<float> sf(s.begin(), s.end());
    REQUIRE(ps::roc_auc(y, sf) == Approx(brute_force_auc(y, s)).margin(1e-12));
  }
}

TEST_CASE("roc_auc: known values", "[metrics]") {
  const std::vector<float> y{0, 0, 1, 1};
  CHECK(ps::roc_auc(y, std::vector<double>{0.1, 0.2, 0.3, 0.4}) == 1.0);
  CHECK(ps::roc_auc(y, std::vector<double>{0.4, 0.3, 0.2, 0.1}) == 0.0);
  CHECK(ps::roc_auc(y, std::vector<double>{0.5, 0.5, 0.5, 0.5}) == 0.5);
  CHECK(ps::roc_auc(y, std::vector<double>{0.1, 0.4, 0.35, 0.8}) == 0.75);
  CHECK(std::isnan(ps::roc_auc(std::vector<float>{1, 1}, std::vector<double>{0.1, 0.2})));
}

TEST_CASE("log_loss equals the mean of -log p(label)", "[metrics]") {
  const std::vector<float> y{1, 0, 1, 0};
  const std::vector<double> p{0.9, 0.2, 0.5, 0.999};
  const double want = -(std::log(0.9) + std::log(0.8) + std::log(0.5) + std::log(0.001)) / 4;
  CHECK(ps::log_loss(y, p) == Approx(want).epsilon(1e-12));
  // Clipped, so a confident mistake is large but finite.
  const double clipped = ps::log_loss(std::vector<float>{1}, std::vector<double>{0.0});
  CHECK(clipped == Approx(-std::log(1e-15)).epsilon(1e-9));
  CHECK(ps::log_loss(std::vector<float>{0}, std::vector<float>{0.0f}) == Approx(0).margin(1e-12));
}

TEST_CASE("metrics refuse bad input", "[metrics]") {
  const std::vector<float> y{0, 1};
  CHECK_THROWS_AS(ps::roc_auc(y, std::vector<double>{0.5}), ps::Error);  // sizes
  CHECK_THROWS_AS(ps::roc_auc(std::vector<float>{0, 0.5f}, std::vector<double>{0, 1}),
                  ps::Error);                                               // label
  CHECK_THROWS_AS(ps::roc_auc(y, std::vector<double>{0, NAN}), ps::Error);  // score
  CHECK_THROWS_AS(ps::log_loss(y, std::vector<double>{0.5, INFINITY}), ps::Error);
  CHECK_THROWS_AS(ps::log_loss(std::vector<float>{2, 0}, std::vector<double>{0.5, 0.5}), ps::Error);
}
