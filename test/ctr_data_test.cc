// Criteo-layout CTR data: the line parser and file reader (good lines,
// missing fields, malformed lines refused with their line numbers), feature
// ids, and the planted-model generator (deterministic by seed, Zipf heads,
// planted AUC).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "client/trainer/zipf.h"
#include "ps/binary_metrics.h"
#include "ps/ctr_data.h"
#include "ps/ctr_synthetic.h"
#include "ps/errors.h"

namespace {

// label, 13 integers, 26 categorical, joined by tabs.
std::string make_line(const std::string& label, const std::vector<std::string>& dense,
                      const std::vector<std::string>& cat) {
  std::string s = label;
  for (int j = 0; j < ps::kCtrDense; ++j)
    s += "\t" + (j < static_cast<int>(dense.size()) ? dense[j] : "");
  for (int j = 0; j < ps::kCtrCategorical; ++j)
    s += "\t" + (j < static_cast<int>(cat.size()) ? cat[j] : "");
  return s;
}

const std::string kGood =
    make_line("1", {"1", "-1", "5", "0", "1382", "4", "15", "2", "181", "1", "2", "", "2"},
              {"68fd1e64", "80e26c9b", "fb936136", "7b4723c4", "25c83c98", "7e0ccccf", "de7995b8",
               "1f89b562", "a73ee510", "a8cd5504", "b2cb9c98", "37c9c164", "2824a5f6", "1adce6ef",
               "8ba8b39a", "891b62e7", "e5ba7672", "f54016b9", "21ddcdc9", "b1252a9d", "07b5194c",
               "",         "3a171ecb", "c5c50484", "e8b83407", "9727dd16"});

// A file under TMPDIR removed at the end of the test.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/ctr_data_test_XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path = name;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("parse_ctr_line reads a Criteo line", "[ctr][reader]") {
  ps::CtrExample e;
  std::string why;
  REQUIRE(ps::parse_ctr_line(kGood, e, &why));
  CHECK(e.label == 1.0f);
  CHECK(e.dense[0] == 1);
  CHECK(e.dense[1] == -1);
  CHECK(e.dense[4] == 1382);
  CHECK(e.dense_present.count() == 12);
  CHECK_FALSE(e.dense_present[11]);
  CHECK(e.categorical[0] == 0x68fd1e64u);
  CHECK(e.categorical[25] == 0x9727dd16u);
  CHECK(e.categorical_present.count() == 25);
  CHECK_FALSE(e.categorical_present[21]);
  // Formatting gives the line back.
  CHECK(ps::format_ctr_line(e) == kGood);
}

TEST_CASE("parse_ctr_line: every feature missing, CRLF, short and upper-case hex",
          "[ctr][reader]") {
  ps::CtrExample e;
  e.dense.fill(7);
  e.categorical.fill(7);
  std::string why;
  REQUIRE(ps::parse_ctr_line(make_line("0", {}, {}) + "\r", e, &why));
  CHECK(e.label == 0.0f);
  CHECK(e.dense_present.none());
  CHECK(e.categorical_present.none());
  CHECK(e.dense == std::array<int64_t, ps::kCtrDense>{});  // missing reads as 0
  CHECK(e.categorical == std::array<uint32_t, ps::kCtrCategorical>{});
  REQUIRE(ps::parse_ctr_line(
      make_line("0", {"-9223372036854775808"}, {"A", "FFFFFFFF", "00000000"}), e, &why));
  CHECK(e.dense[0] == INT64_MIN);
  CHECK(e.categorical[0] == 0xa);
  CHECK(e.categorical[1] == 0xffffffffu);
  CHECK(e.categorical_present[2]);
  CHECK(e.categorical[2] == 0);
}

