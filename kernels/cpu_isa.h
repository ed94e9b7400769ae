// Internal: which build of the CPU arithmetic (the MLP engine, the wide &
// deep head) runs. kernels/meson.build compiles it for the baseline ISA and,
// on x86-64, again for AVX2 + FMA and for AVX-512; the best one this CPU runs
// is chosen, or the one PS_CPU_ISA names (tests, comparisons).
#pragma once

namespace ps::detail {

enum class CpuIsa { kBaseline, kAvx2, kAvx512 };

// PS_CPU_ISA=baseline|avx2|avx512 if set, else the best build this CPU runs.
// Throws ConfigError for a value that is unknown, or names a build this
// binary lacks or this CPU cannot run: a comparison must not silently
// measure another build.
CpuIsa cpu_isa();

// "baseline", "avx2" or "avx512".
const char* cpu_isa_name(CpuIsa isa);

}  // namespace ps::detail
