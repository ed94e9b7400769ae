// Synthetic click data from a planted logistic model, in the Criteo layout
// of ps/ctr_data.h, so that a trainer's result can be compared with the best
// any learner can do: the planted model's own log-loss and AUC.
//
// The planted model: P(click) = sigmoid(logit) with
//   logit = bias + sum over categorical fields f of w_f(rank of C_f)
//               + sum over dense fields j of v_j * sign(I_j) log(1 + |I_j|)
//               + sum over the planted crosses (a, b) of w_ab(rank of C_a, rank of C_b)
// where a missing value adds nothing. Each field f draws its values' ranks
// from a Zipf distribution over distinct(f) values (log-spaced from
// min_distinct for C1 to max_distinct for C26); a value of rank r has a
// normal weight of standard deviation weight_scale * r^-weight_decay, fixed by
// (seed, f, r), so frequent values matter more, as in real click logs. Ranks
// map to 8-hex-digit values by a bijection per field.
//
// Example i is a function of (seed, i) alone; the last holdout_fraction of
// the examples is the held-out part.
//
//   ps::CtrSyntheticOptions opt;
//   opt.examples = 1000000;
//   ps::CtrSynthetic gen(opt);
//   std::ofstream out("train.tsv");
//   ps::CtrPlantedStats s = ps::write_ctr_synthetic(gen, out);
//   // s.holdout_log_loss, s.holdout_auc: the planted model on the held-out part
//   // or as Avazu's train.csv (opt.categorical_fields = 21, opt.dense_fields = 0):
//   ps::write_ctr_synthetic(gen, out, ps::CtrFileLayout::kAvazuCsv);
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "ps/ctr_data.h"

namespace ps {

struct CtrSyntheticOptions {
  uint64_t seed = 1;
  int64_t examples = 100000;
  double holdout_fraction = 0.1;   // the last part of the examples
  int64_t min_distinct = 1000;     // values of C1
  int64_t max_distinct = 1000000;  // values of C26
  double zipf_exponent = 1.1;
  double missing_rate = 0.02;  // of each field of each example
  double bias = -0.8;          // a click rate near 0.25, as Criteo's
  double weight_scale = 0.6;   // std dev of a rank-1 value's weight
  double weight_decay = 0.5;   // rank r: std dev weight_scale * r^-weight_decay
  double dense_weight_scale = 0.2;
  std::vector<FieldCross> crosses{{0, 1}, {2, 3}, {4, 5}};  // planted interactions
  double cross_weight_scale = 0.4;
  // Fields drawn: C1..C<categorical_fields> and I1..I<dense_fields>; the
  // rest are always missing (a layout that carries fewer, as Avazu's).
  int categorical_fields = kCtrCategorical;
  int dense_fields = kCtrDense;

  void validate() const;  // throws ps::ConfigError naming the bad option
};

class CtrSynthetic {
 public:
  explicit CtrSynthetic(const CtrSyntheticOptions& options);

  const CtrSyntheticOptions& options() const { return options_; }
  int64_t distinct(int field) const { return distinct_.at(field); }
  int64_t holdout_begin() const { return holdout_begin_; }  // first held-out example

  // Example i in [0, examples); returns its planted click probability.
  double example(int64_t i, CtrExample& out) const;
  // The planted click probability of any example in the layout.
  double planted_probability(const CtrExample& e) const;

  // The value of rank r (1 = most frequent) of field f, and back (0 for a
  // value that is none of the field's).
  uint32_t value_of(int field, int64_t rank) const;
  int64_t rank_of(int field, uint32_t value) const;

 private:
  double value_weight(uint64_t salt, int64_t rank) const;

  CtrSyntheticOptions options_;
  int64_t holdout_begin_;
  std::vector<int64_t> distinct_;     // (26)
  std::vector<uint32_t> mult_;        // (26) odd multipliers of the rank -> value bijection
  std::vector<uint32_t> mult_inv_;    // (26) their inverses mod 2^32
  std::vector<uint32_t> offset_;      // (26)
  std::vector<double> dense_weight_;  // (13)
};

struct CtrPlantedStats {
  int64_t examples = 0;
  int64_t holdout = 0;   // examples in the held-out part
  double train_ctr = 0;  // share of clicks before the held-out part
  double holdout_ctr = 0;
  double holdout_log_loss = 0;  // of the planted probabilities
  double holdout_auc = 0;
};

// Writes every example, one line each, and returns the planted model's
// metrics. Throws ps::Error when the stream fails.
// The file layouts write_ctr_synthetic writes: Criteo's TSV, or Avazu's
// train.csv (id, click, hour, then 21 categorical columns: C1..C21 as 8 hex
// digits; the hours spread over ten days in order), which needs a generator
// of at most 21 categorical fields and no dense ones.
enum class CtrFileLayout { kCriteoTsv, kAvazuCsv };
CtrPlantedStats write_ctr_synthetic(const CtrSynthetic& generator, std::ostream& out,
                                    CtrFileLayout layout = CtrFileLayout::kCriteoTsv);

}  // namespace ps
