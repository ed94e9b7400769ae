// psd's update rate: how fast a shard applies a gradient with SGD and Adam,
// as updates per second and bytes touched per second, against the machine's
// streaming memory bandwidth measured in the same run: an in-place a*x+y on
// one thread (y += a*x: two arrays read, one written, counted as 3 streams,
// the same accounting as for the updates).
//
//   build/bench/apply_bench                  # 1M and 64M floats
//   build/bench/apply_bench --sizes 1M,16M --reps 20
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ps/trainer_flags.h"
#include "ps/tensor_spec.h"
#include "server/tensor_store.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// y += s * x over n floats: 3 streams of n floats per pass.
__attribute__((noinline)) void axpy(float* __restrict y, const float* __restrict x, float s,
                                    std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += s * x[i];
}

double axpy_bytes_per_second(std::size_t n, int reps) {
  std::vector<float> x(n, 1.0f), y(n, 2.0f);
  axpy(y.data(), x.data(), 1e-6f, n);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    axpy(y.data(), x.data(), 1e-6f, n);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  volatile float sink = y[n / 2];
  (void)sink;
  return 3.0 * n * sizeof(float) / median(t);
}

std::size_t parse_count(const std::string& s) {
  std::size_t mult = 1;
  std::string num = s;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'K')) {
    mult = s.back() == 'M' ? (1u << 20) : (1u << 10);
    num.pop_back();
  }
  return std::stoull(num) * mult;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"apply_bench: psd's optimizer update rate against streaming memory bandwidth"};
  std::string sizes_flag = "1M,64M";
  int reps = 15;
  app.add_option("--sizes", sizes_flag, "tensor sizes in floats")->capture_default_str();
  app.add_option("--reps", reps, "repetitions (median reported)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<std::size_t> sizes;
  for (const std::string& s : ps::split_list(sizes_flag)) sizes.push_back(parse_count(s));

  std::printf("%-10s %-6s %12s %12s %10s %14s\n", "floats", "opt", "updates/s", "GB/s touched",
              "axpy GB/s", "of bandwidth");
  for (std::size_t n : sizes) {
    const double triad = axpy_bytes_per_second(n, reps);
    struct Case {
      const char* name;
      ps::OptimizerConfig config;
      int arrays;  // float arrays read or written per element
    };
    for (const Case& c : {Case{"sgd", ps::OptimizerConfig::sgd(1e-3f), 3},
                          Case{"adam", ps::OptimizerConfig::adam(1e-3f), 7}}) {
      ps::TensorSpec spec{.name = "t", .shape = {n}, .optimizer = c.config};
      ps::StoredTensor tensor(0, spec, std::nullopt);
      std::vector<float> grad(n, 1e-3f);
      tensor.apply(grad, 1.0f);  // warm: first touch of slots
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        auto t0 = Clock::now();
        tensor.apply(grad, 1.0f);
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      const double s = median(t);
      const double bytes = double(c.arrays) * n * sizeof(float) / s;
      std::printf("%-10zu %-6s %12.1f %12.2f %10.2f %13.0f%%\n", n, c.name, 1.0 / s, bytes / 1e9,
                  triad / 1e9, 100.0 * bytes / triad);
    }
  }
  return 0;
}
