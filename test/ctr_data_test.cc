// Criteo-layout CTR data: the line parser and file reader (good lines,
// missing fields, malformed lines refused with their line numbers), feature
// ids, and the planted-model generator (deterministic by seed, Zipf heads,
// planted AUC).
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <zlib.h>

#include <fmt/format.h>

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
  refused([](auto& o) { o.categorical_fields = 0; });
  refused([](auto& o) { o.categorical_fields = 27; });
  refused([](auto& o) { o.dense_fields = 14; });
  refused([](auto& o) {  // a planted cross over a field not drawn
    o.categorical_fields = 5;
    o.crosses = {{4, 5}};
  });
}

// --- CSV with a header (Avazu's train.csv) ---

namespace {

const std::string kAvazuHeader =
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
    "app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,"
    "C18,C19,C20,C21";
// A line of Avazu's train.csv.
const std::string kAvazuLine =
    "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,"
    "a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79";

}  // namespace

TEST_CASE("CSV layout: Avazu's header and a line of its train.csv", "[ctr][reader][csv]") {
  const ps::CtrCsvLayout l = ps::CtrCsvLayout::from_header(kAvazuHeader + "\r");
  REQUIRE(l.columns() == 24);
  CHECK(l.field_of(0) == -1);   // id
  CHECK(l.field_of(1) == -1);   // click
  CHECK(l.field_of(2) == -1);   // hour
  CHECK(l.field_of(3) == 0);    // C1
  CHECK(l.field_of(23) == 20);  // C21
  CHECK(l.hour_field() == 21);
  // FNV-1a of the text, pinned (the ids of a trained table depend on it).
  CHECK(ps::ctr_text_value("1fbe01fe") == 1106813613u);
  CHECK(ps::ctr_text_value("1005") == 530040331u);
  CHECK(ps::ctr_text_value("-1") == 348981803u);
  CHECK(ps::ctr_text_value("") == 2166136261u);

  ps::CtrExample e;
  e.dense_present.set();  // parse() resets what a CSV line has no value for
  std::string why;
  REQUIRE(l.parse(kAvazuLine + "\r", e, &why));
  CHECK(e.label == 0.0f);
  CHECK(e.dense_present.none());
  CHECK(e.categorical[0] == ps::ctr_text_value("1005"));      // C1
  CHECK(e.categorical[2] == ps::ctr_text_value("1fbe01fe"));  // site_id
  CHECK(e.categorical[8] == ps::ctr_text_value("a99f214a"));  // device_id
  CHECK(e.categorical[19] == ps::ctr_text_value("-1"));       // C20
  CHECK(e.categorical[20] == ps::ctr_text_value("79"));       // C21
  CHECK(e.categorical[21] == 0);                              // hour of the day: 00
  CHECK(e.categorical[22] == 2);  // 2014-10-21 was a Tuesday (0 = Sunday)
  CHECK(e.categorical_present.count() == 23);
  CHECK_FALSE(e.categorical_present[23]);

  // An empty value is missing; the hour and weekday follow the date.
  std::string line = kAvazuLine;
  line.replace(line.find("1fbe01fe"), 8, "");
  line.replace(line.find("14102100"), 8, "14103023");
  line.replace(line.find(",0,"), 3, ",1,");
  REQUIRE(l.parse(line, e, &why));
  CHECK(e.label == 1.0f);
  CHECK_FALSE(e.categorical_present[2]);
  CHECK(e.categorical[21] == 23);
  CHECK(e.categorical[22] == 4);  // a Thursday
  line.replace(line.find("14103023"), 8, "14102612");
  REQUIRE(l.parse(line, e, &why));
  CHECK(e.categorical[21] == 12);
  CHECK(e.categorical[22] == 0);  // a Sunday
  CHECK(ps::ctr_feature_id(2, e) != ps::ctr_feature_id(3, e));

  // Without hour or id, every other column is a field; column order does not matter.
  const ps::CtrCsvLayout m = ps::CtrCsvLayout::from_header("site,click,user");
  CHECK(m.hour_field() == -1);
  REQUIRE(m.parse("abc,1,xyz", e, &why));
  CHECK(e.categorical[0] == ps::ctr_text_value("abc"));
  CHECK(e.categorical[1] == ps::ctr_text_value("xyz"));
  CHECK(e.categorical_present.count() == 2);
}

