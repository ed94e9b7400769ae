// psd's update rate: how fast a shard applies a gradient with SGD and Adam,
// as updates per second and bytes touched per second, against the machine's
// streaming memory bandwidth measured in the same run: an in-place a*x+y on
// one thread (y += a*x: two arrays read, one written, counted as 3 streams,
// the same accounting as for the updates). Each optimizer three ways: its
// NaN/Inf check first (a read-only pass over the values, slots and gradient,
// counted in the streams), as psd applies a gradient too large for the
// optimizer's safe bound, and Adam always; with the gradient known to be
// within that bound (SGD and Adagrad only), as psd applies those by
// default, no check pass; and unchecked, as with psd --allow_nonfinite.
// Then embedding-table rows: how fast a table applies pushed rows with each
// row-wise optimizer (SGD, Adagrad, LazyAdam, FTRL; and Adagrad on a dynamic
// table at its row limit with LRU eviction, whose every row touched moves in
// the LRU list), in requests of 8,192 random ids as psd gets them, against
// an in-memory scatter-add of the same rows into a plain array on one
// thread, measured in turn with it.
//
//   build/bench/apply_bench                  # 1M and 64M floats; a 10^6 x 32 table
//   build/bench/apply_bench --sizes 1M,16M --reps 20
//   build/bench/apply_bench --sizes "" --table_rows 10000000   # rows only, 10^7 x 32
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <sys/mman.h>

#include <cstring>
#include <random>
#include <stdexcept>

#include "ps/flag_parsing.h"
#include "ps/embedding.h"
#include "ps/trainer_flags.h"
#include "ps/tensor_spec.h"
#include "server/embedding/embedding_table.h"
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

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// In memory, one thread: table[ids[i]] -= 0.01 * g[i], over a plain array in
// 2 MiB pages (as psd's tables): the rows' own traffic, with no optimizer.
__attribute__((noinline)) void scatter_sgd(float* table, const uint64_t* ids, std::size_t n,
                                           uint32_t dim, const float* g) {
  for (std::size_t i = 0; i < n; ++i) {
    float* __restrict row = table + ids[i] * dim;
    const float* __restrict gi = g + i * dim;
    for (uint32_t j = 0; j < dim; ++j) row[j] -= 0.01f * gi[j];
  }
}

