// CudaEmbeddingBag: host spans in and out around the kernels of
// embedding_bag.cu, with device buffers that grow to the largest call seen.
#include <algorithm>

#include <fmt/format.h>

#include "kernels/cuda_check.h"
#include "kernels/embedding_bag_kernels.h"
#include "ps/embedding_bag.h"
#include "ps/errors.h"

namespace ps {

namespace {

// A device allocation that only grows.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  void reserve(size_t need) {
    if (need <= bytes) return;
    if (ptr) cudaCheck(cudaFree(ptr));
    ptr = nullptr;
    bytes = 0;
    cudaCheck(cudaMalloc(&ptr, need));
    bytes = need;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

}  // namespace

struct CudaEmbeddingBag::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  DeviceBuffer table;    // rows or grad_rows (U, D)
  DeviceBuffer bag;      // out or grad_out (N, D)
  DeviceBuffer offsets;  // (N + 1)
  DeviceBuffer index;    // (nnz)

  // Uploads offsets, index and `in` (host -> device buffer `in_buf`).
  void upload(std::span<const int64_t> o, std::span<const int32_t> i, DeviceBuffer& in_buf,
              std::span<const float> in, DeviceBuffer& out_buf, size_t out_floats) {
    cudaCheck(cudaSetDevice(device));
    offsets.reserve(o.size_bytes());
    index.reserve(std::max<size_t>(i.size_bytes(), 4));
    in_buf.reserve(std::max<size_t>(in.size_bytes(), 4));
    out_buf.reserve(std::max<size_t>(out_floats * sizeof(float), 4));
    cudaCheck(
        cudaMemcpyAsync(offsets.ptr, o.data(), o.size_bytes(), cudaMemcpyHostToDevice, stream));
    if (!i.empty())
      cudaCheck(
          cudaMemcpyAsync(index.ptr, i.data(), i.size_bytes(), cudaMemcpyHostToDevice, stream));
    if (!in.empty())
      cudaCheck(
          cudaMemcpyAsync(in_buf.ptr, in.data(), in.size_bytes(), cudaMemcpyHostToDevice, stream));
  }

  void download(DeviceBuffer& from, std::span<float> to) {
    if (!to.empty())
      cudaCheck(
          cudaMemcpyAsync(to.data(), from.ptr, to.size_bytes(), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
  }
};

CudaEmbeddingBag::CudaEmbeddingBag(int device) : impl_(std::make_unique<Impl>()) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (device < 0 || device >= n)
    throw Error(
        fmt::format("CudaEmbeddingBag: device {} requested, {} CUDA device(s) present", device, n));
  impl_->device = device;
  cudaCheck(cudaSetDevice(device));
  cudaCheck(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
}

CudaEmbeddingBag::~CudaEmbeddingBag() {
  if (impl_ && impl_->stream) {
    cudaSetDevice(impl_->device);
    cudaStreamDestroy(impl_->stream);
  }
}

void CudaEmbeddingBag::forward(std::span<const float> rows, int dim,
                               std::span<const int64_t> offsets, std::span<const int32_t> index,
                               BagCombiner combiner, std::span<float> out) {
  detail::check_embedding_bag_args(rows.size(), dim, offsets, index, out.size(),
                                   "CudaEmbeddingBag::forward");
  Impl& m = *impl_;
  m.upload(offsets, index, m.table, rows, m.bag, out.size());
  kernels::embedding_bag_gather(
      static_cast<const float*>(m.table.ptr), static_cast<const int64_t*>(m.offsets.ptr),
      static_cast<const int32_t*>(m.index.ptr), static_cast<float*>(m.bag.ptr),
      static_cast<int64_t>(offsets.size() - 1), dim, combiner == BagCombiner::kMean, m.stream);
  m.download(m.bag, out);
}

void CudaEmbeddingBag::backward(std::span<const float> grad_out, int dim,
                                std::span<const int64_t> offsets, std::span<const int32_t> index,
                                BagCombiner combiner, std::span<float> grad_rows) {
  detail::check_embedding_bag_args(grad_rows.size(), dim, offsets, index, grad_out.size(),
                                   "CudaEmbeddingBag::backward");
  Impl& m = *impl_;
  m.upload(offsets, index, m.bag, grad_out, m.table, grad_rows.size());
  if (!grad_rows.empty())
    cudaCheck(cudaMemsetAsync(m.table.ptr, 0, grad_rows.size_bytes(), m.stream));
  kernels::embedding_bag_scatter_add(
      static_cast<const float*>(m.bag.ptr), static_cast<const int64_t*>(m.offsets.ptr),
      static_cast<const int32_t*>(m.index.ptr), static_cast<float*>(m.table.ptr),
      static_cast<int64_t>(offsets.size() - 1), dim, combiner == BagCombiner::kMean, m.stream);
  m.download(m.table, grad_rows);
}

}  // namespace ps