TEST_CASE("CSV layout: bad headers and lines are refused, saying why", "[ctr][reader][csv]") {
  const std::vector<std::pair<std::string, std::string>> headers = {
      // Avazu's test.csv: no click column.
      {"id,hour,C1,banner_pos,site_id", "no 'click' column"},
      {"click,a,a", "column 3 ('a') named twice"},
      {"click,,a", "column 2 has no name"},
  };
  for (const auto& [h, want] : headers) {
    INFO("header: " << h);
    CHECK_THROWS_WITH(ps::CtrCsvLayout::from_header(h), Catch::Contains(want));
  }
  std::string wide = "click,hour";  // hour takes two fields: 25 more make 27
  for (int c = 0; c < 25; ++c) wide += ",c" + std::to_string(c);
  CHECK_THROWS_WITH(ps::CtrCsvLayout::from_header(wide), Catch::Contains("27 categorical fields"));
  CHECK_NOTHROW(ps::CtrCsvLayout::from_header(wide.substr(0, wide.rfind(','))));

  const ps::CtrCsvLayout l = ps::CtrCsvLayout::from_header(kAvazuHeader);
  const auto with = [](std::string from, const std::string& what, const std::string& by) {
    from.replace(from.find(what), what.size(), by);
    return from;
  };
  const std::vector<std::pair<std::string, std::string>> lines = {
      {kAvazuLine + ",5", "expected 24 comma-separated fields (the header's), got 25"},
      {kAvazuLine.substr(0, kAvazuLine.rfind(',')), "got 23"},
      {with(kAvazuLine, ",0,14", ",2,14"), "click: expected 0 or 1, got '2'"},
      {with(kAvazuLine, ",0,14", ",,14"), "click"},
      {with(kAvazuLine, "14102100", "14102124"), "hour: expected YYMMDDHH, got '14102124'"},
      {with(kAvazuLine, "14102100", "14133100"), "hour"},  // month 13
      {with(kAvazuLine, "14102100", "14023000"), "hour"},  // 30 February
      {with(kAvazuLine, "14102100", "1410210"), "hour"},
      {with(kAvazuLine, "14102100", "1410210x"), "hour"},
  };
  for (const auto& [line, want] : lines) {
    INFO("line: " << line);
    ps::CtrExample e;
    std::string why;
    CHECK_FALSE(l.parse(line, e, &why));
    CHECK_THAT(why, Catch::Contains(want));
  }
}

TEST_CASE("CtrReader finds the layout: a CSV's header is skipped, its lines numbered",
          "[ctr][reader][csv]") {
  const TempFile csv("\n" + kAvazuHeader + "\n" + kAvazuLine + "\n\n" + kAvazuLine + "\n" +
                     kAvazuLine + ",extra\n");
  ps::CtrReader r(csv.path);
  ps::CtrExample e;
  REQUIRE(r.next(e));
  CHECK(r.is_csv());
  CHECK(r.line_number() == 3);
  CHECK(e.categorical[2] == ps::ctr_text_value("1fbe01fe"));
  REQUIRE(r.skip());
  CHECK(r.line_number() == 5);
  CHECK_THROWS_WITH(r.next(e), Catch::StartsWith(csv.path + ":6: expected 24"));

  const TempFile test_csv("id,hour,C1\n1,14102100,1005\n");
  CHECK_THROWS_WITH(ps::read_ctr_file(test_csv.path),
                    Catch::StartsWith(test_csv.path + ":1: CSV header has no 'click' column"));
  const TempFile tsv(kGood + "\n");
  ps::CtrReader t(tsv.path);
  REQUIRE(t.next(e));
  CHECK_FALSE(t.is_csv());
  CHECK_THROWS_WITH(ps::CtrReader("/tmp"), Catch::Contains("a directory"));
}

namespace {

// Example i of a file of n: a Criteo line whose I1 is i (a CSV's column "i").
std::string numbered_lines(int64_t n, bool csv) {
  std::string text = csv ? "click,i,site\n" : "";
  for (int64_t i = 0; i < n; ++i) {
    if (i % 7 == 3) text += "\n";  // empty lines are no examples
    text += csv ? fmt::format("{},{},s{}\n", i % 2, i, i % 5)
                : make_line(i % 2 ? "1" : "0", {std::to_string(i)}, {"abc"}) + "\n";
  }
  return text;
}

int64_t number_of(const ps::CtrExample& e, bool csv) {
  if (!csv) return e.dense[0];
  for (int64_t i = 0;; ++i)  // the CSV's "i" column is field 0, hashed from its text
    if (ps::ctr_text_value(std::to_string(i)) == e.categorical[0]) return i;
}

}  // namespace

