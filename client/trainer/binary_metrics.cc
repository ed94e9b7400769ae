// Log-loss and ROC AUC (ps/binary_metrics.h).
#include "ps/binary_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "ps/errors.h"

namespace ps {
namespace {

template <typename T>
void check(std::span<const float> labels, std::span<const T> scores, const char* what) {
  if (labels.size() != scores.size())
    throw Error(fmt::format("{}: {} labels but {} scores", what, labels.size(), scores.size()));
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 0.0f && labels[i] != 1.0f)
      throw Error(fmt::format("{}: label {} of example {} is not 0 or 1", what, labels[i], i));
    if (!std::isfinite(static_cast<double>(scores[i])))
      throw Error(fmt::format("{}: score of example {} is not finite", what, i));
  }
}

template <typename T>
double log_loss_impl(std::span<const float> labels, std::span<const T> probs) {
  check(labels, probs, "log_loss");
  if (labels.empty()) return std::numeric_limits<double>::quiet_NaN();
  constexpr double kEps = 1e-15;
  double sum = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double p = std::clamp(static_cast<double>(probs[i]), kEps, 1 - kEps);
    sum -= labels[i] == 1.0f ? std::log(p) : std::log1p(-p);
  }
  return sum / static_cast<double>(labels.size());
}

template <typename T>
double auc_impl(std::span<const float> labels, std::span<const T> scores) {
  check(labels, scores, "roc_auc");
  const size_t n = labels.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Sum of the (1-based, ties averaged) ranks of the positives.
  double rank_sum = 0;
  double positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double pos_in_group = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) pos_in_group += labels[order[j++]];
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    rank_sum += pos_in_group * mean_rank;
    positives += pos_in_group;
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace

double log_loss(std::span<const float> labels, std::span<const float> probs) {
  return log_loss_impl(labels, probs);
}
double log_loss(std::span<const float> labels, std::span<const double> probs) {
  return log_loss_impl(labels, probs);
}
double roc_auc(std::span<const float> labels, std::span<const float> scores) {
  return auc_impl(labels, scores);
}
double roc_auc(std::span<const float> labels, std::span<const double> scores) {
  return auc_impl(labels, scores);
}

}  // namespace ps
