#include "kernels/cpu_isa.h"

#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "ps/errors.h"

namespace ps::detail {
namespace {

// What this binary has and this CPU runs (test/meson.build asks the same).
bool can_run(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return true;
    case CpuIsa::kAvx2:
#if PS_HAVE_CPU_AVX2
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if PS_HAVE_CPU_AVX512
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return "baseline";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuIsa cpu_isa() {
  constexpr CpuIsa kAll[] = {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kBaseline};
  const char* asked = std::getenv("PS_CPU_ISA");
  if (asked == nullptr || *asked == '\0') {
    for (CpuIsa isa : kAll)
      if (can_run(isa)) return isa;
  }
  for (CpuIsa isa : kAll) {
    if (std::string_view(asked) != cpu_isa_name(isa)) continue;
    if (!can_run(isa))
      throw ConfigError(
          fmt::format("PS_CPU_ISA={}: this build or this CPU lacks {}", asked,
                      isa == CpuIsa::kAvx2 ? "AVX2 + FMA" : "AVX-512 (F, DQ, BW, VL)"));
    return isa;
  }
  throw ConfigError(
      fmt::format("PS_CPU_ISA={}: unknown (expected baseline, avx2 or avx512)", asked));
}

}  // namespace ps::detail