TEST_CASE("read_ctr_share: each worker's examples, the held-out tail, lines not kept unparsed",
          "[ctr][reader][share]") {
  for (const bool csv : {false, true}) {
    const int64_t n = 97;
    const TempFile f(numbered_lines(n, csv));
    for (const double holdout : {0.0, 0.1, 0.5}) {
      for (const int workers : {1, 3, 4}) {
        for (const int64_t max : {int64_t{-1}, int64_t{40}}) {
          INFO("csv " << csv << " holdout " << holdout << " workers " << workers << " max " << max);
          const int64_t total = max < 0 ? n : max;
          const int64_t train_end = total - std::llround(total * holdout);
          std::vector<int> seen(n, 0);
          for (int w = 0; w < workers; ++w) {
            ps::CtrShareOptions o;
            o.worker = w;
            o.workers = workers;
            o.holdout = holdout;
            o.keep_holdout = w == 0;
            o.max_examples = max;
            const ps::CtrShare s = ps::read_ctr_share(f.path, o);
            CHECK(s.examples == total);
            CHECK(s.train_end == train_end);
            for (std::size_t k = 0; k < s.train.size(); ++k) {
              const int64_t i = number_of(s.train[k], csv);
              CHECK(i == w + static_cast<int64_t>(k) * workers);  // in file order
              CHECK(s.train[k].label == static_cast<float>(i % 2));
              CHECK(i < train_end);
              ++seen[i];
            }
            if (w > 0) CHECK(s.holdout.empty());
            for (std::size_t k = 0; k < s.holdout.size(); ++k) {
              CHECK(number_of(s.holdout[k], csv) == train_end + static_cast<int64_t>(k));
              ++seen[train_end + k];
            }
          }
          for (int64_t i = 0; i < n; ++i) CHECK(seen[i] == (i < total ? 1 : 0));
        }
      }
    }
  }
}

TEST_CASE("read_ctr_share: a bad line is its reader's; progress is reported; bad options refused",
          "[ctr][reader][share]") {
  std::string text = numbered_lines(10, false);
  // Example 4 (line 5, after the empty line before example 3) is malformed.
  const auto at = text.find("\n0\t4\t") + 1;
  text.replace(at, 1, "x");
  const TempFile f(text);
  ps::CtrShareOptions o;
  o.workers = 2;
  o.worker = 1;  // examples 1, 3, 5, ...: not 4
  CHECK(ps::read_ctr_share(f.path, o).train.size() == 5);
  o.worker = 0;
  CHECK_THROWS_WITH(ps::read_ctr_share(f.path, o), Catch::StartsWith(f.path + ":6: label"));

  const TempFile big(numbered_lines(20000, false));
  std::vector<std::string> doing;
  uint64_t last = 0;
  ps::CtrShareOptions p;
  p.holdout = 0.1;
  p.progress_seconds = 0;  // at every check: once in 4096 lines
  p.progress = [&](const std::string& what, uint64_t done, uint64_t total) {
    doing.push_back(what);
    CHECK(total == std::filesystem::file_size(big.path));
    CHECK(done <= total);
    last = done;
  };
  CHECK(ps::read_ctr_share(big.path, p).train.size() == 18000);
  REQUIRE(doing.size() >= 8);
  CHECK(doing.front() == "counting the examples in");
  CHECK(doing.back() == "reading");
  CHECK(last > 0);

  const auto refused = [&](auto change) {
    ps::CtrShareOptions bad;
    change(bad);
    CHECK_THROWS_AS(ps::read_ctr_share(f.path, bad), ps::ConfigError);
  };
  refused([](auto& b) { b.workers = 0; });
  refused([](auto& b) { b.worker = 2, b.workers = 2; });
  refused([](auto& b) { b.worker = -1; });
  refused([](auto& b) { b.holdout = 1; });
  refused([](auto& b) { b.holdout = NAN; });
  CHECK_THROWS_AS(ps::read_ctr_share("/nonexistent.tsv", ps::CtrShareOptions{}), ps::ConfigError);
}

