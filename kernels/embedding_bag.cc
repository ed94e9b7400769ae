// Embedding bags on the CPU (Eigen row maps), the shared argument checks, id
// deduplication, and the CudaEmbeddingBag stand-in of a build without CUDA.
#include "ps/embedding_bag.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <Eigen/Core>
#include <fmt/format.h>

#include "common/first_positions.h"
#include "ps/errors.h"
#include "ps_config.h"

namespace ps {
namespace detail {

void check_embedding_bag_args(size_t table_floats, int dim, std::span<const int64_t> offsets,
                              std::span<const int32_t> index, size_t bag_floats, const char* what) {
  if (dim < 1) throw Error(fmt::format("{}: dim must be >= 1, got {}", what, dim));
  if (offsets.empty())
    throw Error(fmt::format("{}: offsets must hold bags + 1 entries, got none", what));
  if (table_floats % dim != 0)
    throw Error(fmt::format("{}: table buffer of {} floats is not a whole number of rows of dim {}",
                            what, table_floats, dim));
  const size_t bags = offsets.size() - 1;
  if (bag_floats != bags * dim)
    throw Error(fmt::format("{}: bag buffer holds {} floats, {} bags x dim {} need {}", what,
                            bag_floats, bags, dim, bags * dim));
  if (offsets.front() != 0)
    throw Error(fmt::format("{}: offsets[0] must be 0, got {}", what, offsets.front()));
  // Each check is a pass without branches (it vectorises), then, only when
  // it failed, a second pass that finds the first bad entry for the message.
  bool decreasing = false;
  for (size_t n = 0; n < bags; ++n) decreasing |= offsets[n + 1] < offsets[n];
  for (size_t n = 0; decreasing && n < bags; ++n)
    if (offsets[n + 1] < offsets[n])
      throw Error(fmt::format("{}: offsets decrease at bag {} ({} -> {})", what, n, offsets[n],
                              offsets[n + 1]));
  if (offsets.back() != static_cast<int64_t>(index.size()))
    throw Error(fmt::format("{}: offsets end at {} but index holds {} entries", what,
                            offsets.back(), index.size()));
  const int64_t rows = static_cast<int64_t>(table_floats / dim);
  // As unsigned, a negative index is larger than any row count.
  const auto limit = static_cast<uint32_t>(std::min<int64_t>(rows, INT32_MAX));
  bool outside = false;
  for (size_t j = 0; j < index.size(); ++j) outside |= static_cast<uint32_t>(index[j]) >= limit;
  for (size_t j = 0; outside && j < index.size(); ++j)
    if (index[j] < 0 || index[j] >= rows)
      throw Error(
          fmt::format("{}: index[{}] = {} is outside the {} rows", what, j, index[j], rows));
}

}  // namespace detail

namespace {

float bag_scale(BagCombiner combiner, int64_t count) {
  return combiner == BagCombiner::kMean && count > 0 ? 1.0f / static_cast<float>(count) : 1.0f;
}

// Calls f with the row size as a compile-time constant for the sizes tables
// use most (Eigen then unrolls a row into a few vector instructions), or 0
// for any other: the row loops below cost several times as much with the
// size known only at run time.
template <class F>
void with_dim(int dim, F&& f) {
  switch (dim) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    default:
      return f(std::integral_constant<int, 0>{});
  }
}

// A row of D floats (D == 0: of dim floats, known at run time).
template <int D>
using RowVector = Eigen::Matrix<float, D == 0 ? Eigen::Dynamic : D, 1>;

template <int D>
void forward_bags(const float* rows, int dim, std::span<const int64_t> offsets,
                  std::span<const int32_t> index, BagCombiner combiner, float* out) {
  using ConstRow = Eigen::Map<const RowVector<D>>;
  using Row = Eigen::Map<RowVector<D>>;
  const int d = D == 0 ? dim : D;
  const size_t bags = offsets.size() - 1;
  for (size_t n = 0; n < bags; ++n) {
    const int64_t lo = offsets[n], hi = offsets[n + 1];
    float* const y = out + n * d;
    if (hi - lo == 1) {  // one row: its sum and its mean are the row itself
      std::memcpy(y, rows + size_t(index[lo]) * d, d * sizeof(float));
      continue;
    }
    Row sum(y, d);  // (D)
    sum.setZero();
    for (int64_t j = lo; j < hi; ++j) sum += ConstRow(rows + size_t(index[j]) * d, d);
    if (combiner == BagCombiner::kMean) sum *= bag_scale(combiner, hi - lo);
  }
}

template <int D>
void backward_bags(const float* grad_out, int dim, std::span<const int64_t> offsets,
                   std::span<const int32_t> index, BagCombiner combiner, float* grad_rows) {
  using ConstRow = Eigen::Map<const RowVector<D>>;
  using Row = Eigen::Map<RowVector<D>>;
  const int d = D == 0 ? dim : D;
  const size_t bags = offsets.size() - 1;
  for (size_t n = 0; n < bags; ++n) {
    const int64_t lo = offsets[n], hi = offsets[n + 1];
    const ConstRow g(grad_out + n * d, d);  // (D)
    if (combiner == BagCombiner::kMean && hi - lo > 1) {
      const float scale = bag_scale(combiner, hi - lo);
      for (int64_t j = lo; j < hi; ++j) Row(grad_rows + size_t(index[j]) * d, d) += scale * g;
    } else {
      for (int64_t j = lo; j < hi; ++j) Row(grad_rows + size_t(index[j]) * d, d) += g;
    }
  }
}

}  // namespace

