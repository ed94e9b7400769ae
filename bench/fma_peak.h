// This core's peak float32 rate: independent fused multiply-adds on
// registers, no memory, with the vectors of the CPU engine's build (the
// physical limit mlp_bench --cpu reports the engine against).
//
//   double gflops = fma_peak_gflops(ps::detail::cpu_isa());   // 0: the baseline build
#pragma once

#include "kernels/cpu_isa.h"

// For the build cpu_isa() chose; 0 for the baseline build, which has no FMA
// to measure.
double fma_peak_gflops(ps::detail::CpuIsa isa);
