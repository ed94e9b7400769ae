// Embedding bags for a worker: each bag's output is the sum (or mean) of some
// rows of a dense rows buffer the trainer pulled from an embedding table.
//
// The ids of a batch are deduplicated first (dedup_ids), the unique ids are
// pulled once into rows (U, D), and every occurrence refers to its row by
// index. The backward pass then writes the gradient of each UNIQUE row, with
// the contributions of repeated ids already summed: grad_rows lines up with
// the unique ids, ready for push_rows.
//
// Bags are given in CSR form: bag n holds index[offsets[n] .. offsets[n+1]).
// For wide & deep with F fields of one id each, bags are (example, field) in
// example-major order (fixed_offsets(B * F, 1)), and the output (B * F, D)
// reads as the (B, F * D) input of the dense head.
//
// Example (one step of a trainer):
//
//   ps::UniqueIds u = ps::dedup_ids(batch_ids);                // batch_ids (B * F)
//   std::vector<float> rows(u.ids.size() * D);                 // (U, D)
//   client.pull_rows("emb", ps::as_table_ids(u.ids), rows);
//   auto offsets = ps::fixed_offsets(B * F, 1);                // (B * F + 1)
//   std::vector<float> x(B * F * D);                           // (B, F * D)
//   ps::embedding_bag_forward(rows, D, offsets, u.index, ps::BagCombiner::kSum, x);
//   ... dense head: dL/dx (B, F * D) ...
//   std::vector<float> grad_rows(rows.size());                 // (U, D)
//   ps::embedding_bag_backward(dx, D, offsets, u.index, ps::BagCombiner::kSum, grad_rows);
//   client.push_rows("emb", ps::as_table_ids(u.ids), grad_rows);
//
// Bad input (offsets not starting at 0, decreasing or not ending at
// index.size(), an index outside the rows, buffer sizes that do not match D)
// throws ps::Error and writes nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ps {

enum class BagCombiner { kSum, kMean };  // kMean of an empty bag is 0

// The distinct ids of a batch in order of first appearance, and for every
// position of the batch the index of its id in `ids`.
struct UniqueIds {
  std::vector<uint64_t> ids;   // (U)
  std::vector<int32_t> index;  // (N), values in [0, U)
};
// Unique ids as the Client's row calls take them: a table's ids are any
// 64-bit pattern, which the API spells int64_t (the same bits).
inline std::span<const int64_t> as_table_ids(std::span<const uint64_t> ids) {
  return {reinterpret_cast<const int64_t*>(ids.data()), ids.size()};
}
UniqueIds dedup_ids(std::span<const uint64_t> ids);
// The same into `out`, reusing its vectors: a batch like the one before it
// allocates nothing.
void dedup_ids_into(std::span<const uint64_t> ids, UniqueIds& out);

// CSR offsets of `bags` bags of `per_bag` ids each: 0, per_bag, 2 * per_bag, ...
std::vector<int64_t> fixed_offsets(int64_t bags, int per_bag);

// out (N, D) = combine over j in bag n of rows (U, D)[index[j]].
// offsets (N + 1), index (nnz); U is rows.size() / dim.
void embedding_bag_forward(std::span<const float> rows, int dim, std::span<const int64_t> offsets,
                           std::span<const int32_t> index, BagCombiner combiner,
                           std::span<float> out);

// grad_rows (U, D) = for each unique row u, the sum over the occurrences j
// with index[j] == u of grad_out (N, D)[bag of j] (divided by the bag's size
// for kMean). Overwrites grad_rows (rows never referenced get 0).
void embedding_bag_backward(std::span<const float> grad_out, int dim,
                            std::span<const int64_t> offsets, std::span<const int32_t> index,
                            BagCombiner combiner, std::span<float> grad_rows);

// The same two passes on a GPU: host buffers in and out, device buffers kept
// between calls (grown as needed). Not thread-safe; one per thread.
// The forward pass is a gather; the backward one scatter-adds with atomics,
// so the order of the float additions for a repeated id is not fixed.
class CudaEmbeddingBag {
 public:
  // Throws ps::Error when this build has no CUDA or there is no such device.
  explicit CudaEmbeddingBag(int device = 0);
  ~CudaEmbeddingBag();
  CudaEmbeddingBag(const CudaEmbeddingBag&) = delete;
  CudaEmbeddingBag& operator=(const CudaEmbeddingBag&) = delete;

  void forward(std::span<const float> rows, int dim, std::span<const int64_t> offsets,
               std::span<const int32_t> index, BagCombiner combiner, std::span<float> out);
  void backward(std::span<const float> grad_out, int dim, std::span<const int64_t> offsets,
                std::span<const int32_t> index, BagCombiner combiner, std::span<float> grad_rows);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// Shared by both implementations: throws ps::Error on a bad argument.
// `table_floats` is rows.size() (forward) or grad_rows.size() (backward),
// `bag_floats` out.size() or grad_out.size().
void check_embedding_bag_args(size_t table_floats, int dim, std::span<const int64_t> offsets,
                              std::span<const int32_t> index, size_t bag_floats, const char* what);
}  // namespace detail

}  // namespace ps