void dedup_ids_into(std::span<const uint64_t> ids, UniqueIds& u) {
  u.index.resize(ids.size());
  // Kept per thread, so that a batch like the one before it allocates
  // nothing (a node-based map cost a malloc per distinct id).
  thread_local FirstPositions seen;
  distinct_keys(ids, seen, u.ids, u.index.data());
}

UniqueIds dedup_ids(std::span<const uint64_t> ids) {
  UniqueIds u;
  dedup_ids_into(ids, u);
  return u;
}

std::vector<int64_t> fixed_offsets(int64_t bags, int per_bag) {
  if (bags < 0 || per_bag < 0)
    throw Error(fmt::format("fixed_offsets: bags {} and per_bag {} must be >= 0", bags, per_bag));
  std::vector<int64_t> offsets(bags + 1);
  for (int64_t n = 0; n <= bags; ++n) offsets[n] = n * per_bag;
  return offsets;
}

void embedding_bag_forward(std::span<const float> rows, int dim, std::span<const int64_t> offsets,
                           std::span<const int32_t> index, BagCombiner combiner,
                           std::span<float> out) {
  detail::check_embedding_bag_args(rows.size(), dim, offsets, index, out.size(),
                                   "embedding_bag_forward");
  with_dim(dim, [&](auto d) {
    forward_bags<decltype(d)::value>(rows.data(), dim, offsets, index, combiner, out.data());
  });
}

void embedding_bag_backward(std::span<const float> grad_out, int dim,
                            std::span<const int64_t> offsets, std::span<const int32_t> index,
                            BagCombiner combiner, std::span<float> grad_rows) {
  detail::check_embedding_bag_args(grad_rows.size(), dim, offsets, index, grad_out.size(),
                                   "embedding_bag_backward");
  std::fill(grad_rows.begin(), grad_rows.end(), 0.0f);
  with_dim(dim, [&](auto d) {
    backward_bags<decltype(d)::value>(grad_out.data(), dim, offsets, index, combiner,
                                      grad_rows.data());
  });
}

#if !PS_HAVE_CUDA
struct CudaEmbeddingBag::Impl {};
CudaEmbeddingBag::CudaEmbeddingBag(int) {
  throw Error("CudaEmbeddingBag: this build has no CUDA support (configure with -Dcuda=enabled)");
}
CudaEmbeddingBag::~CudaEmbeddingBag() = default;
void CudaEmbeddingBag::forward(std::span<const float>, int, std::span<const int64_t>,
                               std::span<const int32_t>, BagCombiner, std::span<float>) {}
void CudaEmbeddingBag::backward(std::span<const float>, int, std::span<const int64_t>,
                                std::span<const int32_t>, BagCombiner, std::span<float>) {}
#endif

}  // namespace ps
