// Internal: constructors of the concrete engines, behind make_*_engine().
#pragma once

#include <memory>

#include "ps/mlp.h"

namespace ps::detail {

// cpu_engine.cc, compiled once for the baseline ISA and, on x86-64, once
// more with AVX2 + FMA and with AVX-512 (kernels/cpu_isa.h).
std::unique_ptr<MlpEngine> new_cpu_engine_baseline(const MlpShape& shape,
                                                   const EngineOptions& options);
std::unique_ptr<MlpEngine> new_cpu_engine_avx2(const MlpShape& shape, const EngineOptions& options);
std::unique_ptr<MlpEngine> new_cpu_engine_avx512(const MlpShape& shape,
                                                 const EngineOptions& options);

// Defined in cuda_engine.cc, built only when PS_HAVE_CUDA.
std::unique_ptr<MlpEngine> new_cuda_engine(const MlpShape& shape, const EngineOptions& options);
int cuda_device_count_impl();

}  // namespace ps::detail
