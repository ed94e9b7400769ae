// cudaCheck / cublasCheck: every CUDA runtime and cuBLAS call goes through
// one of these; a failure throws ps::Error (a std::runtime_error) naming the
// call, the error, and the file and line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "ps/errors.h"

namespace ps::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file,
                                          int line) {
  throw Error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
              ") in " + expr + " at " + file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* expr,
                                            const char* file, int line) {
  throw Error(std::string("cuBLAS error ") + cublasGetStatusName(status) + " (" +
              cublasGetStatusString(status) + ") in " + expr + " at " + file + ":" +
              std::to_string(line));
}

}  // namespace ps::detail

#define cudaCheck(expr)                                                   \
  do {                                                                    \
    const cudaError_t ps_err_ = (expr);                                   \
    if (ps_err_ != cudaSuccess)                                           \
      ::ps::detail::throw_cuda_error(ps_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define cublasCheck(expr)                                                      \
  do {                                                                         \
    const cublasStatus_t ps_status_ = (expr);                                  \
    if (ps_status_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::ps::detail::throw_cublas_error(ps_status_, #expr, __FILE__, __LINE__); \
  } while (0)
