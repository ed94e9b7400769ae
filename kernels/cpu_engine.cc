// The CPU engine: Eigen matrix products on row-major maps of preallocated
// buffers, so a step allocates nothing. Single-threaded on purpose: Towers
// runs one engine per core.
//
// Built once per CPU ISA on x86-64 (baseline, AVX2 + FMA, AVX-512; see
// meson.build), picked at run time (cpu_isa.h). Each build renames Eigen's
// namespace (-DEigen=ps_eigen_avx2, ...) so that no Eigen template
// instantiated with wider vectors can be merged by the linker into code that
// must run without them.
#ifndef PS_CPU_ENGINE_FACTORY
#define PS_CPU_ENGINE_FACTORY new_cpu_engine_baseline
#endif
#include <algorithm>
#include <cmath>
#include <vector>

#include <Eigen/Core>
#include <fmt/format.h>

#include "kernels/engine_impl.h"
#include "ps/mlp.h"

namespace ps::detail {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
using ConstRowMap = Eigen::Map<const Eigen::RowVectorXf>;
using RowMap = Eigen::Map<Eigen::RowVectorXf>;

// C = A · B with the depth k cut into slices of kDepthSlice: Eigen's own
// blocking, driven by the cache sizes a VM reports, made the 784-deep first
// layer 3-10x slower than this on the project's machines (AVX2/AVX-512).
constexpr Eigen::Index kDepthSlice = 128;

template <typename C, typename A, typename B>
void gemm(C&& c, const A& a, const B& b) {
  const Eigen::Index depth = a.cols();
  if (depth <= kDepthSlice) {
    c.noalias() = a * b;
    return;
  }
  c.noalias() = a.leftCols(kDepthSlice) * b.topRows(kDepthSlice);
  for (Eigen::Index k = kDepthSlice; k < depth; k += kDepthSlice) {
    const Eigen::Index n = std::min(kDepthSlice, depth - k);
    c.noalias() += a.middleCols(k, n) * b.middleRows(k, n);
  }
}

class CpuEngine final : public MlpEngine {
 public:
  CpuEngine(const MlpShape& shape, const EngineOptions& options)
      : MlpEngine(shape, options),
        params_(layout().total(), 0.0f),
        grads_(layout().total(), 0.0f),
        rows_(std::max(options.max_batch, options.eval_batch)) {
    const int num_layers = shape.num_layers();
    acts_.resize(num_layers);
    for (int l = 0; l < num_layers; ++l)  // (rows, out_l)
      acts_[l].assign(static_cast<size_t>(rows_) * shape.layer_out(l), 0.0f);
    if (num_layers > 1) {
      const int widest_hidden = *std::max_element(shape.hidden.begin(), shape.hidden.end());
      for (auto& d : dbuf_)  // (max_batch, widest hidden)
        d.assign(static_cast<size_t>(options.max_batch) * widest_hidden, 0.0f);
    }
  }

  std::span<float> host_params() override { return params_; }
  std::span<float> host_grads() override { return grads_; }
  void upload_params() override {}  // the host copy is the working copy
  void download_params() override {}
  bool on_gpu() const override { return false; }

  std::string device_description() const override {
#if defined(__AVX512F__)
    const char* simd = "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
    const char* simd = "AVX2+FMA";
#else
    const char* simd = Eigen::SimdInstructionSetsInUse();
#endif
    return fmt::format("CPU, Eigen {}.{}.{} ({}), 1 thread", EIGEN_WORLD_VERSION,
                       EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, simd);
  }

 protected:
  void do_prefetch(const float* x, const int32_t* labels, int batch) override {
    x_ = x;
    labels_ = labels;
    batch_ = batch;
  }

  void do_start_step(bool sgd, float lr) override {
    forward(x_, batch_);
    stats_ = softmax_xent(batch_, labels_, /*grad=*/true);
    backward(x_, batch_);
    if (sgd) sgd_update(lr);
  }

  StepStats do_finish_step() override { return stats_; }

  void do_apply_sgd(float lr) override { sgd_update(lr); }

  StepStats do_forward_chunk(const float* x, const int32_t* labels, int n, float* logits) override {
    forward(x, n);
    const size_t count = static_cast<size_t>(n) * shape().classes;
    if (logits) std::copy_n(acts_.back().data(), count, logits);
    return labels ? softmax_xent(n, labels, /*grad=*/false) : StepStats{};
  }