TEST_CASE("parse_ctr_line refuses malformed lines and says why", "[ctr][reader]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "got 1"},
      {kGood.substr(0, kGood.rfind('\t')),
       "expected 40 tab-separated fields"},  // test.txt: no label column
      {kGood + "\t", "got 41"},
      {make_line("", {}, {}), "label"},
      {make_line("2", {}, {}), "label: expected 0 or 1, got '2'"},
      {make_line("0.5", {}, {}), "label"},
      {make_line("1", {"1.5"}, {}), "I1: not a 64-bit integer: '1.5'"},
      {make_line("1", {"", "x"}, {}), "I2"},
      {make_line("1", {"", "", "9223372036854775808"}, {}), "I3"},  // overflow
      {make_line("1", {"", "", "", " 4"}, {}), "I4"},
      {make_line("1", {}, {"xyz"}), "C1: not a hex value of up to 8 digits: 'xyz'"},
      {make_line("1", {}, {"", "123456789"}), "C2"},  // 9 digits
      {make_line("1", {}, {"", "", "-1"}), "C3"},
      {make_line("1", {}, {"", "", "", "0x12"}), "C4"},
  };
  for (const auto& [line, want] : cases) {
    INFO("line: " << line);
    ps::CtrExample e;
    std::string why;
    CHECK_FALSE(ps::parse_ctr_line(line, e, &why));
    CHECK_THAT(why, Catch::Contains(want));
  }
}

TEST_CASE("CtrReader reads a file and names the line of a bad one", "[ctr][reader]") {
  const TempFile f(kGood + "\n\n" + make_line("0", {}, {}) + "\n" + make_line("1", {"oops"}, {}) +
                   "\n" + kGood + "\n");
  ps::CtrReader reader(f.path);
  ps::CtrExample e;
  REQUIRE(reader.next(e));
  CHECK(reader.line_number() == 1);
  REQUIRE(reader.next(e));  // the empty line 2 is skipped
  CHECK(reader.line_number() == 3);
  CHECK(e.dense_present.none());
  try {
    reader.next(e);
    FAIL("a malformed line was accepted");
  } catch (const ps::ConfigError& err) {
    CHECK_THAT(err.what(), Catch::StartsWith(f.path + ":4: I1: not a 64-bit integer"));
  }
  CHECK_THROWS_WITH(ps::read_ctr_file(f.path), Catch::Contains(":4:"));
  CHECK(ps::read_ctr_file(f.path, 2).size() == 2);
  CHECK_THROWS_AS(ps::CtrReader("/nonexistent/ctr.tsv"), ps::ConfigError);
}

TEST_CASE("Feature ids: fixed hashes, distinct per field, missing and crosses apart",
          "[ctr][features]") {
  // Pinned: ids stored in checkpoints must not change with a new build.
  CHECK(ps::ctr_hash_feature(0, 0x68fd1e64) == 10831367581907925143ull);
  CHECK(ps::ctr_hash_feature(25, ps::kCtrMissing) == 7798281964698249417ull);
  CHECK(ps::ctr_hash_feature(3, 0) == 7991410280390944903ull);
  ps::CtrExample e;
  REQUIRE(ps::parse_ctr_line(kGood, e, nullptr));
  CHECK(ps::ctr_cross_id(0, 1, e) == 17565898392049404430ull);

  CHECK(ps::ctr_hash_feature(0, 5) != ps::ctr_hash_feature(1, 5));
  CHECK(ps::ctr_hash_feature(4, 0) != ps::ctr_hash_feature(4, ps::kCtrMissing));
  CHECK(ps::ctr_feature_id(21, e) == ps::ctr_hash_feature(21, ps::kCtrMissing));  // C22 is empty
  CHECK(ps::ctr_feature_id(0, e) == ps::ctr_hash_feature(0, 0x68fd1e64));
  CHECK_THROWS_AS(ps::ctr_hash_feature(26, 0), ps::Error);

  const auto crosses = ps::default_ctr_crosses();
  REQUIRE(crosses.size() == 13);
  CHECK(crosses[12].a == 24);
  CHECK(crosses[12].b == 25);
  std::vector<uint64_t> wide;
  ps::ctr_wide_ids(e, crosses, wide);
  REQUIRE(wide.size() == 26 + 13);
  std::vector<uint64_t> single(26);
  ps::ctr_categorical_ids(e, single);
  CHECK(std::equal(single.begin(), single.end(), wide.begin()));
  std::sort(wide.begin(), wide.end());
  CHECK(std::adjacent_find(wide.begin(), wide.end()) == wide.end());  // all 39 distinct

  std::vector<float> dense(13);
  ps::ctr_dense_features(e, dense);
  CHECK(dense[0] == Approx(std::log(2.0)));
  CHECK(dense[1] == Approx(-std::log(2.0)));
  CHECK(dense[3] == 0.0f);
  CHECK(dense[4] == Approx(std::log(1383.0)));
  CHECK(dense[11] == 0.0f);  // missing
}

