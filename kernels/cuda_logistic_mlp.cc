// CudaLogisticMlp: LogisticMlp's forward and backward on one GPU. The products
// are cuBLAS's (CublasGemm, as the CUDA engine's), bias + activation and the
// bias gradients the engine's kernels (mlp_kernels.h), the loss and the logit
// gradient logistic_loss.cu's. Every call uploads params() and the batch,
// runs on one stream and waits for its results: host spans in and out.
//
// Memory: one device allocation for everything, sized for max_batch at
// construction (a call allocates nothing), and one pinned host allocation
// for params(), grads() and the loss.
#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "kernels/cublas_gemm.h"
#include "kernels/cuda_check.h"
#include "kernels/logistic_loss_kernels.h"
#include "kernels/logistic_mlp_checks.h"
#include "kernels/mlp_kernels.h"
#include "ps/errors.h"
#include "ps/logistic_mlp.h"

namespace ps {
namespace {

constexpr size_t kAlign = 256;  // bytes, for every sub-buffer of the device allocation

size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

struct CudaLogisticMlp::Impl {
  int device = 0;
  bool tf32 = false;
  int sm_count = 1;
  std::string description;
  cudaStream_t stream = nullptr;
  std::unique_ptr<detail::CublasGemm> gemm;  // on stream

  char* d_work = nullptr;      // every device buffer below
  float* d_params = nullptr;   // (P) layout()
  float* d_grads = nullptr;    // (P) layout()
  double* d_loss = nullptr;    // (1) summed log-loss of the batch
  float* d_x = nullptr;        // (max_batch, inputs)
  float* d_dx = nullptr;       // (max_batch, inputs)
  float* d_labels = nullptr;   // (max_batch)
  float* d_extra = nullptr;    // (max_batch)
  float* d_probs = nullptr;    // (max_batch)
  std::vector<float*> d_acts;  // per layer (max_batch, out_l); the last holds the logit
  float* d_dbuf[2] = {};       // (max_batch, widest hidden) ping-pong
  float* d_partial = nullptr;  // (kMaxBiasGradPartialRows, max width)

  char* h_pinned = nullptr;   // the host buffers below
  float* h_params = nullptr;  // (P)
  float* h_grads = nullptr;   // (P)
  double* h_loss = nullptr;   // (1)

  ~Impl() {
    if (cudaSetDevice(device) != cudaSuccess) return;
    if (stream) cudaStreamSynchronize(stream);
    gemm.reset();
    cudaFree(d_work);
    cudaFreeHost(h_pinned);
    if (stream) cudaStreamDestroy(stream);
  }

  void init(const MlpShape& shape, const ParamLayout& layout, int max_batch) {
    cudaCheck(cudaSetDevice(device));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    sm_count = prop.multiProcessorCount;
    description = fmt::format("CUDA device {} ({}, sm_{}{}), cuBLAS {}", device, prop.name,
                              prop.major, prop.minor, tf32 ? "TF32" : "FP32");
    cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    gemm = std::make_unique<detail::CublasGemm>(stream, tf32);

    // Sizes first, then one allocation and the pointer table.
    const size_t P = layout.total(), B = static_cast<size_t>(max_batch), F = sizeof(float);
    const int L = shape.num_layers();
    int widest_hidden = 0;
    for (int h : shape.hidden) widest_hidden = std::max(widest_hidden, h);
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off += align_up(std::max<size_t>(bytes, 1));
      return at;
    };
    const size_t params_off = take(P * F), grads_off = take(P * F), loss_off = take(sizeof(double));
    const size_t x_off = take(B * shape.inputs * F), dx_off = take(B * shape.inputs * F);
    const size_t labels_off = take(B * F), extra_off = take(B * F), probs_off = take(B * F);
    std::vector<size_t> act_off(L);
    for (int l = 0; l < L; ++l) act_off[l] = take(B * shape.layer_out(l) * F);
    const size_t dbuf_off[2] = {take(B * widest_hidden * F), take(B * widest_hidden * F)};
    const size_t partial_off =
        take(static_cast<size_t>(kernels::kMaxBiasGradPartialRows) * shape.max_width() * F);
    cudaCheck(cudaMalloc(&d_work, off));
    cudaCheck(cudaMemset(d_work, 0, off));
    auto at = [&](size_t o) { return reinterpret_cast<float*>(d_work + o); };
    d_params = at(params_off);
    d_grads = at(grads_off);
    d_loss = reinterpret_cast<double*>(d_work + loss_off);
    d_x = at(x_off);
    d_dx = at(dx_off);
    d_labels = at(labels_off);
    d_extra = at(extra_off);
    d_probs = at(probs_off);
    for (int l = 0; l < L; ++l) d_acts.push_back(at(act_off[l]));
    for (int s = 0; s < 2; ++s) d_dbuf[s] = at(dbuf_off[s]);
    d_partial = at(partial_off);

    const size_t host_bytes = align_up(P * F) * 2 + align_up(sizeof(double));
    cudaCheck(cudaMallocHost(&h_pinned, host_bytes));
    std::fill_n(h_pinned, host_bytes, 0);
    h_params = reinterpret_cast<float*>(h_pinned);
    h_grads = reinterpret_cast<float*>(h_pinned + align_up(P * F));
    h_loss = reinterpret_cast<double*>(h_pinned + 2 * align_up(P * F));
  }