// Table pushes of `request` random ids at a time, per row-wise optimizer,
// each block of requests after a block of the in-memory scatter-add.
void bench_rows(uint64_t rows, uint32_t dim, int reps) {
  constexpr std::size_t kRequest = 8192;  // ids in a 1 MiB request of 32-float rows
  constexpr int kBlock = 8;               // requests per block, in turn with the reference
  const std::size_t bytes = rows * dim * sizeof(float);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  madvise(p, bytes, MADV_HUGEPAGE);
  float* plain = static_cast<float*>(p);
  std::fill_n(plain, rows * dim, 0.5f);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> ids(kRequest);
  std::vector<float> g(kRequest * dim, 1e-3f);
  std::printf("\nrows: a %llu x %u table, requests of %zu random ids, median of %d\n",
              (unsigned long long)rows, dim, kRequest, reps * kBlock);
  std::printf("%-26s %7s %12s %16s %14s\n", "optimizer", "arrays", "M rows/s", "scatter-add M/s",
              "of scatter-add");
  struct Case {
    const char* name;
    ps::RowOptimizerConfig config;
    int arrays;                // row-sized arrays read and written per row: the row and its slots
    bool dynamic_lru = false;  // a dynamic table at its row limit, LRU eviction on
  };
  for (const Case& c :
       {Case{"sgd", ps::RowOptimizerConfig::sgd(0.01f), 1},
        Case{"adagrad", ps::RowOptimizerConfig::adagrad(0.01f), 2},
        Case{"lazy_adam", ps::RowOptimizerConfig::lazy_adam(1e-3f), 3},
        Case{"ftrl", ps::RowOptimizerConfig::ftrl(0.01f, 1e-3f, 1e-3f), 3},
        Case{"adagrad, dynamic with LRU", ps::RowOptimizerConfig::adagrad(0.01f), 2, true}}) {
    ps::TableSpec spec{.name = "t", .dim = dim, .rows = rows, .optimizer = c.config};
    if (c.dynamic_lru) {
      spec.dynamic = true;
      spec.placement = ps::TablePlacement::kHash;
      spec.row_limit = rows;
      spec.on_limit = ps::OnRowLimit::kEvictLru;
    }
    ps::EmbeddingTable table(spec, 0, 1);
    {  // every row touched once, so that the measured pushes find them in memory
      std::vector<uint64_t> all(kRequest);
      std::vector<float> zero(kRequest * dim, 0.0f);
      for (uint64_t first = 0; first < rows; first += kRequest) {
        const std::size_t n = std::min<uint64_t>(kRequest, rows - first);
        for (std::size_t i = 0; i < n; ++i) all[i] = first + i;
        table.push(std::span(all.data(), n), std::span<const float>(zero.data(), n * dim), 1.0f);
      }
    }
    std::vector<double> ours, reference;
    for (int r = 0; r < reps; ++r) {
      for (int k = 0; k < kBlock; ++k) {
        for (auto& id : ids) id = rng() % rows;
        const auto t0 = Clock::now();
        scatter_sgd(plain, ids.data(), kRequest, dim, g.data());
        reference.push_back(seconds_since(t0));
      }
      for (int k = 0; k < kBlock; ++k) {
        for (auto& id : ids) id = rng() % rows;
        const auto t0 = Clock::now();
        if (!table.push_if_finite(ids, g, 1.0f, 0)) throw std::runtime_error("push refused");
        ours.push_back(seconds_since(t0));
      }
    }
    const double rate = kRequest / median(ours), limit = kRequest / median(reference);
    std::printf("%-26s %7d %12.2f %16.2f %13.0f%%\n", c.name, c.arrays, rate / 1e6, limit / 1e6,
                100.0 * rate / limit);
  }
  munmap(p, bytes);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"apply_bench: psd's optimizer update rate against streaming memory bandwidth"};
  std::string sizes_flag = "1M,64M";
  int reps = 15;
  app.add_option("--sizes", sizes_flag, "tensor sizes in floats")->capture_default_str();
  app.add_option("--reps", reps, "repetitions (median reported)")->capture_default_str();
  uint64_t table_rows = 1'000'000;
  uint32_t dim = 32;
  int row_reps = 16;
  app.add_option("--table_rows", table_rows, "rows of the embedding table (0: no rows section)")
      ->capture_default_str();
  app.add_option("--dim", dim, "floats per table row")->capture_default_str();
  app.add_option("--row_reps", row_reps,
                 "blocks of 8 requests per optimizer, in turn with the "
                 "in-memory reference")
      ->capture_default_str();
  PS_PARSE_FLAGS(app, argc, argv);

  std::vector<std::size_t> sizes;
  for (const std::string& s : ps::split_list(sizes_flag)) sizes.push_back(parse_count(s));
  if (sizes.empty() && table_rows == 0) return 0;

  if (!sizes.empty())
    std::printf("%-10s %-18s %7s %12s %12s %10s %14s\n", "floats", "opt", "streams", "updates/s",
                "GB/s touched", "axpy GB/s", "of bandwidth");
  for (std::size_t n : sizes) {
    const double triad = axpy_bytes_per_second(n, reps);
    struct Case {
      const char* name;
      ps::OptimizerConfig config;
      int arrays;        // float arrays the update reads or writes per element
      int check_arrays;  // float arrays its NaN/Inf check reads per element
    };
    for (const Case& c : {Case{"sgd", ps::OptimizerConfig::sgd(1e-3f), 3, 2},
                          Case{"adagrad", ps::OptimizerConfig::adagrad(1e-3f), 5, 3},
                          Case{"adam", ps::OptimizerConfig::adam(1e-3f), 7, 4}}) {
      ps::TensorSpec spec{.name = "t", .shape = {n}, .optimizer = c.config};
      ps::StoredTensor tensor(0, spec, std::nullopt);
      const float g = 1e-3f;
      std::vector<float> grad(n, g);
      tensor.apply(grad, 1.0f);  // warm: first touch of slots
      enum class Way { kChecked, kInBound, kUnchecked };
      for (const Way way : {Way::kChecked, Way::kInBound, Way::kUnchecked}) {
        if (way == Way::kInBound && !tensor.within_safe_bound(g, 1.0f)) continue;
        ps::KnownUpdate known;
        if (way == Way::kInBound) known.grad_max = g;  // as psd knows it from its arrival check
        std::vector<double> t;
        for (int r = 0; r < reps; ++r) {
          auto t0 = Clock::now();
          if (!tensor.apply(grad, 1.0f, way != Way::kUnchecked, known))
            throw std::runtime_error("update refused");
          t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        const double s = median(t);
        const int streams = c.arrays + (way == Way::kChecked ? c.check_arrays : 0);
        const double bytes = double(streams) * n * sizeof(float) / s;
        const std::string name = std::string(c.name) + (way == Way::kChecked   ? ", checked"
                                                        : way == Way::kInBound ? ", in bound"
                                                                               : ", unchecked");
        std::printf("%-10zu %-18s %7d %12.1f %12.2f %10.2f %13.0f%%\n", n, name.c_str(), streams,
                    1.0 / s, bytes / 1e9, triad / 1e9, 100.0 * bytes / triad);
      }
    }
  }
  if (table_rows > 0) bench_rows(table_rows, dim, row_reps);
  return 0;
}