TEST_CASE("Generator in Avazu's layout: 21 fields, no dense ones, read back as written",
          "[ctr][generator][csv]") {
  ps::CtrSyntheticOptions opt;
  opt.examples = 500;
  opt.categorical_fields = 21;
  opt.dense_fields = 0;
  const ps::CtrSynthetic gen(opt);
  std::ostringstream out;
  const ps::CtrPlantedStats st = ps::write_ctr_synthetic(gen, out, ps::CtrFileLayout::kAvazuCsv);
  CHECK(st.holdout == 50);
  const TempFile f(out.str());
  CHECK(out.str().substr(0, kAvazuHeader.size() + 1) == kAvazuHeader + "\n");
  ps::CtrReader r(f.path);
  ps::CtrExample got, want;
  int64_t i = 0;
  for (; r.next(got); ++i) {
    gen.example(i, want);
    CHECK(want.dense_present.none());
    CHECK((want.categorical_present >> 21).none());
    CHECK(got.label == want.label);
    for (int c = 0; c < 21; ++c) {
      REQUIRE(got.categorical_present[c] == want.categorical_present[c]);
      if (want.categorical_present[c])
        CHECK(got.categorical[c] == ps::ctr_text_value(fmt::format("{:08x}", want.categorical[c])));
    }
    CHECK(got.categorical[21] == static_cast<uint32_t>((i * 240 / 500) % 24));  // hour of the day
  }
  CHECK(i == 500);
  // The Criteo layout carries more than Avazu's: refused.
  const ps::CtrSynthetic full(ps::CtrSyntheticOptions{});
  std::ostringstream sink;
  CHECK_THROWS_WITH(ps::write_ctr_synthetic(full, sink, ps::CtrFileLayout::kAvazuCsv),
                    Catch::Contains("Avazu's layout carries 21"));
}

TEST_CASE("check_ctr_examples_fit refuses what this machine cannot hold", "[ctr][reader]") {
  CHECK_NOTHROW(ps::check_ctr_examples_fit(1000000, 600, "a million"));
  CHECK_THROWS_WITH(ps::check_ctr_examples_fit(int64_t{1} << 50, 0, "--synthetic 2^50"),
                    Catch::Matches("--synthetic 2\\^50: 1125899906842624 examples need "
                                   "261208778.4 GB in memory, more than this machine's .* GB"));
}

TEST_CASE("CtrShareStream: a worker's share batch by batch, as read_ctr_share holds it",
          "[ctr][reader][share]") {
  for (const bool csv : {false, true}) {
    const TempFile f(numbered_lines(50, csv));
    for (const int workers : {1, 3}) {
      for (const std::size_t batch : {std::size_t{1}, std::size_t{4}, std::size_t{7}}) {
        INFO("csv " << csv << " workers " << workers << " batch " << batch);
        ps::CtrShareOptions o;
        o.worker = workers - 1;
        o.workers = workers;
        o.holdout = 0.2;
        const ps::CtrShare held = ps::read_ctr_share(f.path, o);  // 40 training examples
        REQUIRE(held.train_end == 40);
        ps::CtrShareStream stream(f.path, o.worker, workers, held.train_end);
        REQUIRE(stream.share_size() == static_cast<int64_t>(held.train.size()));
        // Three passes: batches run through the share, the last one of a pass cut
        // short, then from its start again, as the trainer's in-memory loop.
        std::vector<ps::CtrExample> got;
        std::size_t cursor = 0;
        for (int k = 0; k < 3 * 40; ++k) {
          stream.next(batch, got);
          const std::size_t want = std::min(batch, held.train.size() - cursor);
          REQUIRE(got.size() == want);
          for (std::size_t j = 0; j < want; ++j)
            CHECK(number_of(got[j], csv) == number_of(held.train[cursor + j], csv));
          cursor = cursor + want == held.train.size() ? 0 : cursor + want;
        }
      }
    }
  }
  // A file that no longer holds the count it had: said, not looped over.
  const TempFile f(numbered_lines(10, false));
  ps::CtrShareStream stream(f.path, 0, 1, 20);
  std::vector<ps::CtrExample> got;
  CHECK_THROWS_WITH(stream.next(20, got), Catch::Contains("ended after 10 examples, 20 expected"));
  CHECK_THROWS_AS(ps::CtrShareStream(f.path, 2, 2, 10), ps::ConfigError);
  CHECK_THROWS_WITH(ps::CtrShareStream(f.path, 1, 2, 1), Catch::Contains("no training examples"));
}

