// The CUDA engine: cuBLAS for the matrix products, own kernels for the rest
// (mlp_kernels.h), a training step captured once per (batch size, input slot,
// kind) in a CUDA graph.
//
// Memory (llm.c style, one allocation per role with a table of offsets):
//   d_params_ (P)  and d_grads_ (P)   -- layout(): a pull/push is one copy
//   d_work_: activations, backward ping-pong, 2 input slots, per-row stats, ...
//   pinned host: host_params (P), host_grads (P), 2 input slots, stats
// Streams: stream_ runs the steps; copy_stream_ uploads staged batches, so the
// next batch's upload overlaps the running step. Events order the two:
//   h2d_done_[s]  (copy stream)    slot s is on the device / pinned slot s is free
//   slot_free_[s] (compute stream) the last step reading device slot s is done
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include <fmt/format.h>

#include "kernels/cublas_gemm.h"
#include "kernels/cuda_check.h"
#include "kernels/engine_impl.h"
#include "kernels/mlp_kernels.h"
#include "ps/mlp.h"

namespace ps::detail {
namespace {

using kernels::Act;

constexpr size_t kAlign = 256;  // bytes, for every sub-buffer of d_work_

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class CudaEngine final : public MlpEngine {
 public:
  CudaEngine(const MlpShape& shape, const EngineOptions& options)
      : MlpEngine(shape, options), device_(options.device), tf32_(options.tf32) {
    const char* graphs_env = std::getenv("PS_CUDA_GRAPHS");
    use_graphs_ = !(graphs_env && std::strcmp(graphs_env, "0") == 0);
    try {
      init(options);
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaEngine() override { release(); }

  std::span<float> host_params() override { return {h_params_, layout().total()}; }
  std::span<float> host_grads() override { return {h_grads_, layout().total()}; }
  bool on_gpu() const override { return true; }
  std::string device_description() const override { return description_; }

  void upload_params() override {
    cudaCheck(cudaSetDevice(device_));
    cudaCheck(
        cudaMemcpyAsync(d_params_, h_params_, param_bytes(), cudaMemcpyHostToDevice, stream_));
    cudaCheck(cudaStreamSynchronize(stream_));
  }

  void download_params() override {
    cudaCheck(cudaSetDevice(device_));
    cudaCheck(
        cudaMemcpyAsync(h_params_, d_params_, param_bytes(), cudaMemcpyDeviceToHost, stream_));
    cudaCheck(cudaStreamSynchronize(stream_));
  }

 protected:
  void do_prefetch(const float* x, const int32_t* labels, int batch) override {
    cudaCheck(cudaSetDevice(device_));
    const int s = staged_slot_ ^ 1;
    cudaCheck(cudaEventSynchronize(h2d_done_[s]));  // pinned slot s no longer being read
    std::memcpy(h_x_[s], x, static_cast<size_t>(batch) * shape().inputs * sizeof(float));
    std::memcpy(h_labels_[s], labels, static_cast<size_t>(batch) * sizeof(int32_t));
    cudaCheck(
        cudaStreamWaitEvent(copy_stream_, slot_free_[s], 0));  // no step still reads device slot s
    cudaCheck(cudaMemcpyAsync(d_x_[s], h_x_[s],
                              static_cast<size_t>(batch) * shape().inputs * sizeof(float),
                              cudaMemcpyHostToDevice, copy_stream_));
    cudaCheck(cudaMemcpyAsync(d_labels_[s], h_labels_[s],
                              static_cast<size_t>(batch) * sizeof(int32_t), cudaMemcpyHostToDevice,
                              copy_stream_));
    cudaCheck(cudaEventRecord(h2d_done_[s], copy_stream_));
    slot_batch_[s] = batch;
    staged_slot_ = s;
  }

  void do_start_step(bool sgd, float lr) override {
    cudaCheck(cudaSetDevice(device_));
    const int s = staged_slot_;
    const int batch = slot_batch_[s];
    cudaCheck(cudaStreamWaitEvent(stream_, h2d_done_[s], 0));
    if (sgd) set_lr(lr);
    if (use_graphs_) {
      cudaCheck(cudaGraphLaunch(graph_for(batch, s, sgd), stream_));
    } else {
      enqueue_step(batch, s, sgd);
    }
    cudaCheck(cudaEventRecord(slot_free_[s], stream_));
    step_batch_ = batch;
  }

  StepStats do_finish_step() override {
    cudaCheck(cudaSetDevice(device_));
    cudaCheck(cudaStreamSynchronize(stream_));
    return {h_stats_[0].loss_sum / step_batch_, h_stats_[0].correct, step_batch_};
  }

  void do_apply_sgd(float lr) override {
    cudaCheck(cudaSetDevice(device_));
    cudaCheck(cudaMemcpyAsync(d_grads_, h_grads_, param_bytes(), cudaMemcpyHostToDevice, stream_));
    set_lr(lr);
    kernels::sgd_update(d_params_, d_grads_, d_lr_, layout().total(), stream_);
    cudaCheck(
        cudaMemcpyAsync(h_params_, d_params_, param_bytes(), cudaMemcpyDeviceToHost, stream_));
    cudaCheck(cudaStreamSynchronize(stream_));
  }

  StepStats do_forward_chunk(const float* x, const int32_t* labels, int n, float* logits) override {
    cudaCheck(cudaSetDevice(device_));
    cudaCheck(cudaStreamSynchronize(copy_stream_));
    cudaCheck(cudaStreamSynchronize(stream_));
    // The slot that is not staged is free: every step is finished.
    const int s = staged_slot_ ^ 1;
    const size_t x_bytes = static_cast<size_t>(n) * shape().inputs * sizeof(float);
    std::memcpy(h_x_[s], x, x_bytes);
    cudaCheck(cudaMemcpyAsync(d_x_[s], h_x_[s], x_bytes, cudaMemcpyHostToDevice, stream_));
    forward(d_x_[s], n);
    if (labels) {
      std::memcpy(h_labels_[s], labels, static_cast<size_t>(n) * sizeof(int32_t));
      cudaCheck(cudaMemcpyAsync(d_labels_[s], h_labels_[s],
                                static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream_));
      kernels::softmax_xent(d_acts_.back(), d_labels_[s], nullptr, d_row_loss_, d_row_correct_, n,
                            shape().classes, 1.0f / static_cast<float>(n), stream_);
      kernels::batch_stats(d_row_loss_, d_row_correct_, n, d_stats_ + 1, stream_);
      cudaCheck(cudaMemcpyAsync(h_stats_ + 1, d_stats_ + 1, sizeof(kernels::BatchStats),
                                cudaMemcpyDeviceToHost, stream_));
    }
    if (logits) {
      cudaCheck(cudaMemcpyAsync(logits, d_acts_.back(),
                                static_cast<size_t>(n) * shape().classes * sizeof(float),
                                cudaMemcpyDeviceToHost, stream_));
    }
    cudaCheck(cudaStreamSynchronize(stream_));
    if (!labels) return {};
    return {h_stats_[1].loss_sum / n, h_stats_[1].correct, n};
  }

 private:
  size_t param_bytes() const { return layout().total() * sizeof(float); }

  void init(const EngineOptions& options) {
    cudaCheck(cudaSetDevice(device_));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device_));
    sm_count_ = prop.multiProcessorCount;
    description_ = fmt::format("CUDA device {} ({}, sm_{}{}, {} SMs, {:.1f} GiB), cuBLAS {}{}",
                               device_, prop.name, prop.major, prop.minor, sm_count_,
                               prop.totalGlobalMem / double(1u << 30), tf32_ ? "TF32" : "FP32",
                               use_graphs_ ? ", CUDA graphs" : "");

    cudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (int s = 0; s < 2; ++s) {
      cudaCheck(cudaEventCreateWithFlags(&h2d_done_[s], cudaEventDisableTiming));
      cudaCheck(cudaEventCreateWithFlags(&slot_free_[s], cudaEventDisableTiming));
    }
    gemm_ = std::make_unique<CublasGemm>(stream_, tf32_);

    const size_t P = layout().total();
    cudaCheck(cudaMalloc(&d_params_, P * sizeof(float)));
    cudaCheck(cudaMalloc(&d_grads_, P * sizeof(float)));
    cudaCheck(cudaMemset(d_params_, 0, P * sizeof(float)));
    cudaCheck(cudaMemset(d_grads_, 0, P * sizeof(float)));

    // Work area: sizes first, then one allocation and the pointer table.
    const int L = shape().num_layers();
    const size_t rows = static_cast<size_t>(std::max(options.max_batch, options.eval_batch));
    const size_t train_rows = static_cast<size_t>(options.max_batch);
    int widest_hidden = 0;
    for (int h : shape().hidden) widest_hidden = std::max(widest_hidden, h);
    std::vector<size_t> act_off(L);
    size_t off = 0;
    for (int l = 0; l < L; ++l) {  // (rows, out_l)
      act_off[l] = off;
      off += align_up(rows * shape().layer_out(l) * sizeof(float));
    }
    size_t dbuf_off[2];
    for (auto& d : dbuf_off) {  // (max_batch, widest hidden)
      d = off;
      off += align_up(train_rows * widest_hidden * sizeof(float));
    }
    size_t x_off[2], labels_off[2];
    for (int s = 0; s < 2; ++s) {
      x_off[s] = off;  // (rows, inputs)
      off += align_up(rows * shape().inputs * sizeof(float));
      labels_off[s] = off;  // (rows)
      off += align_up(rows * sizeof(int32_t));
    }
    const size_t row_loss_off = off;  // (rows)
    off += align_up(rows * sizeof(float));
    const size_t row_correct_off = off;  // (rows)
    off += align_up(rows * sizeof(int32_t));
    const size_t partial_off = off;  // (kMaxBiasGradPartialRows, max width)
    off += align_up(static_cast<size_t>(kernels::kMaxBiasGradPartialRows) * shape().max_width() *
                    sizeof(float));
    const size_t stats_off = off;  // 2: [0] steps, [1] evaluation
    off += align_up(2 * sizeof(kernels::BatchStats));
    const size_t lr_off = off;  // (1)
    off += align_up(sizeof(float));
    cudaCheck(cudaMalloc(&d_work_, off));
    cudaCheck(cudaMemset(d_work_, 0, off));
    auto at = [&](size_t o) { return d_work_ + o; };
    for (int l = 0; l < L; ++l) d_acts_.push_back(reinterpret_cast<float*>(at(act_off[l])));
    for (int s = 0; s < 2; ++s) {
      d_dbuf_[s] = reinterpret_cast<float*>(at(dbuf_off[s]));
      d_x_[s] = reinterpret_cast<float*>(at(x_off[s]));
      d_labels_[s] = reinterpret_cast<int32_t*>(at(labels_off[s]));
    }
    d_row_loss_ = reinterpret_cast<float*>(at(row_loss_off));
    d_row_correct_ = reinterpret_cast<int32_t*>(at(row_correct_off));
    d_partial_ = reinterpret_cast<float*>(at(partial_off));
    d_stats_ = reinterpret_cast<kernels::BatchStats*>(at(stats_off));
    d_lr_ = reinterpret_cast<float*>(at(lr_off));

    // Pinned host memory.
    cudaCheck(cudaMallocHost(&h_params_, P * sizeof(float)));
    cudaCheck(cudaMallocHost(&h_grads_, P * sizeof(float)));
    std::memset(h_params_, 0, P * sizeof(float));
    std::memset(h_grads_, 0, P * sizeof(float));
    for (int s = 0; s < 2; ++s) {
      cudaCheck(cudaMallocHost(&h_x_[s], rows * shape().inputs * sizeof(float)));
      cudaCheck(cudaMallocHost(&h_labels_[s], rows * sizeof(int32_t)));
    }
    cudaCheck(cudaMallocHost(&h_stats_, 2 * sizeof(kernels::BatchStats)));
    std::memset(h_stats_, 0, 2 * sizeof(kernels::BatchStats));
    cudaCheck(cudaDeviceSynchronize());
  }

  // Frees whatever init() got to; errors are ignored (called from the destructor).
  void release() noexcept {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    if (stream_) cudaStreamSynchronize(stream_);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
    gemm_.reset();
    cudaFree(d_params_);
    cudaFree(d_grads_);
    cudaFree(d_work_);
    cudaFreeHost(h_params_);
    cudaFreeHost(h_grads_);
    for (int s = 0; s < 2; ++s) {
      cudaFreeHost(h_x_[s]);
      cudaFreeHost(h_labels_[s]);
      if (h2d_done_[s]) cudaEventDestroy(h2d_done_[s]);
      if (slot_free_[s]) cudaEventDestroy(slot_free_[s]);
    }
    cudaFreeHost(h_stats_);
    if (stream_) cudaStreamDestroy(stream_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    stream_ = copy_stream_ = nullptr;
  }

  void set_lr(float lr) {
    if (lr == current_lr_) return;
    // From pageable memory: the runtime copies the value before returning,
    // and stream order puts it before the step that reads it.
    cudaCheck(cudaMemcpyAsync(d_lr_, &lr, sizeof(float), cudaMemcpyHostToDevice, stream_));
    current_lr_ = lr;
  }

  Act hidden_act() const {
    return shape().activation == Activation::kRelu ? kernels::kActRelu : kernels::kActSigmoid;
  }

  // d_acts_[l] (B, out_l) = act(x_l · W_l + b_l); the last one holds the logits.
  void forward(const float* x, int B) {
    const int L = shape().num_layers();
    const float* in = x;
    for (int l = 0; l < L; ++l) {
      const int n_in = shape().layer_in(l), n_out = shape().layer_out(l);
      gemm_->forward(in, d_params_ + layout().weights(l).offset, d_acts_[l], B, n_in, n_out);
      kernels::bias_act_forward(d_acts_[l], d_params_ + layout().biases(l).offset, B, n_out,
                                l + 1 < L ? hidden_act() : kernels::kActNone, stream_);
      in = d_acts_[l];
    }
  }

  // Gradients into d_grads_, from dlogits in d_acts_.back().
  void backward(const float* x, int B) {
    const int L = shape().num_layers();
    float* dz = d_acts_.back();  // (B, out_l): on entry dL/dy_l, made dL/dz_l below
    int next = 0;
    for (int l = L - 1; l >= 0; --l) {
      const int n_in = shape().layer_in(l), n_out = shape().layer_out(l);
      const float* W = d_params_ + layout().weights(l).offset;
      kernels::act_backward_bias_grad(
          dz, l + 1 < L ? d_acts_[l] : nullptr, d_grads_ + layout().biases(l).offset, d_partial_, B,
          n_out, l + 1 < L ? hidden_act() : kernels::kActNone, sm_count_, stream_);
      gemm_->weight_grad(l == 0 ? x : d_acts_[l - 1], dz, d_grads_ + layout().weights(l).offset, B,
                         n_in, n_out);
      if (l == 0) break;
      gemm_->input_grad(dz, W, d_dbuf_[next], B, n_in, n_out);
      dz = d_dbuf_[next];
      next ^= 1;
    }
  }

  // One training step on slot s, enqueued on stream_ (captured into a graph).
  void enqueue_step(int B, int s, bool sgd) {
    forward(d_x_[s], B);
    kernels::softmax_xent(d_acts_.back(), d_labels_[s], d_acts_.back(), d_row_loss_, d_row_correct_,
                          B, shape().classes, 1.0f / static_cast<float>(B), stream_);
    kernels::batch_stats(d_row_loss_, d_row_correct_, B, d_stats_, stream_);
    cudaCheck(cudaMemcpyAsync(h_stats_, d_stats_, sizeof(kernels::BatchStats),
                              cudaMemcpyDeviceToHost, stream_));
    backward(d_x_[s], B);
    if (sgd) {
      kernels::sgd_update(d_params_, d_grads_, d_lr_, layout().total(), stream_);
    } else {
      cudaCheck(
          cudaMemcpyAsync(h_grads_, d_grads_, param_bytes(), cudaMemcpyDeviceToHost, stream_));
    }
  }

  cudaGraphExec_t graph_for(int B, int s, bool sgd) {
    const auto key = std::make_tuple(B, s, sgd);
    if (auto it = graphs_.find(key); it != graphs_.end()) return it->second;
    if (graphs_.size() >= 64) {  // many batch sizes: start over rather than grow
      cudaCheck(cudaStreamSynchronize(stream_));
      for (auto& [k, exec] : graphs_) cudaCheck(cudaGraphExecDestroy(exec));
      graphs_.clear();
    }
    cudaGraph_t graph = nullptr;
    cudaCheck(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_step(B, s, sgd);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    cudaCheck(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    cudaCheck(err);
    graphs_.emplace(key, exec);
    return exec;
  }

  int device_;
  bool tf32_;
  bool use_graphs_ = true;  // PS_CUDA_GRAPHS=0 runs steps eagerly (debugging)
  int sm_count_ = 1;
  std::string description_;
  cudaStream_t stream_ = nullptr, copy_stream_ = nullptr;
  cudaEvent_t h2d_done_[2] = {nullptr, nullptr};
  cudaEvent_t slot_free_[2] = {nullptr, nullptr};
  std::unique_ptr<CublasGemm> gemm_;  // on stream_

  float* d_params_ = nullptr;               // (P) layout()
  float* d_grads_ = nullptr;                // (P) layout()
  char* d_work_ = nullptr;                  // everything below
  std::vector<float*> d_acts_;              // per layer (rows, out_l)
  float* d_dbuf_[2] = {};                   // (max_batch, widest hidden)
  float* d_x_[2] = {};                      // (rows, inputs)
  int32_t* d_labels_[2] = {};               // (rows)
  float* d_row_loss_ = nullptr;             // (rows)
  int32_t* d_row_correct_ = nullptr;        // (rows)
  float* d_partial_ = nullptr;              // (kMaxBiasGradPartialRows, max width)
  kernels::BatchStats* d_stats_ = nullptr;  // (2)
  float* d_lr_ = nullptr;                   // (1)

  float* h_params_ = nullptr;               // (P) pinned
  float* h_grads_ = nullptr;                // (P) pinned
  float* h_x_[2] = {};                      // (rows, inputs) pinned
  int32_t* h_labels_[2] = {};               // (rows) pinned
  kernels::BatchStats* h_stats_ = nullptr;  // (2) pinned: [0] steps, [1] evaluation

  int staged_slot_ = 1;  // the first prefetch goes to slot 0
  int slot_batch_[2] = {0, 0};
  int step_batch_ = 0;
  float current_lr_ = std::nanf("");
  std::map<std::tuple<int, int, bool>, cudaGraphExec_t> graphs_;
};

}  // namespace

std::unique_ptr<MlpEngine> new_cuda_engine(const MlpShape& shape, const EngineOptions& options) {
  return std::make_unique<CudaEngine>(shape, options);
}

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the error
    return 0;
  }
  return n;
}

}  // namespace ps::detail