TEST_CASE("make_ctr_batch lays the features of B examples side by side", "[ctr][features]") {
  std::vector<ps::CtrExample> ex(2);
  REQUIRE(ps::parse_ctr_line(kGood, ex[0], nullptr));
  REQUIRE(ps::parse_ctr_line(make_line("0", {"3"}, {"", "ab"}), ex[1], nullptr));
  const auto crosses = ps::default_ctr_crosses();
  ps::CtrBatch batch;
  ps::make_ctr_batch(ex, crosses, batch);
  REQUIRE(batch.size == 2);
  CHECK(batch.labels == std::vector<float>{1, 0});
  REQUIRE(batch.dense.size() == 2 * 13);
  REQUIRE(batch.ids.size() == 2 * 26);
  REQUIRE(batch.wide_ids.size() == 2 * 39);
  CHECK(batch.dense[13] == Approx(std::log(4.0)));
  CHECK(batch.ids[26 + 1] == ps::ctr_hash_feature(1, 0xab));
  CHECK(batch.ids[26 + 0] == ps::ctr_hash_feature(0, ps::kCtrMissing));
  std::vector<uint64_t> wide;
  ps::ctr_wide_ids(ex[1], crosses, wide);
  CHECK(std::equal(wide.begin(), wide.end(), batch.wide_ids.begin() + 39));
  ps::make_ctr_batch(std::span<const ps::CtrExample>(ex).first(1), crosses,
                     batch);  // buffers shrink
  CHECK(batch.size == 1);
  CHECK(batch.ids.size() == 26);
}

TEST_CASE("Zipf sampler matches k^-s / H(n, s)", "[ctr][zipf]") {
  for (const auto& [n, s] : std::vector<std::pair<int64_t, double>>{
           {20, 1.0}, {20, 1.1}, {50, 2.5}, {7, 0.5}, {1, 1.1}}) {
    const ps::detail::ZipfSampler zipf(n, s);
    std::mt19937_64 rng(n);
    std::uniform_real_distribution<double> u(0, 1);
    const auto uniform = [&] {
      double v;
      do v = u(rng);
      while (v == 0.0);
      return v;
    };
    const int draws = 200000;
    std::vector<int64_t> count(n + 1, 0);
    for (int i = 0; i < draws; ++i) {
      const int64_t k = zipf.sample(uniform);
      REQUIRE(k >= 1);
      REQUIRE(k <= n);
      ++count[k];
    }
    const double h = ps::detail::zipf_normalizer(n, s);
    for (int64_t k = 1; k <= n; ++k) {
      const double p = std::pow(double(k), -s) / h, want = draws * p;
      INFO("n " << n << " s " << s << " k " << k);
      CHECK(std::fabs(count[k] - want) <= 5 * std::sqrt(want * (1 - p)) + 1);
    }
  }
}

TEST_CASE("Generator: deterministic by seed, example i independent of order", "[ctr][generator]") {
  ps::CtrSyntheticOptions opt;
  opt.examples = 2000;
  const ps::CtrSynthetic a(opt), b(opt);
  opt.seed = 2;
  const ps::CtrSynthetic c(opt);
  std::ostringstream sa, sb, sc;
  const ps::CtrPlantedStats st_a = ps::write_ctr_synthetic(a, sa);
  const ps::CtrPlantedStats st_b = ps::write_ctr_synthetic(b, sb);
  ps::write_ctr_synthetic(c, sc);
  CHECK(sa.str() == sb.str());
  CHECK(st_a.holdout_auc == st_b.holdout_auc);
  CHECK(sa.str() != sc.str());
  ps::CtrExample late, early;
  const double p = a.example(1500, late);
  a.example(3, early);
  ps::CtrExample again;
  CHECK(a.example(1500, again) == p);
  CHECK(ps::format_ctr_line(again) == ps::format_ctr_line(late));
  CHECK_THROWS_AS(a.example(2000, again), ps::Error);
  // Every line parses back, and its planted probability is that of the example.
  std::istringstream lines(sa.str());
  std::string line;
  int64_t i = 0;
  for (; std::getline(lines, line); ++i) {
    ps::CtrExample e, want;
    REQUIRE(ps::parse_ctr_line(line, e, nullptr));
    REQUIRE(a.planted_probability(e) == a.example(i, want));
  }
  CHECK(i == 2000);
}

