// mlp_bench: time the MLP engines.
//
//   mlp_bench          GPU (when built with CUDA and a device exists)
//   mlp_bench --cpu    CPU engine: time per step, samples/s (784-100-10, batch 100);
//                      the wide & deep head (LogisticMlp, 429-256-128-1, batch 512)
//   PS_CPU_ISA=avx2 mlp_bench --cpu     the same with the AVX2 + FMA build (or baseline, avx512)
//   mlp_bench --quick  fewer repetitions
//
// GPU: one training step (forward + backward + SGD on the device, CUDA graph)
// for 784-100-10 at batch 100/1000/10000 and 784-1024-1024-10 at batch
// 100/10000/100000, FP32 and TF32, as ms and TFLOP/s next to a large cuBLAS
// SGEMM measured in the same run; for the big net the sum of its cuBLAS GEMMs
// alone vs the full step; parameter upload/download in GB/s; the wide & deep
// head (CudaLogisticMlp, 429-256-128-1, batch 512) in FP32 and TF32, its host
// copies included as a trainer calls it, comparable with the --cpu figure.
// Medians of several repetitions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ps/embedding_bag.h"
#include "ps/logistic_mlp.h"
#include "bench/fma_peak.h"
#include "ps/mlp.h"
#include "ps_config.h"

#if PS_HAVE_CUDA
#include "kernels/cuda_check.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over reps of (time of `iters` calls) / iters, in seconds; iters is
// picked so one repetition takes about target seconds.
double time_per_call(const std::function<void()>& call, const std::function<void()>& sync, int reps,
                     double target = 0.05) {
  call();  // warm-up (and graph capture)
  sync();
  auto t0 = Clock::now();
  call();
  sync();
  const double once = std::max(seconds_since(t0), 1e-7);
  const int iters = std::clamp(static_cast<int>(target / once), 1, 20000);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) call();
    sync();
    times.push_back(seconds_since(t0) / iters);
  }
  return median(times);
}

ps::MlpShape make_shape(std::vector<int> hidden) {
  ps::MlpShape s;
  s.hidden = std::move(hidden);
  return s;
}

struct Data {
  std::vector<float> x;
  std::vector<int32_t> labels;
};

Data random_data(const ps::MlpShape& shape, int n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Data d;
  d.x.resize(static_cast<size_t>(n) * shape.inputs);
  for (float& v : d.x) v = pixel(rng);
  d.labels.resize(n);
  for (int i = 0; i < n; ++i) d.labels[i] = static_cast<int32_t>(rng() % shape.classes);
  return d;
}

// Floating-point operations of one training step: forward, weight gradients,
// and input gradients of every layer but the first.
double step_flops(const ps::MlpShape& shape, int batch) {
  double macs = 0;
  for (int l = 0; l < shape.num_layers(); ++l) {
    const double w = double(shape.layer_in(l)) * shape.layer_out(l);
    macs += (l == 0 ? 2 : 3) * w;
  }
  return 2.0 * macs * batch;
}

// ctr_trainer's dense head: 13 dense features + 26 fields x 16, at its
// default batch, with random inputs and labels.
struct HeadBatch {
  ps::MlpShape shape{.inputs = 13 + 26 * 16, .hidden = {256, 128}, .classes = 1};
  int batch = 512;
  std::vector<float> x, labels, dx, dlogit;
  HeadBatch() {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    x.resize(static_cast<size_t>(batch) * shape.inputs);
    labels.resize(batch);
    for (float& v : x) v = u(rng);
    for (float& v : labels) v = u(rng) < 0.25f ? 1.0f : 0.0f;
    dx.resize(x.size());
    dlogit.resize(batch);
  }
  // Forward, weight gradients and input gradients: 3 products per layer.
  double flops() const {
    double f = 0;
    for (int l = 0; l < shape.num_layers(); ++l)
      f += 3.0 * 2.0 * batch * shape.layer_in(l) * shape.layer_out(l);
    return f;
  }
};

// ctr_trainer's deep embedding bags at its defaults: 512 examples x 26
// fields, one row of 16 floats each, from the batch's 6,470 distinct rows
// (its SHARES line's deep_rows_per_step).
struct BagBatch {
  static constexpr int dim = 16;
  int distinct = 6470;
  std::vector<float> rows, out, grad_out, grad_rows;
  std::vector<int64_t> offsets = ps::fixed_offsets(512 * 26, 1);
  std::vector<int32_t> index;
  BagBatch() {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    rows.resize(static_cast<size_t>(distinct) * dim);
    for (float& v : rows) v = u(rng);
    index.resize(offsets.back());
    for (int32_t& i : index) i = static_cast<int32_t>(rng() % distinct);
    out.resize(index.size() * dim);
    grad_out.resize(out.size());
    for (float& v : grad_out) v = u(rng);
    grad_rows.resize(rows.size());
  }
  // The limit: the same rows gathered by memcpy of a size the compiler
  // knows, the bytes the forward moves.
  void gather() {
    for (size_t j = 0; j < index.size(); ++j)
      std::memcpy(out.data() + j * dim, rows.data() + size_t(index[j]) * dim, dim * sizeof(float));
  }
};

