// Shared checks of an embedding-bag implementation (CPU or CUDA) against a
// float64 reference in plain loops over the raw (not deduplicated) ids.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "ps/embedding_bag.h"
#include "ps/errors.h"

namespace emb_test {

using Forward = std::function<void(std::span<const float>, int, std::span<const int64_t>,
                                   std::span<const int32_t>, ps::BagCombiner, std::span<float>)>;
using Backward = Forward;  // (grad_out, dim, offsets, index, combiner, grad_rows)

// A batch of bags over raw 64-bit ids drawn from a small pool, so ids repeat
// inside a bag and across bags; some bags are empty.
struct Batch {
  int dim = 0;
  std::vector<int64_t> offsets;                  // (N + 1)
  std::vector<uint64_t> ids;                     // (nnz)
  std::map<uint64_t, std::vector<float>> table;  // id -> row (D)
};

inline Batch random_batch(int bags, int dim, int pool, int max_bag, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  b.dim = dim;
  b.offsets.push_back(0);
  std::uniform_int_distribution<int> size(0, max_bag);
  std::uniform_int_distribution<uint64_t> pick(0, pool - 1);
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (int n = 0; n < bags; ++n) {
    const int s = size(rng);
    for (int k = 0; k < s; ++k)
      b.ids.push_back(pick(rng) * 0x9E3779B97F4A7C15ull + 12345);  // any 64-bit ids
    b.offsets.push_back(static_cast<int64_t>(b.ids.size()));
  }
  for (uint64_t id : b.ids)
    if (!b.table.count(id)) {
      std::vector<float> row(dim);
      for (float& v : row) v = value(rng);
      b.table[id] = row;
    }
  return b;
}

inline double ref_scale(ps::BagCombiner c, int64_t count) {
  return c == ps::BagCombiner::kMean && count > 0 ? 1.0 / count : 1.0;
}

// out (N, D) in float64, from the table by raw id.
inline std::vector<double> ref_forward(const Batch& b, ps::BagCombiner c) {
  const size_t bags = b.offsets.size() - 1;
  std::vector<double> out(bags * b.dim, 0.0);
  for (size_t n = 0; n < bags; ++n) {
    for (int64_t j = b.offsets[n]; j < b.offsets[n + 1]; ++j)
      for (int d = 0; d < b.dim; ++d) out[n * b.dim + d] += b.table.at(b.ids[j])[d];
    for (int d = 0; d < b.dim; ++d)
      out[n * b.dim + d] *= ref_scale(c, b.offsets[n + 1] - b.offsets[n]);
  }
  return out;
}

// id -> summed gradient (D) in float64, one entry per occurrence accumulated.
inline std::map<uint64_t, std::vector<double>> ref_backward(const Batch& b,
                                                            const std::vector<float>& grad_out,
                                                            ps::BagCombiner c) {
  std::map<uint64_t, std::vector<double>> g;
  for (size_t n = 0; n + 1 < b.offsets.size(); ++n)
    for (int64_t j = b.offsets[n]; j < b.offsets[n + 1]; ++j) {
      auto& row = g.try_emplace(b.ids[j], std::vector<double>(b.dim, 0.0)).first->second;
      for (int d = 0; d < b.dim; ++d)
        row[d] += grad_out[n * b.dim + d] * ref_scale(c, b.offsets[n + 1] - b.offsets[n]);
    }
  return g;
}

// Forward and backward through dedup_ids, compared with the reference.
inline void check_against_reference(const Forward& forward, const Backward& backward, int bags,
                                    int dim, int pool, int max_bag, uint64_t seed) {
  const Batch b = random_batch(bags, dim, pool, max_bag, seed);
  const ps::UniqueIds u = ps::dedup_ids(b.ids);
  std::vector<float> rows(u.ids.size() * dim);  // (U, D): what a pull_rows would fill
  for (size_t r = 0; r < u.ids.size(); ++r)
    std::copy_n(b.table.at(u.ids[r]).begin(), dim, rows.begin() + r * dim);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> grad_out(static_cast<size_t>(bags) * dim);  // (N, D)
  for (float& v : grad_out) v = value(rng);

  for (ps::BagCombiner c : {ps::BagCombiner::kSum, ps::BagCombiner::kMean}) {
    INFO("bags " << bags << " dim " << dim << " pool " << pool << " combiner "
                 << static_cast<int>(c));
    std::vector<float> out(static_cast<size_t>(bags) * dim,
                           std::numeric_limits<float>::quiet_NaN());
    forward(rows, dim, b.offsets, u.index, c, out);
    const std::vector<double> want = ref_forward(b, c);
    for (size_t i = 0; i < out.size(); ++i)
      REQUIRE(out[i] == Approx(want[i]).margin(1e-5).epsilon(1e-5));

    std::vector<float> grad_rows(rows.size(), std::numeric_limits<float>::quiet_NaN());
    backward(grad_out, dim, b.offsets, u.index, c, grad_rows);
    const auto want_g = ref_backward(b, grad_out, c);
    REQUIRE(want_g.size() == u.ids.size());  // every unique id got exactly one row
    for (size_t r = 0; r < u.ids.size(); ++r)
      for (int d = 0; d < dim; ++d)
        REQUIRE(grad_rows[r * dim + d] ==
                Approx(want_g.at(u.ids[r])[d]).margin(1e-5).epsilon(1e-5));
  }
}

// Each bad argument throws ps::Error and leaves the output as it was.
inline void check_bad_input(const Forward& forward, const Backward& backward) {
  const int D = 4;
  const std::vector<float> rows(3 * D, 1.0f);  // U = 3
  const std::vector<int64_t> offsets{0, 2, 3};
  const std::vector<int32_t> index{0, 2, 1};
  const auto expect_refused = [&](std::span<const float> table, int dim, std::span<const int64_t> o,
                                  std::span<const int32_t> i, size_t out_floats) {
    std::vector<float> out(out_floats, -7.0f);
    CHECK_THROWS_AS(forward(table, dim, o, i, ps::BagCombiner::kSum, out), ps::Error);
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == -7.0f; }));
    // Backward: the table buffer is the output.
    std::vector<float> grad_rows(table.size(), -7.0f);
    std::vector<float> grad_out(out_floats, 1.0f);
    CHECK_THROWS_AS(backward(grad_out, dim, o, i, ps::BagCombiner::kSum, grad_rows), ps::Error);
    CHECK(std::all_of(grad_rows.begin(), grad_rows.end(), [](float v) { return v == -7.0f; }));
  };
  expect_refused(rows, D, offsets, std::vector<int32_t>{0, 3, 1}, 2 * D);   // index past the rows
  expect_refused(rows, D, offsets, std::vector<int32_t>{0, -1, 1}, 2 * D);  // negative index
  expect_refused(rows, D, std::vector<int64_t>{1, 2, 3}, index, 2 * D);     // offsets[0] != 0
  expect_refused(rows, D, std::vector<int64_t>{0, 3, 2}, index, 2 * D);     // decreasing
  expect_refused(rows, D, std::vector<int64_t>{0, 1, 2}, index, 2 * D);  // ends before index does
  expect_refused(rows, D, std::vector<int64_t>{}, index, 0);             // no offsets at all
  expect_refused(rows, D, offsets, index, 2 * D + 1);                    // output size
  expect_refused(std::vector<float>(3 * D + 1, 1.0f), D, offsets, index,
                 2 * D);                       // rows not a multiple of D
  expect_refused(rows, 0, offsets, index, 0);  // dim 0
}

}  // namespace emb_test