TEST_CASE("CtrReader reads gzip-compressed files as downloaded, and says when one is cut short",
          "[ctr][reader][gzip]") {
  const std::string text = numbered_lines(3000, true);  // a CSV: its header first
  const TempFile plain(text);
  const TempFile gz("");
  {
    gzFile out = gzopen(gz.path.c_str(), "wb");
    REQUIRE(out != nullptr);
    REQUIRE(gzwrite(out, text.data(), static_cast<unsigned>(text.size())) ==
            static_cast<int>(text.size()));
    REQUIRE(gzclose(out) == Z_OK);
  }
  const auto a = ps::read_ctr_file(plain.path), b = ps::read_ctr_file(gz.path);
  REQUIRE(a.size() == 3000);
  REQUIRE(b.size() == 3000);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(number_of(b[i], true) == static_cast<int64_t>(i));
    CHECK(b[i].label == a[i].label);
    CHECK(b[i].categorical == a[i].categorical);
  }
  ps::CtrReader r(gz.path);
  CHECK(r.file_bytes() == std::filesystem::file_size(gz.path));
  while (r.skip()) {
  }
  CHECK(r.bytes_read() == r.file_bytes());

  // The compressed file cut short: a read error naming the line, not a silent end.
  std::ifstream in(gz.path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const TempFile cut(bytes.substr(0, bytes.size() / 2));
  CHECK_THROWS_WITH(ps::read_ctr_file(cut.path),
                    Catch::Matches(".*:\\d+: read error: unexpected end of file"));

  // A file without line ends (not click data) is refused, not read into memory whole.
  const TempFile binary(std::string(3 << 20, 'x'));
  CHECK_THROWS_WITH(ps::read_ctr_file(binary.path),
                    Catch::Contains(":1: a line of more than 1 MiB: not click data?"));
}

TEST_CASE("CtrReader: a NUL byte is refused; a byte order mark and a repeated header are skipped",
          "[ctr][reader][csv]") {
  const std::string row = "1,14102100,abc\n", header = "click,hour,site\n";
  const TempFile nul(header + row +
                     std::string("0,1410210\0"
                                 "0,x\n",
                                 16) +
                     row);
  CHECK_THROWS_WITH(ps::read_ctr_file(nul.path), Catch::Contains(":3: a NUL byte"));
  const TempFile nul_line(header + row + std::string(4, '\0') + "\n" + row);
  CHECK_THROWS_WITH(ps::read_ctr_file(nul_line.path), Catch::Contains(":3: a NUL byte"));

  const TempFile plain(header + row + "0,14102101,xyz\n");
  const TempFile bom("\xEF\xBB\xBF" + header + row + "0,14102101,xyz\n");
  const auto a = ps::read_ctr_file(plain.path), b = ps::read_ctr_file(bom.path);
  REQUIRE(b.size() == 2);
  for (int i = 0; i < 2; ++i) CHECK(b[i].categorical == a[i].categorical);
  CHECK(b[0].categorical[0] == ps::ctr_text_value("abc"));

  // Two files joined by cat: the second header is no example, for the count too.
  const TempFile joined(header + row + header + row + row);
  CHECK(ps::read_ctr_file(joined.path).size() == 3);
  ps::CtrShareOptions o;
  o.holdout = 0.5;
  o.keep_train = false;  // nothing kept: the count alone
  const ps::CtrShare counted = ps::read_ctr_share(joined.path, o);
  CHECK(counted.examples == 3);
  CHECK(counted.train_end == 1);  // 3 - round(1.5), as CtrSynthetic splits
  CHECK(counted.train.empty());
  CHECK(counted.holdout.empty());
}