// One compute_gradients (with dx and dlogit) of `head`, LogisticMlp or CudaLogisticMlp.
template <class Head>
double time_head_step(Head& head, HeadBatch& h, int reps) {
  ps::init_params(h.shape, head.params(), 1);
  return time_per_call([&] { head.compute_gradients(h.x, h.labels, {}, h.dx, h.dlogit); }, [] {},
                       reps, 0.3);
}

void bench_cpu(int reps) {
  const ps::MlpShape shape = make_shape({100});
  const int batch = 100;
  const Data data = random_data(shape, batch * 2);
  ps::EngineOptions opt;
  opt.prefer_gpu = false;
  opt.max_batch = batch;
  auto engine = ps::make_cpu_engine(shape, opt);
  ps::init_params(shape, engine->host_params(), 1);
  std::printf("CPU engine: %s, %s\n", shape.to_string().c_str(),
              engine->device_description().c_str());
  std::span<const float> x(data.x.data(), static_cast<size_t>(batch) * shape.inputs);
  std::span<const int32_t> y(data.labels.data(), batch);
  auto nop = [] {};
  const double grad_s = time_per_call([&] { engine->compute_gradients(x, y); }, nop, reps, 0.3);
  const double train_s = time_per_call([&] { engine->train_step(x, y, 0.01f); }, nop, reps, 0.3);
  std::printf("  batch %d, compute_gradients: %8.3f ms/step  %9.0f samples/s  %6.1f GFLOP/s\n",
              batch, grad_s * 1e3, batch / grad_s, step_flops(shape, batch) / grad_s * 1e-9);
  // The physical limit: this core's FMA rate with the build's vectors.
  const ps::detail::CpuIsa isa = ps::detail::cpu_isa();
  const double peak = fma_peak_gflops(isa);
  if (peak > 0)
    std::printf("  this core's FMA peak (%s):   %6.1f GFLOP/s; the step reaches %.2f of it\n",
                ps::detail::cpu_isa_name(isa), peak,
                step_flops(shape, batch) / grad_s * 1e-9 / peak);
  std::printf("  batch %d, train_step (+SGD):  %8.3f ms/step  %9.0f samples/s\n", batch,
              train_s * 1e3, batch / train_s);

  // Both cores: two towers, 100 samples each (one push of 200 samples).
  opt.max_batch = batch;
  ps::Towers towers = ps::Towers::make(shape, opt, 2);
  ps::init_params(shape, towers.host_params(), 1);
  towers.upload_params();
  const double towers_s =
      time_per_call([&] { towers.compute_gradients(data.x, data.labels); }, nop, reps, 0.3);
  std::printf("  2 CPU towers, batch %d:        %8.3f ms/step  %9.0f samples/s\n", 2 * batch,
              towers_s * 1e3, 2 * batch / towers_s);

  const Data eval = random_data(shape, 10000);
  const double eval_s =
      time_per_call([&] { engine->evaluate(eval.x, eval.labels); }, nop, reps, 0.3);
  std::printf("  evaluate 10000 samples:        %8.3f ms       %9.0f samples/s\n", eval_s * 1e3,
              10000 / eval_s);

  // The wide & deep head, its input gradient included (the embedding bags below need it).
  HeadBatch h;
  ps::LogisticMlp head(h.shape, h.batch);
  const double head_s = time_head_step(head, h, reps);
  std::printf("wide & deep head (LogisticMlp): %s, batch %d\n", h.shape.to_string().c_str(),
              h.batch);
  std::printf("  compute_gradients (with dx):   %8.3f ms/step  %9.0f samples/s  %6.1f GFLOP/s\n",
              head_s * 1e3, h.batch / head_s, h.flops() / head_s * 1e-9);
  if (peak > 0) std::printf("  (%.2f of this core's FMA peak)\n", h.flops() / head_s * 1e-9 / peak);

  BagBatch b;
  const double gather_s = time_per_call([&] { b.gather(); }, nop, reps, 0.3);
  const double fwd_s = time_per_call(
      [&] {
        ps::embedding_bag_forward(b.rows, b.dim, b.offsets, b.index, ps::BagCombiner::kSum, b.out);
      },
      nop, reps, 0.3);
  const double bwd_s = time_per_call(
      [&] {
        ps::embedding_bag_backward(b.grad_out, b.dim, b.offsets, b.index, ps::BagCombiner::kSum,
                                   b.grad_rows);
      },
      nop, reps, 0.3);
  std::printf(
      "embedding bags (ctr_trainer's deep part): %zu bags of one row of %d floats, "
      "from %d rows\n",
      b.index.size(), b.dim, b.distinct);
  std::printf("  the same rows gathered by memcpy: %8.3f ms (the limit)\n", gather_s * 1e3);
  std::printf("  forward:                          %8.3f ms (%.2f of the limit)\n", fwd_s * 1e3,
              gather_s / fwd_s);
  std::printf("  backward (zeroed, scatter-added): %8.3f ms (%.2f of the limit)\n", bwd_s * 1e3,
              gather_s / bwd_s);
}

