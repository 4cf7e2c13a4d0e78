// dsinfer CUDA backend: the device KV cache (see cuda_kv_cache.h).
#include "backend/cuda/cuda_kv_cache.h"

#include <atomic>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace dsinfer::cuda {

uint64_t next_kv_storage_uid() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

CudaKVCache::CudaKVCache(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_tokens)
    : n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      max_slots_(max_slots),
      max_tokens_(max_tokens),
      uid_(next_kv_storage_uid()),
      len_(max_slots, 0) {
  check(max_slots >= 1, "CUDA KV cache: max_slots must be >= 1 (got " + std::to_string(max_slots) + ")");
  check(max_tokens >= 1, "CUDA KV cache: max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
  const size_t bytes = static_cast<size_t>(n_layers) * max_slots * n_kv_heads * max_tokens * head_dim * sizeof(bf16);
  DSINFER_CUDA_CHECK(cudaMalloc(&k_, bytes));
  cudaError_t e = cudaMalloc(&v_, bytes);
  if (e != cudaSuccess) {
    cudaFree(k_);
    throw_cuda(e, "cudaMalloc(KV cache V)", __FILE__, __LINE__);
  }
}

CudaKVCache::~CudaKVCache() {
  cudaFree(k_);
  cudaFree(v_);
}

int CudaKVCache::length(int slot) const {
  check(slot >= 0 && slot < max_slots_, "KV cache: slot " + std::to_string(slot) + " out of range");
  return len_[slot];
}

void CudaKVCache::truncate(int slot, int new_length) {
  check(slot >= 0 && slot < max_slots_, "KV cache: slot " + std::to_string(slot) + " out of range");
  check(new_length >= 0 && new_length <= len_[slot],
        "KV cache truncate: new length " + std::to_string(new_length) + " outside [0, " + std::to_string(len_[slot]) + "]");
  len_[slot] = new_length;
}

void CudaKVCache::set_length(int slot, int len) { len_[slot] = len; }

KVLayerView CudaKVCache::layer(int l) const {
  KVLayerView v;
  v.head_stride = static_cast<int64_t>(max_tokens_) * head_dim_;
  v.slot_stride = v.head_stride * n_kv_heads_;
  const int64_t off = static_cast<int64_t>(l) * max_slots_ * v.slot_stride;
  v.k = k_ + off;
  v.v = v_ + off;
  return v;
}

}  // namespace dsinfer::cuda