TEST_CASE("Generator: ranks and values, distinct counts per field", "[ctr][generator]") {
  const ps::CtrSynthetic gen(ps::CtrSyntheticOptions{});
  CHECK(gen.distinct(0) == 1000);
  CHECK(gen.distinct(25) == 1000000);
  CHECK(gen.distinct(13) > gen.distinct(12));
  for (int f : {0, 7, 25})
    for (int64_t r : {int64_t{1}, int64_t{2}, gen.distinct(f)})
      CHECK(gen.rank_of(f, gen.value_of(f, r)) == r);
  CHECK(gen.rank_of(0, gen.value_of(0, 1001)) == 0);  // beyond the field's values
  CHECK(gen.value_of(0, 1) != gen.value_of(1, 1));
}

TEST_CASE("Generator: each field's head follows the Zipf law", "[ctr][generator]") {
  ps::CtrSyntheticOptions opt;
  opt.examples = 100000;
  const ps::CtrSynthetic gen(opt);
  std::vector<std::map<int64_t, int64_t>> count(ps::kCtrCategorical);  // field -> rank -> count
  std::vector<int64_t> present(ps::kCtrCategorical, 0);
  ps::CtrExample e;
  for (int64_t i = 0; i < opt.examples; ++i) {
    gen.example(i, e);
    for (int f = 0; f < ps::kCtrCategorical; ++f)
      if (e.categorical_present[f]) {
        const int64_t r = gen.rank_of(f, e.categorical[f]);
        REQUIRE(r >= 1);
        ++count[f][r];
        ++present[f];
      }
  }
  for (int f : {0, 12, 25}) {
    CHECK(present[f] == Approx(opt.examples * (1 - opt.missing_rate)).epsilon(0.01));
    const double h = ps::detail::zipf_normalizer(gen.distinct(f), opt.zipf_exponent);
    for (int64_t r = 1; r <= 10; ++r) {
      const double p = std::pow(double(r), -opt.zipf_exponent) / h, want = present[f] * p;
      INFO("field " << f << " rank " << r << " seen " << count[f][r] << " expected " << want);
      CHECK(std::fabs(count[f][r] - want) <= 5 * std::sqrt(want * (1 - p)));
    }
  }
}

TEST_CASE("Generator: the planted model's held-out AUC and log-loss", "[ctr][generator]") {
  ps::CtrSyntheticOptions opt;
  opt.examples = 100000;
  const ps::CtrSynthetic gen(opt);
  std::ostringstream out;
  const ps::CtrPlantedStats s = ps::write_ctr_synthetic(gen, out);
  CHECK(s.holdout == 10000);
  CHECK(gen.holdout_begin() == 90000);
  CHECK(s.holdout_auc > 0.7);
  CHECK(s.train_ctr > 0.15);
  CHECK(s.train_ctr < 0.35);
  // The constant predictor at the click rate has the entropy as log-loss: the
  // planted model must beat it.
  const double q = s.holdout_ctr, entropy = -(q * std::log(q) + (1 - q) * std::log(1 - q));
  CHECK(s.holdout_log_loss < entropy - 0.02);
  // The same figures from the file read back.
  std::istringstream lines(out.str());
  std::string line;
  std::vector<float> labels;
  std::vector<double> probs;
  for (int64_t i = 0; std::getline(lines, line); ++i) {
    ps::CtrExample e;
    REQUIRE(ps::parse_ctr_line(line, e, nullptr));
    if (i < gen.holdout_begin()) continue;
    labels.push_back(e.label);
    probs.push_back(gen.planted_probability(e));
  }
  CHECK(ps::roc_auc(labels, probs) == s.holdout_auc);
  CHECK(ps::log_loss(labels, probs) == s.holdout_log_loss);
}

TEST_CASE("Generator options are checked", "[ctr][generator]") {
  const auto refused = [](auto change) {
    ps::CtrSyntheticOptions opt;
    change(opt);
    CHECK_THROWS_AS(ps::CtrSynthetic(opt), ps::ConfigError);
  };
  refused([](auto& o) { o.examples = 0; });
  refused([](auto& o) { o.holdout_fraction = 1; });
  refused([](auto& o) { o.min_distinct = 0; });
  refused([](auto& o) { o.max_distinct = 10; });  // < min
  refused([](auto& o) { o.zipf_exponent = 0; });
  refused([](auto& o) { o.missing_rate = -0.1; });
  refused([](auto& o) { o.weight_scale = NAN; });
  refused([](auto& o) { o.crosses = {{3, 3}}; });
  refused([](auto& o) { o.crosses = {{0, 26}}; });
}