#if PS_HAVE_CUDA

struct GpuTimer {
  cudaEvent_t start, stop;
  GpuTimer() {
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
  }
  ~GpuTimer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  // Median of reps, each averaging `iters` back-to-back launches, in seconds.
  double time(const std::function<void()>& launch, int reps, int iters) {
    launch();
    cudaCheck(cudaDeviceSynchronize());
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      cudaCheck(cudaEventRecord(start));
      for (int i = 0; i < iters; ++i) launch();
      cudaCheck(cudaEventRecord(stop));
      cudaCheck(cudaEventSynchronize(stop));
      float ms = 0;
      cudaCheck(cudaEventElapsedTime(&ms, start, stop));
      t.push_back(ms * 1e-3 / iters);
    }
    return median(t);
  }
};

struct DeviceBuffer {
  float* p = nullptr;
  explicit DeviceBuffer(size_t n) {
    cudaCheck(cudaMalloc(&p, n * sizeof(float)));
    cudaCheck(cudaMemset(p, 0, n * sizeof(float)));
  }
  ~DeviceBuffer() { cudaFree(p); }
};

// Row-major C (m, n) = A (m, k) · B (k, n), as the engine calls cuBLAS.
double time_sgemm(cublasHandle_t h, int m, int n, int k, int reps) {
  DeviceBuffer a(size_t(m) * k), b(size_t(k) * n), c(size_t(m) * n);
  GpuTimer timer;
  const float one = 1, zero = 0;
  return timer.time(
      [&] {
        cublasCheck(
            cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b.p, n, a.p, k, &zero, c.p, n));
      },
      reps, 5);
}

// The GEMMs of one training step of `shape` at `batch`, each timed alone.
double time_step_gemms(cublasHandle_t h, const ps::MlpShape& shape, int batch, int reps) {
  const float one = 1, zero = 0;
  double total = 0;
  GpuTimer timer;
  for (int l = 0; l < shape.num_layers(); ++l) {
    const int in = shape.layer_in(l), out = shape.layer_out(l);
    DeviceBuffer x(size_t(batch) * in), w(size_t(in) * out), y(size_t(batch) * out),
        dw(size_t(in) * out), dx(size_t(batch) * in);
    const int iters = 3;
    const double fwd = timer.time(
        [&] {
          cublasCheck(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, out, batch, in, &one, w.p, out, x.p,
                                  in, &zero, y.p, out));
        },
        reps, iters);
    const double wgrad = timer.time(
        [&] {
          cublasCheck(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, out, in, batch, &one, y.p, out, x.p,
                                  in, &zero, dw.p, out));
        },
        reps, iters);
    double xgrad = 0;
    if (l > 0)
      xgrad = timer.time(
          [&] {
            cublasCheck(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, in, batch, out, &one, w.p, out,
                                    y.p, out, &zero, dx.p, in));
          },
          reps, iters);
    std::printf(
        "      layer %d GEMMs: forward %8.3f ms, weight grad %8.3f ms, input grad %8.3f ms\n", l,
        fwd * 1e3, wgrad * 1e3, xgrad * 1e3);
    total += fwd + wgrad + xgrad;
  }
  return total;
}