  void upload(void* to, const void* from, size_t bytes) {
    if (bytes) cudaCheck(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, stream));
  }
  void download(void* to, const void* from, size_t bytes) {
    if (bytes) cudaCheck(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream));
  }

  kernels::Act hidden_act(const MlpShape& shape) const {
    return shape.activation == Activation::kRelu ? kernels::kActRelu : kernels::kActSigmoid;
  }

  // d_acts[l] (B, out_l) = act(in_l · W_l + b_l) for the batch in d_x; the
  // last is the head's logit (no activation).
  void forward(const MlpShape& shape, const ParamLayout& layout, int B) {
    const int L = shape.num_layers();
    const float* in = d_x;
    for (int l = 0; l < L; ++l) {
      const int n_in = shape.layer_in(l), n_out = shape.layer_out(l);
      gemm->forward(in, d_params + layout.weights(l).offset, d_acts[l], B, n_in, n_out);
      kernels::bias_act_forward(d_acts[l], d_params + layout.biases(l).offset, B, n_out,
                                l + 1 < L ? hidden_act(shape) : kernels::kActNone, stream);
      in = d_acts[l];
    }
  }

  // Gradients into d_grads (and d_dx when want_dx) from dL/dlogit in
  // d_acts.back(), which stays as it is (the last layer has no activation).
  void backward(const MlpShape& shape, const ParamLayout& layout, int B, bool want_dx) {
    const int L = shape.num_layers();
    float* dz = d_acts.back();  // (B, out_l): on entry dL/dy_l, made dL/dz_l below
    int next = 0;
    for (int l = L - 1; l >= 0; --l) {
      const int n_in = shape.layer_in(l), n_out = shape.layer_out(l);
      const float* W = d_params + layout.weights(l).offset;
      kernels::act_backward_bias_grad(
          dz, l + 1 < L ? d_acts[l] : nullptr, d_grads + layout.biases(l).offset, d_partial, B,
          n_out, l + 1 < L ? hidden_act(shape) : kernels::kActNone, sm_count, stream);
      gemm->weight_grad(l == 0 ? d_x : d_acts[l - 1], dz, d_grads + layout.weights(l).offset, B,
                        n_in, n_out);
      if (l == 0) {
        if (want_dx) gemm->input_grad(dz, W, d_dx, B, n_in, n_out);
        break;
      }
      gemm->input_grad(dz, W, d_dbuf[next], B, n_in, n_out);
      dz = d_dbuf[next];
      next ^= 1;
    }
  }
};

CudaLogisticMlp::CudaLogisticMlp(const MlpShape& shape, int max_batch, int device, bool tf32)
    : shape_(shape),
      layout_((detail::check_logistic_mlp_config(shape, max_batch, "CudaLogisticMlp"), shape)),
      max_batch_(max_batch),
      impl_(std::make_unique<Impl>()) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the error
    n = 0;
  }
  if (device < 0 || device >= n)
    throw Error(
        fmt::format("CudaLogisticMlp: device {} requested, {} CUDA device(s) present", device, n));
  impl_->device = device;
  impl_->tf32 = tf32;
  impl_->init(shape_, layout_, max_batch_);
  params_ = {impl_->h_params, layout_.total()};
  grads_ = {impl_->h_grads, layout_.total()};
}

CudaLogisticMlp::~CudaLogisticMlp() = default;

std::string CudaLogisticMlp::device_description() const { return impl_->description; }

double CudaLogisticMlp::compute_gradients(std::span<const float> x, std::span<const float> labels,
                                          std::span<const float> extra_logit, std::span<float> dx,
                                          std::span<float> dlogit) {
  detail::check_logistic_mlp_gradients_args(shape_, max_batch_, x, labels, extra_logit, dx, dlogit,
                                            "CudaLogisticMlp::compute_gradients");
  Impl& m = *impl_;
  const int B = static_cast<int>(labels.size());
  cudaCheck(cudaSetDevice(m.device));
  m.upload(m.d_params, m.h_params, params_.size_bytes());
  m.upload(m.d_x, x.data(), x.size_bytes());
  m.upload(m.d_labels, labels.data(), labels.size_bytes());
  m.upload(m.d_extra, extra_logit.data(), extra_logit.size_bytes());
  m.forward(shape_, layout_, B);
  kernels::logistic_loss(m.d_acts.back(), extra_logit.empty() ? nullptr : m.d_extra, m.d_labels, B,
                         1.0f / static_cast<float>(B), m.d_loss, m.stream);
  m.backward(shape_, layout_, B, !dx.empty());
  m.download(m.h_grads, m.d_grads, grads_.size_bytes());
  m.download(m.h_loss, m.d_loss, sizeof(double));
  m.download(dx.data(), m.d_dx, dx.size_bytes());
  m.download(dlogit.data(), m.d_acts.back(), dlogit.size_bytes());
  cudaCheck(cudaStreamSynchronize(m.stream));
  return *m.h_loss / B;
}

void CudaLogisticMlp::predict(std::span<const float> x, std::span<const float> extra_logit,
                              std::span<float> probs) {
  const int64_t n = static_cast<int64_t>(probs.size());
  detail::check_logistic_mlp_input(shape_, x, n, extra_logit, "CudaLogisticMlp::predict");
  if (n == 0) return;
  Impl& m = *impl_;
  cudaCheck(cudaSetDevice(m.device));
  m.upload(m.d_params, m.h_params, params_.size_bytes());
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int B = static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    const size_t rows = static_cast<size_t>(B);
    m.upload(m.d_x, x.data() + start * shape_.inputs, rows * shape_.inputs * sizeof(float));
    if (!extra_logit.empty()) m.upload(m.d_extra, extra_logit.data() + start, rows * sizeof(float));
    m.forward(shape_, layout_, B);
    kernels::logistic_predict(m.d_acts.back(), extra_logit.empty() ? nullptr : m.d_extra, m.d_probs,
                              B, m.stream);
    m.download(probs.data() + start, m.d_probs, rows * sizeof(float));
    cudaCheck(cudaStreamSynchronize(m.stream));
  }
}

}  // namespace ps
