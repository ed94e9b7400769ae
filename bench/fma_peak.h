// This core's peak float32 rate: independent fused multiply-adds on
// registers, no memory, with the vectors of the CPU engine's build (the
// physical limit mlp_bench --cpu reports the engine against).
//
//   double gflops = fma_peak_gflops("AVX-512");   // or "AVX2+FMA"; 0: no FMA build
#pragma once

#include <string_view>

// `simd` as the CPU engine's device_description() names its build; 0 for
// the baseline build, which has no FMA to measure.
double fma_peak_gflops(std::string_view simd);