void bench_gpu(int reps) {
  cublasHandle_t h;
  cublasCheck(cublasCreate(&h));
  const int n = 8192;
  const double gemm_flops = 2.0 * n * n * n;
  cublasCheck(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  const double peak_fp32 = gemm_flops / time_sgemm(h, n, n, n, reps);
  cublasCheck(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
  const double peak_tf32 = gemm_flops / time_sgemm(h, n, n, n, reps);
  std::printf("cuBLAS SGEMM %dx%dx%d: FP32 %.1f TFLOP/s, TF32 %.1f TFLOP/s\n\n", n, n, n,
              peak_fp32 * 1e-12, peak_tf32 * 1e-12);

  struct Case {
    std::vector<int> hidden;
    int batch;
  };
  const std::vector<Case> cases = {{{100}, 100},          {{100}, 1000},
                                   {{100}, 10000},        {{1024, 1024}, 100},
                                   {{1024, 1024}, 10000}, {{1024, 1024}, 100000}};
  for (bool tf32 : {false, true}) {
    cublasCheck(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    const double peak = tf32 ? peak_tf32 : peak_fp32;
    std::printf("%s training step (forward + backward + SGD on the device, CUDA graph):\n",
                tf32 ? "TF32" : "FP32");
    for (const Case& c : cases) {
      const ps::MlpShape shape = make_shape(c.hidden);
      ps::EngineOptions opt;
      opt.max_batch = c.batch;
      opt.eval_batch = 1;
      opt.tf32 = tf32;
      auto engine = ps::make_cuda_engine(shape, opt);
      ps::init_params(shape, engine->host_params(), 1);
      engine->upload_params();
      const Data data = random_data(shape, c.batch);
      engine->prefetch(data.x, data.labels);  // stays staged: every step reuses it
      const double s = time_per_call([&] { engine->start_train_step(0.001f); },
                                     [&] { engine->finish_step(); }, reps);
      const double flops = step_flops(shape, c.batch);
      std::printf(
          "  %-22s batch %6d: %9.4f ms/step  %8.2f TFLOP/s (%4.1f%% of SGEMM)  %10.0f samples/s\n",
          shape.to_string().c_str(), c.batch, s * 1e3, flops / s * 1e-12, 100 * flops / s / peak,
          c.batch / s);
      if (c.hidden.size() == 2 && c.batch == 100000) {
        const double gemms = time_step_gemms(h, shape, c.batch, reps);
        std::printf(
            "    its cuBLAS GEMMs alone: %.3f ms; full step %.3f ms = %.1f%% over the GEMMs\n",
            gemms * 1e3, s * 1e3, 100 * (s / gemms - 1));
      }
    }
    std::printf("\n");
  }

  // Parameter vector transfers (pinned host buffers), the big net.
  const ps::MlpShape big = make_shape({1024, 1024});
  auto engine = ps::make_cuda_engine(big, ps::EngineOptions{.max_batch = 1, .eval_batch = 1});
  const double bytes = double(engine->layout().total()) * sizeof(float);
  auto nop = [] {};
  const double up = time_per_call([&] { engine->upload_params(); }, nop, reps, 0.1);
  const double down = time_per_call([&] { engine->download_params(); }, nop, reps, 0.1);
  std::printf(
      "parameter vector %zu floats (%.1f MB): upload %.1f GB/s (%.3f ms), download %.1f GB/s (%.3f "
      "ms)\n",
      engine->layout().total(), bytes * 1e-6, bytes / up * 1e-9, up * 1e3, bytes / down * 1e-9,
      down * 1e3);
  cublasDestroy(h);

  // The wide & deep head as ctr_trainer --num_gpus 1 calls it: params and the
  // batch uploaded, gradients, dx and dlogit downloaded, every step.
  HeadBatch hb;
  std::printf("\nwide & deep head (CudaLogisticMlp): %s, batch %d, host copies included\n",
              hb.shape.to_string().c_str(), hb.batch);
  for (bool tf32 : {false, true}) {
    ps::CudaLogisticMlp head(hb.shape, hb.batch, 0, tf32);
    const double s = time_head_step(head, hb, reps);
    std::printf("  %s compute_gradients (with dx): %8.3f ms/step  %9.0f samples/s  %6.1f GFLOP/s\n",
                tf32 ? "TF32" : "FP32", s * 1e3, hb.batch / s, hb.flops() / s * 1e-9);
  }
}

#endif  // PS_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
  bool cpu = false;
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cpu") == 0) {
      cpu = true;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      reps = 3;
    } else {
      std::fprintf(stderr, "usage: %s [--cpu] [--quick]\n", argv[0]);
      return 2;
    }
  }
  try {
    if (!cpu && ps::cuda_device_count() == 0) {
      std::printf("no CUDA device (or built without CUDA): running the CPU engine\n");
      cpu = true;
    }
    if (cpu) {
      bench_cpu(reps);
    } else {
#if PS_HAVE_CUDA
      bench_gpu(reps);
#endif
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
