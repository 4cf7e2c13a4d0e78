// dsinfer CUDA backend: device allocations owned together and freed together (a model's
// weights for its life, a workspace per size, a decoding state), shared by the Qwen3 and
// DeepSeek-V4 models.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() { release(); }
  void release() {
    for (void* p : ptrs_) cudaFree(p);
    ptrs_.clear();
  }
  // Room for n values of T (at least one).
  template <typename T>
  T* alloc(size_t n) {
    void* p = nullptr;
    DSINFER_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* upload(const T* host, size_t n) {
    T* d = alloc<T>(n);
    if (n) DSINFER_CUDA_CHECK(cudaMemcpy(d, host, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }

 private:
  std::vector<void*> ptrs_;
};

}  // namespace dsinfer::cuda
