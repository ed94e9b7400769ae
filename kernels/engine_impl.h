// Internal: constructors of the concrete engines, behind make_*_engine().
#pragma once

#include <memory>

#include "ps/mlp.h"

namespace ps::detail {

std::unique_ptr<MlpEngine> new_cpu_engine(const MlpShape& shape, const EngineOptions& options);

// Defined in cuda_engine.cc, built only when PS_HAVE_CUDA.
std::unique_ptr<MlpEngine> new_cuda_engine(const MlpShape& shape, const EngineOptions& options);
int cuda_device_count_impl();

}  // namespace ps::detail
