// Metrics of a binary classifier (click prediction): mean log-loss and the
// area under the ROC curve.
//
//   std::vector<float> labels = ...;   // (n) 0 or 1
//   std::vector<float> probs = ...;    // (n) predicted P(label = 1)
//   double ll = ps::log_loss(labels, probs);
//   double auc = ps::roc_auc(labels, probs);
//
// Labels must be 0 or 1 and scores finite (else ps::Error); sizes must match.
#pragma once

#include <span>

namespace ps {

// Mean of -(y log p + (1 - y) log(1 - p)), p clipped to [1e-15, 1 - 1e-15].
double log_loss(std::span<const float> labels, std::span<const float> probs);
double log_loss(std::span<const float> labels, std::span<const double> probs);

// AUC by the rank statistic (Mann-Whitney U), exact with ties: a tied
// positive/negative pair counts one half. Any monotone score works (logits
// or probabilities). NaN when all labels are equal. O(n log n).
double roc_auc(std::span<const float> labels, std::span<const float> scores);
double roc_auc(std::span<const float> labels, std::span<const double> scores);

}  // namespace ps