 private:
  // acts_[l] (B, out_l) = act(x_l · W_l + b_l); the last one holds the logits.
  void forward(const float* x, int batch) {
    const int num_layers = shape().num_layers();
    const float* in = x;
    for (int l = 0; l < num_layers; ++l) {
      const int n_in = shape().layer_in(l), n_out = shape().layer_out(l);
      ConstMatMap X(in, batch, n_in);
      ConstMatMap W(params_.data() + layout().weights(l).offset, n_in, n_out);
      ConstRowMap b(params_.data() + layout().biases(l).offset, n_out);
      MatMap Y(acts_[l].data(), batch, n_out);
      gemm(Y, X, W);
      Y.rowwise() += b;
      if (l + 1 < num_layers) {
        if (shape().activation == Activation::kRelu)
          Y = Y.cwiseMax(0.0f);
        else
          Y = (1.0f + (-Y.array()).exp()).inverse().matrix();
      }
      in = acts_[l].data();
    }
  }

  // Mean cross-entropy and #correct over the logits in acts_.back(); with grad,
  // overwrites them by d(mean loss)/d(logits) = (softmax - onehot) / B.
  StepStats softmax_xent(int batch, const int32_t* labels, bool grad) {
    const int classes = shape().classes;
    const float inv_batch = 1.0f / static_cast<float>(batch);
    double loss = 0;
    int64_t correct = 0;
    for (int i = 0; i < batch; ++i) {
      float* z = acts_.back().data() + static_cast<size_t>(i) * classes;
      const int label = labels[i];
      int argmax = 0;
      for (int j = 1; j < classes; ++j)
        if (z[j] > z[argmax]) argmax = j;
      const float zmax = z[argmax];
      float sum = 0;
      for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - zmax);
      loss += static_cast<double>(zmax + std::log(sum) - z[label]);
      correct += argmax == label;
      if (grad) {
        const float scale = inv_batch / sum;
        for (int j = 0; j < classes; ++j) z[j] = std::exp(z[j] - zmax) * scale;
        z[label] -= inv_batch;
      }
    }
    return {loss / batch, correct, batch};
  }

  // Gradients of every weight and bias into grads_, from dlogits in acts_.back().
  void backward(const float* x, int batch) {
    const int num_layers = shape().num_layers();
    float* dz = acts_.back().data();  // (B, out_l): dL/d(pre-activation) of layer l
    int next = 0;
    for (int l = num_layers - 1; l >= 0; --l) {
      const int n_in = shape().layer_in(l), n_out = shape().layer_out(l);
      ConstMatMap X(l == 0 ? x : acts_[l - 1].data(), batch, n_in);
      ConstMatMap dZ(dz, batch, n_out);
      MatMap dW(grads_.data() + layout().weights(l).offset, n_in, n_out);
      RowMap db(grads_.data() + layout().biases(l).offset, n_out);
      gemm(dW, X.transpose(), dZ);
      db.setZero();
      for (int i = 0; i < batch; ++i) db += dZ.row(i);
      if (l == 0) break;
      // dX = dZ · W^T, then through the activation of layer l-1 (Y = its output).
      ConstMatMap W(params_.data() + layout().weights(l).offset, n_in, n_out);
      MatMap dX(dbuf_[next].data(), batch, n_in);
      gemm(dX, dZ, W.transpose());
      auto Y = ConstMatMap(acts_[l - 1].data(), batch, n_in).array();
      if (shape().activation == Activation::kRelu)
        dX = (Y > 0.0f).select(dX.array(), 0.0f).matrix();
      else
        dX.array() *= Y * (1.0f - Y);
      dz = dbuf_[next].data();
      next ^= 1;
    }
  }

  void sgd_update(float lr) {
    Eigen::Map<Eigen::VectorXf> p(params_.data(), static_cast<Eigen::Index>(params_.size()));
    Eigen::Map<const Eigen::VectorXf> g(grads_.data(), static_cast<Eigen::Index>(grads_.size()));
    p -= lr * g;
  }

  std::vector<float> params_;             // (P) layout()
  std::vector<float> grads_;              // (P) layout()
  int rows_;                              // max(max_batch, eval_batch)
  std::vector<std::vector<float>> acts_;  // per layer (rows_, out_l)
  std::vector<float> dbuf_[2];            // (max_batch, widest hidden) ping-pong
  const float* x_ = nullptr;              // staged batch (B, inputs)
  const int32_t* labels_ = nullptr;       // (B)
  int batch_ = 0;
  StepStats stats_;
};

}  // namespace

std::unique_ptr<MlpEngine> PS_CPU_ENGINE_FACTORY(const MlpShape& shape,
                                                 const EngineOptions& options) {
  return std::make_unique<CpuEngine>(shape, options);
}

}  // namespace ps::detail
