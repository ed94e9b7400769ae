// The planted-model click generator (contract in ps/ctr_synthetic.h).
#include "ps/ctr_synthetic.h"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "client/trainer/hash_mix.h"
#include "client/trainer/zipf.h"
#include "ps/binary_metrics.h"
#include "ps/errors.h"

namespace ps {
namespace {

using detail::mix64;
using detail::unit_double;

// Salts of the hash streams, so that no two quantities share one.
constexpr uint64_t kExampleSalt = 0x01;
constexpr uint64_t kBijectionSalt = 0x02;
constexpr uint64_t kWeightSalt = 0x03;
constexpr uint64_t kDenseSalt = 0x04;
constexpr uint64_t kCrossSalt = 0x05;

uint64_t key(uint64_t seed, uint64_t salt, uint64_t a) {
  return mix64(mix64(seed ^ mix64(salt)) ^ a);
}

// A standard normal fixed by h (Box-Muller).
double hash_normal(uint64_t h) {
  const double u1 = unit_double(mix64(h)), u2 = unit_double(mix64(h ^ 0xA5A5A5A5A5A5A5A5ull));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// The uniform stream of one example.
class ExampleRng {
 public:
  explicit ExampleRng(uint64_t state) : state_(state) {}
  double uniform() { return unit_double(mix64(state_ += 0x9E3779B97F4A7C15ull)); }
  double normal() {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * std::numbers::pi * uniform());
  }

 private:
  uint64_t state_;
};

// The inverse of an odd a mod 2^32 (Newton: each step doubles the correct bits).
uint32_t inverse_mod_2_32(uint32_t a) {
  uint32_t x = a;  // right to 3 bits for odd a
  for (int i = 0; i < 5; ++i) x *= 2u - a * x;
  return x;
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

void CtrSyntheticOptions::validate() const {
  const auto bad = [](const std::string& why) { throw ConfigError("synthetic CTR data: " + why); };
  if (examples < 1) bad(fmt::format("examples must be >= 1, got {}", examples));
  if (!(holdout_fraction >= 0 && holdout_fraction < 1))
    bad(fmt::format("holdout fraction must be in [0, 1), got {}", holdout_fraction));
  if (min_distinct < 1 || max_distinct < min_distinct || max_distinct > (int64_t{1} << 32) - 1)
    bad(fmt::format("distinct values per field must satisfy 1 <= min ({}) <= max ({}) < 2^32",
                    min_distinct, max_distinct));
  if (!(zipf_exponent > 0 && zipf_exponent <= 10))
    bad(fmt::format("zipf exponent must be in (0, 10], got {}", zipf_exponent));
  if (!(missing_rate >= 0 && missing_rate < 1))
    bad(fmt::format("missing rate must be in [0, 1), got {}", missing_rate));
  for (double v : {bias, weight_scale, weight_decay, dense_weight_scale, cross_weight_scale})
    if (!std::isfinite(v)) bad("weights must be finite");
  if (weight_scale < 0 || weight_decay < 0 || dense_weight_scale < 0 || cross_weight_scale < 0)
    bad("weight scales and decay must be >= 0");
  if (categorical_fields < 1 || categorical_fields > kCtrCategorical)
    bad(fmt::format("categorical fields must be in [1, {}], got {}", kCtrCategorical,
                    categorical_fields));
  if (dense_fields < 0 || dense_fields > kCtrDense)
    bad(fmt::format("dense fields must be in [0, {}], got {}", kCtrDense, dense_fields));
  for (const FieldCross& c : crosses)
    if (c.a < 0 || c.a >= categorical_fields || c.b < 0 || c.b >= categorical_fields || c.a == c.b)
      bad(fmt::format("cross ({}, {}) must name two different fields in [0, {})", c.a, c.b,
                      categorical_fields));
}

CtrSynthetic::CtrSynthetic(const CtrSyntheticOptions& options) : options_(options) {
  options_.validate();
  holdout_begin_ =
      options_.examples -
      static_cast<int64_t>(std::llround(options_.examples * options_.holdout_fraction));
  const double ratio =
      static_cast<double>(options_.max_distinct) / static_cast<double>(options_.min_distinct);
  for (int f = 0; f < kCtrCategorical; ++f) {
    distinct_.push_back(
        std::llround(options_.min_distinct * std::pow(ratio, f / double(kCtrCategorical - 1))));
    const uint64_t h = key(options_.seed, kBijectionSalt, f);
    mult_.push_back(static_cast<uint32_t>(h) | 1u);
    mult_inv_.push_back(inverse_mod_2_32(mult_.back()));
    offset_.push_back(static_cast<uint32_t>(h >> 32));
  }
  for (int j = 0; j < kCtrDense; ++j)
    dense_weight_.push_back(options_.dense_weight_scale *
                            hash_normal(key(options_.seed, kDenseSalt, j)));
}

uint32_t CtrSynthetic::value_of(int field, int64_t rank) const {
  return static_cast<uint32_t>(rank) * mult_.at(field) + offset_.at(field);
}

int64_t CtrSynthetic::rank_of(int field, uint32_t value) const {
  const int64_t rank = static_cast<uint32_t>((value - offset_.at(field)) * mult_inv_.at(field));
  return rank >= 1 && rank <= distinct_.at(field) ? rank : 0;
}

double CtrSynthetic::value_weight(uint64_t salt, int64_t rank) const {
  return std::pow(static_cast<double>(rank), -options_.weight_decay) *
         hash_normal(mix64(salt ^ rank));
}

double CtrSynthetic::planted_probability(const CtrExample& e) const {
  double logit = options_.bias;
  std::array<int64_t, kCtrCategorical> rank{};
  for (int f = 0; f < kCtrCategorical; ++f) {
    rank[f] = e.categorical_present[f] ? rank_of(f, e.categorical[f]) : 0;
    if (rank[f] > 0)
      logit += options_.weight_scale * value_weight(key(options_.seed, kWeightSalt, f), rank[f]);
  }
  for (int j = 0; j < kCtrDense; ++j)
    if (e.dense_present[j]) {
      const double x = static_cast<double>(e.dense[j]);
      logit += dense_weight_[j] * std::copysign(std::log1p(std::fabs(x)), x);
    }
  for (const FieldCross& c : options_.crosses)
    if (rank[c.a] > 0 && rank[c.b] > 0) {
      const uint64_t salt =
          key(options_.seed, kCrossSalt, static_cast<uint64_t>(c.a) * kCtrCategorical + c.b);
      logit += options_.cross_weight_scale *
               value_weight(mix64(salt ^ static_cast<uint64_t>(rank[c.a])), rank[c.b]) *
               std::pow(static_cast<double>(rank[c.a]), -options_.weight_decay);
    }
  return sigmoid(logit);
}

double CtrSynthetic::example(int64_t i, CtrExample& out) const {
  if (i < 0 || i >= options_.examples)
    throw Error(
        fmt::format("synthetic CTR data: example {} outside [0, {})", i, options_.examples));
  ExampleRng rng(key(options_.seed, kExampleSalt, static_cast<uint64_t>(i)));
  const auto uniform = [&] { return rng.uniform(); };
  for (int j = 0; j < kCtrDense; ++j) {
    out.dense_present[j] = rng.uniform() >= options_.missing_rate && j < options_.dense_fields;
    // Counts spread over a few orders of magnitude, some -1 as in Criteo's I2.
    out.dense[j] =
        out.dense_present[j]
            ? static_cast<int64_t>(std::floor(std::exp(0.3 * j + 1.2 * rng.normal()))) - 1
            : 0;
  }
  for (int f = 0; f < kCtrCategorical; ++f) {
    out.categorical_present[f] =
        rng.uniform() >= options_.missing_rate && f < options_.categorical_fields;
    // A sampler is two divisions and a few logs to set up: cheaper than keeping 26.
    out.categorical[f] =
        out.categorical_present[f]
            ? value_of(f, detail::ZipfSampler(distinct_[f], options_.zipf_exponent).sample(uniform))
            : 0;
  }
  const double p = planted_probability(out);
  out.label = rng.uniform() < p ? 1.0f : 0.0f;
  return p;
}

namespace {

// Avazu's train.csv header, and its categorical columns' count.
constexpr const char* kAvazuHeader =
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
    "app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,"
    "C18,C19,C20,C21";
constexpr int kAvazuCategorical = 21;

// Example i of n as a line of Avazu's train.csv; its hour one of 240, from
// 2014-10-21 00h to 2014-10-30 23h, in order (as Avazu's ten days).
void append_avazu_line(int64_t i, int64_t n, const CtrExample& e, std::string& out) {
  const int64_t hour = i * 240 / n;
  fmt::format_to(std::back_inserter(out), "{},{},1410{:02}{:02}", i, e.label > 0.5f ? 1 : 0,
                 21 + hour / 24, hour % 24);
  for (int f = 0; f < kAvazuCategorical; ++f) {
    out += ',';
    if (e.categorical_present[f])
      fmt::format_to(std::back_inserter(out), "{:08x}", e.categorical[f]);
  }
}

}  // namespace

CtrPlantedStats write_ctr_synthetic(const CtrSynthetic& generator, std::ostream& out,
                                    CtrFileLayout layout) {
  const int64_t n = generator.options().examples;
  const bool avazu = layout == CtrFileLayout::kAvazuCsv;
  if (avazu && (generator.options().categorical_fields > kAvazuCategorical ||
                generator.options().dense_fields > 0)) {
    throw ConfigError(fmt::format(
        "synthetic CTR data: Avazu's layout carries {} categorical fields and no dense ones; the "
        "generator draws {} and {}",
        kAvazuCategorical, generator.options().categorical_fields,
        generator.options().dense_fields));
  }
  CtrPlantedStats s;
  s.examples = n;
  s.holdout = n - generator.holdout_begin();
  std::vector<float> labels;
  std::vector<double> probs;
  labels.reserve(s.holdout);
  probs.reserve(s.holdout);
  double train_clicks = 0;
  std::string chunk = avazu ? std::string(kAvazuHeader) + "\n" : std::string();
  CtrExample e;
  for (int64_t i = 0; i < n; ++i) {
    const double p = generator.example(i, e);
    if (i < generator.holdout_begin()) {
      train_clicks += e.label;
    } else {
      labels.push_back(e.label);
      probs.push_back(p);
    }
    if (avazu)
      append_avazu_line(i, n, e, chunk);
    else
      chunk += format_ctr_line(e);
    chunk += '\n';
    if (chunk.size() >= (1u << 20) || i + 1 == n) {
      out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      chunk.clear();
    }
  }
  out.flush();
  if (!out) throw Error("synthetic CTR data: writing the examples failed");
  const int64_t train = n - s.holdout;
  s.train_ctr = train ? train_clicks / static_cast<double>(train) : 0.0;
  if (s.holdout > 0) {
    double clicks = 0;
    for (float y : labels) clicks += y;
    s.holdout_ctr = clicks / static_cast<double>(s.holdout);
    s.holdout_log_loss = log_loss(labels, probs);
    s.holdout_auc = roc_auc(labels, probs);
  }
  return s;
}

}  // namespace ps
