// Writes synthetic click data in the Criteo TSV layout (or Avazu's CSV) from
// a planted logistic model (ps/ctr_synthetic.h) and prints that model's
// log-loss and AUC on the held-out part: the best any learner can do on the file.
//
//   build/examples/make_ctr_data --out data/ctr/synthetic.tsv --examples 1000000
//   build/examples/make_ctr_data --out data/ctr/avazu.csv --layout avazu
//   scripts/make_ctr_data.sh data/ctr/synthetic.tsv 1000000      # the same
#include <chrono>
#include <cstdio>
#include <fstream>

#include <CLI/CLI.hpp>

#include "ps/flag_parsing.h"
#include "ps/ctr_synthetic.h"
#include "ps/errors.h"

int main(int argc, char** argv) {
  CLI::App app{
      "make_ctr_data: synthetic click data (Criteo's TSV or Avazu's CSV layout) from a planted "
      "logistic model"};
  ps::CtrSyntheticOptions opt;
  std::string out_path;
  app.add_option("--out", out_path, "file to write (one example a line; avazu: after a header)")
      ->required();
  app.add_option("--examples", opt.examples, "examples to write")->capture_default_str();
  app.add_option("--seed", opt.seed, "generator seed (the same seed writes the same file)")
      ->capture_default_str();
  app.add_option("--holdout", opt.holdout_fraction, "share of the examples, at the end, held out")
      ->capture_default_str();
  app.add_option("--min_distinct", opt.min_distinct, "distinct values of C1 (log-spaced up to C26)")
      ->capture_default_str();
  app.add_option("--max_distinct", opt.max_distinct, "distinct values of C26")
      ->capture_default_str();
  app.add_option("--zipf", opt.zipf_exponent, "Zipf exponent of each field's values")
      ->capture_default_str();
  app.add_option("--missing", opt.missing_rate, "probability that a field is empty")
      ->capture_default_str();
  app.add_option("--bias", opt.bias, "planted bias (sets the click rate)")->capture_default_str();
  app.add_option("--weight_scale", opt.weight_scale, "std dev of a rank-1 value's planted weight")
      ->capture_default_str();
  app.add_option("--weight_decay", opt.weight_decay,
                 "rank r's weight std dev is weight_scale * r^-decay")
      ->capture_default_str();
  std::string layout = "criteo";
  app.add_option("--layout", layout,
                 "criteo: Criteo's TSV (label, I1..I13, C1..C26); avazu: Avazu's train.csv "
                 "(id, click, hour, 21 categorical columns; the planted model then uses those "
                 "21 fields only)")
      ->check(CLI::IsMember({"criteo", "avazu"}))
      ->capture_default_str();
  PS_PARSE_FLAGS(app, argc, argv);
  const bool avazu = layout == "avazu";
  if (avazu) {
    opt.categorical_fields = 21;
    opt.dense_fields = 0;
  }

  try {
    const ps::CtrSynthetic gen(opt);
    std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
    if (!out) throw ps::ConfigError(out_path + ": cannot open for writing");
    const auto start = std::chrono::steady_clock::now();
    const ps::CtrPlantedStats s = ps::write_ctr_synthetic(
        gen, out, avazu ? ps::CtrFileLayout::kAvazuCsv : ps::CtrFileLayout::kCriteoTsv);
    out.close();
    if (!out) throw ps::Error(out_path + ": write failed");
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "wrote %lld examples to %s in %.1f s (seed %llu, %lld..%lld distinct values per field, "
        "zipf %.2f)\n",
        static_cast<long long>(s.examples), out_path.c_str(), secs,
        static_cast<unsigned long long>(opt.seed), static_cast<long long>(gen.distinct(0)),
        static_cast<long long>(gen.distinct(opt.categorical_fields - 1)), opt.zipf_exponent);
    std::printf("click rate: %.4f before the held-out part, %.4f in it\n", s.train_ctr,
                s.holdout_ctr);
    std::printf("held-out part: the last %lld examples (from line %lld)\n",
                static_cast<long long>(s.holdout),
                static_cast<long long>(gen.holdout_begin() + 1 + (avazu ? 1 : 0)));
    std::printf("planted model on the held-out part: log-loss %.5f AUC %.5f\n", s.holdout_log_loss,
                s.holdout_auc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_ctr_data: %s\n", e.what());
    return 1;
  }
}
