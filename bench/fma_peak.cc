#include "bench/fma_peak.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// Enough independent chains to cover the FMA latency on every port; the
// result is consumed so that the loop is kept.
constexpr int kChains = 12;
constexpr long kIters = 2'000'000;

template <typename F>
double best_seconds(F&& f) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

#if defined(__x86_64__)
volatile float g_sink;

__attribute__((target("avx512f"))) float fma_chains_avx512(long iters) {
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (long i = 0; i < iters; ++i)
    for (int k = 0; k < kChains; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  __m512 sum = acc[0];
  for (int k = 1; k < kChains; ++k) sum = _mm512_add_ps(sum, acc[k]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0];
}

__attribute__((target("avx2,fma"))) float fma_chains_avx2(long iters) {
  __m256 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm256_set1_ps(static_cast<float>(k));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (long i = 0; i < iters; ++i)
    for (int k = 0; k < kChains; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  __m256 sum = acc[0];
  for (int k = 1; k < kChains; ++k) sum = _mm256_add_ps(sum, acc[k]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0];
}
#endif

}  // namespace

double fma_peak_gflops(ps::detail::CpuIsa isa) {
#if defined(__x86_64__)
  if (isa == ps::detail::CpuIsa::kAvx512)
    return 2.0 * 16 * kChains * kIters * 1e-9 /
           best_seconds([] { g_sink = fma_chains_avx512(kIters); });
  if (isa == ps::detail::CpuIsa::kAvx2)
    return 2.0 * 8 * kChains * kIters * 1e-9 /
           best_seconds([] { g_sink = fma_chains_avx2(kIters); });
#endif
  (void)isa;
  return 0.0;
}
