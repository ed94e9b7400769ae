// Feature ids and dense transforms of CTR examples (contract in ps/ctr_data.h).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "client/trainer/hash_mix.h"
#include "ps/ctr_data.h"
#include "ps/errors.h"

namespace ps {
namespace {

// Distinct salts keep single-field ids and cross ids apart.
constexpr uint64_t kSingleSalt = 0x63747266'65617431ull;  // "ctrfeat1"
constexpr uint64_t kCrossSalt = 0x63747263'726f7331ull;   // "ctrcros1"

uint64_t value_of(int field, const CtrExample& e) {
  return e.categorical_present[field] ? e.categorical[field] : kCtrMissing;
}

void check_field(int field, const char* what) {
  if (field < 0 || field >= kCtrCategorical)
    throw Error(
        fmt::format("{}: categorical field {} outside [0, {})", what, field, kCtrCategorical));
}

}  // namespace

uint64_t ctr_hash_feature(int field, uint64_t value) {
  check_field(field, "ctr_hash_feature");
  return detail::mix64(detail::mix64(kSingleSalt + static_cast<uint64_t>(field)) ^ value);
}

uint64_t ctr_feature_id(int field, const CtrExample& e) {
  check_field(field, "ctr_feature_id");
  return ctr_hash_feature(field, value_of(field, e));
}

uint64_t ctr_cross_id(int a, int b, const CtrExample& e) {
  check_field(a, "ctr_cross_id");
  check_field(b, "ctr_cross_id");
  const uint64_t pair = detail::mix64(kCrossSalt + static_cast<uint64_t>(a) * kCtrCategorical + b);
  return detail::mix64(detail::mix64(pair ^ value_of(a, e)) ^ value_of(b, e));
}

std::vector<FieldCross> default_ctr_crosses() {
  std::vector<FieldCross> crosses;
  for (int a = 0; a + 1 < kCtrCategorical; a += 2) crosses.push_back({a, a + 1});
  return crosses;
}

void ctr_categorical_ids(const CtrExample& e, std::span<uint64_t> ids) {
  if (ids.size() != kCtrCategorical)
    throw Error(
        fmt::format("ctr_categorical_ids: {} slots given, {} needed", ids.size(), kCtrCategorical));
  for (int f = 0; f < kCtrCategorical; ++f) ids[f] = ctr_hash_feature(f, value_of(f, e));
}

void ctr_dense_features(const CtrExample& e, std::span<float> out) {
  if (out.size() != kCtrDense)
    throw Error(
        fmt::format("ctr_dense_features: {} slots given, {} needed", out.size(), kCtrDense));
  for (int j = 0; j < kCtrDense; ++j) {
    const double x = static_cast<double>(e.dense[j]);
    out[j] =
        e.dense_present[j] ? static_cast<float>(std::copysign(std::log1p(std::fabs(x)), x)) : 0.0f;
  }
}

void ctr_wide_ids(const CtrExample& e, std::span<const FieldCross> crosses,
                  std::vector<uint64_t>& ids) {
  ids.resize(kCtrCategorical + crosses.size());
  ctr_categorical_ids(e, std::span<uint64_t>(ids).first(kCtrCategorical));
  for (size_t c = 0; c < crosses.size(); ++c)
    ids[kCtrCategorical + c] = ctr_cross_id(crosses[c].a, crosses[c].b, e);
}

void make_ctr_batch(std::span<const CtrExample> examples, std::span<const FieldCross> crosses,
                    CtrBatch& batch) {
  const size_t n = examples.size(), wide = kCtrCategorical + crosses.size();
  batch.size = static_cast<int64_t>(n);
  batch.labels.resize(n);
  batch.dense.resize(n * kCtrDense);
  batch.ids.resize(n * kCtrCategorical);
  batch.wide_ids.resize(n * wide);
  std::vector<uint64_t> w;
  for (size_t i = 0; i < n; ++i) {
    const CtrExample& e = examples[i];
    batch.labels[i] = e.label;
    ctr_dense_features(e, std::span<float>(batch.dense).subspan(i * kCtrDense, kCtrDense));
    ctr_categorical_ids(
        e, std::span<uint64_t>(batch.ids).subspan(i * kCtrCategorical, kCtrCategorical));
    ctr_wide_ids(e, crosses, w);
    std::copy(w.begin(), w.end(), batch.wide_ids.begin() + static_cast<std::ptrdiff_t>(i * wide));
  }
}

}  // namespace ps
