// dsinfer CUDA backend: turning CUDA runtime and cuBLAS status codes into dsinfer::Error.
// Every CUDA call of the backend goes through one of these, and every kernel launch is
// followed by DSINFER_CUDA_LAUNCHED(), so a failure surfaces as one line naming the call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace dsinfer::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(e) + " (" + file + ":" +
              std::to_string(line) + ")");
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  throw Error(std::string("cuBLAS: ") + what + " failed: status " + std::to_string(static_cast<int>(s)) + " (" +
              file + ":" + std::to_string(line) + ")");
}

}  // namespace dsinfer::cuda

#define DSINFER_CUDA_CHECK(call)                                                        \
  do {                                                                                  \
    cudaError_t dsinfer_e_ = (call);                                                    \
    if (dsinfer_e_ != cudaSuccess) ::dsinfer::cuda::throw_cuda(dsinfer_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define DSINFER_CUBLAS_CHECK(call)                                                      \
  do {                                                                                  \
    cublasStatus_t dsinfer_s_ = (call);                                                 \
    if (dsinfer_s_ != CUBLAS_STATUS_SUCCESS) ::dsinfer::cuda::throw_cublas(dsinfer_s_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: configuration errors show up here, not at the next sync.
#define DSINFER_CUDA_LAUNCHED(name)                                                     \
  do {                                                                                  \
    cudaError_t dsinfer_e_ = cudaGetLastError();                                        \
    if (dsinfer_e_ != cudaSuccess) ::dsinfer::cuda::throw_cuda(dsinfer_e_, name, __FILE__, __LINE__); \
  } while (0)