TEST_CASE("read_ctr_share and CtrShareStream: a file that changes under them is said",
          "[ctr][reader][share]") {
  // Large enough that the cut lies past what the reader's buffers hold (1 MiB at most).
  const std::string big = numbered_lines(100000, false);
  const TempFile f(big);
  ps::CtrShareOptions o;
  o.holdout = 0.1;
  o.progress_seconds = 0;
  bool cut = false;
  o.progress = [&](const std::string& doing, uint64_t, uint64_t) {
    if (doing == "reading" && !cut) {
      // Cut after example 59999 (2.9 MB in): examples 0..59999 remain.
      std::filesystem::resize_file(f.path, big.find("\n0\t60000\t") + 1);
      cut = true;
    }
  };
  CHECK_THROWS_WITH(
      ps::read_ctr_share(f.path, o),
      Catch::EndsWith(": ended after 60000 examples, 100000 counted (did it change?)"));
  CHECK(cut);

  // A stream that met a bad line starts its share over on the next call.
  std::string text = numbered_lines(10, false);
  text.replace(text.find("\n0\t4\t") + 1, 1, "x");  // example 4 is malformed
  const TempFile bad(text);
  ps::CtrShareStream stream(bad.path, 0, 1, 10);
  std::vector<ps::CtrExample> got;
  CHECK_THROWS_WITH(stream.next(8, got), Catch::Contains(":6: label"));
  CHECK(got.empty());
  stream.next(3, got);
  REQUIRE(got.size() == 3);
  CHECK(number_of(got[0], false) == 0);
}

namespace {

// A tar member (ustar header, then the content in whole 512-byte blocks); its
// size in base-256 (GNU, as for members of 8 GiB and more) when asked.
std::string tar_member(const std::string& name, const std::string& content, bool base256 = false) {
  std::array<char, 512> h{};
  std::snprintf(h.data(), 100, "%s", name.c_str());
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  if (base256) {
    h[124] = static_cast<char>(0x80);
    for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>((content.size() >> (8 * i)) & 0xff);
  } else {
    std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(content.size()));
  }
  h[156] = '0';
  std::memcpy(h.data() + 257,
              "ustar\0"
              "00",
              8);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (const char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  std::string out(h.data(), h.size());
  out += content;
  out.append((512 - content.size() % 512) % 512, '\0');
  return out;
}

std::string gzipped(const std::string& bytes, const std::string& path) {
  gzFile out = gzopen(path.c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(out) == Z_OK);
  return path;
}

}  // namespace

TEST_CASE("CtrReader reads a tar archive's training member (Criteo's dac.tar.gz as downloaded)",
          "[ctr][reader][tar]") {
  const std::string text = numbered_lines(5000, false);
  const std::string end(1024, '\0');
  const std::string archive = tar_member("readme.txt", "Criteo's display-ads data\n") +
                              tar_member("dac/train.txt", text) +
                              tar_member("test.txt", "not this\n") + end;
  const TempFile plain(text), tar(archive), tgz("");
  gzipped(archive, tgz.path);
  const auto want = ps::read_ctr_file(plain.path);
  REQUIRE(want.size() == 5000);
  for (const std::string& path : {tar.path, tgz.path}) {
    INFO(path);
    const auto got = ps::read_ctr_file(path);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(number_of(got[i], false) == int64_t(i));
    ps::CtrShareOptions o;
    o.worker = 1;
    o.workers = 2;
    o.holdout = 0.1;
    const ps::CtrShare share = ps::read_ctr_share(path, o);
    CHECK(share.examples == 5000);
    CHECK(share.train.size() == 2250);
    CHECK(number_of(share.train.back(), false) == 4499);
  }
  // A member of 8 GiB or more has its size in base-256.
  const TempFile big_size(tar_member("train.csv", "click,site\n1,a\n0,b\n", true) + end);
  CHECK(ps::read_ctr_file(big_size.path).size() == 2);

  const TempFile no_train(tar_member("readme.txt", "x\n") + tar_member("test.txt", "y\n") + end);
  CHECK_THROWS_WITH(ps::read_ctr_file(no_train.path),
                    Catch::Contains("a tar archive without a train.txt, train.csv or train.tsv in "
                                    "it (it holds: readme.txt, test.txt)"));
  const std::string member = tar_member("train.txt", text);
  const TempFile cut(member.substr(0, member.size() / 2));
  CHECK_THROWS_WITH(ps::read_ctr_file(cut.path),
                    Catch::Contains("the tar archive ends inside its member"));
  const TempFile cut_before(tar_member("readme.txt", std::string(5000, 'x')).substr(0, 2000));
  CHECK_THROWS_WITH(ps::read_ctr_file(cut_before.path),
                    Catch::Contains("the tar archive ends inside 'readme.txt'"));
}
