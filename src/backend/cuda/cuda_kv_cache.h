// dsinfer CUDA backend: the KV cache in device memory, behind the KVCache interface.
//
// Layout: K and V each [layers][slots][kv_heads][max_tokens][head_dim] BF16, one
// cudaMalloc each, made once (no growth, no fragmentation). Slot lengths live on the host:
// the model turns (slot, length) into per-row positions before each forward, and
// truncate() (speculation rollback) only moves a length, the stale positions being
// overwritten by the next append. Each cache has a process-unique id so that CUDA graphs,
// which bake the cache's device addresses in, are never replayed against another cache.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "model/model.h"

namespace dsinfer::cuda {

class CudaKVCache final : public KVCache {
 public:
  CudaKVCache(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_tokens);
  ~CudaKVCache() override;
  CudaKVCache(const CudaKVCache&) = delete;
  CudaKVCache& operator=(const CudaKVCache&) = delete;

  int max_slots() const override { return max_slots_; }
  int max_tokens() const override { return max_tokens_; }
  int length(int slot) const override;
  void truncate(int slot, int new_length) override;

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  uint64_t uid() const { return uid_; }
  KVLayerView layer(int l) const;
  void set_length(int slot, int len);

  // Device bytes for one token position of one slot (K and V, all layers).
  static uint64_t bytes_per_token(int n_layers, int n_kv_heads, int head_dim) {
    return 2ull * n_layers * n_kv_heads * head_dim * sizeof(bf16);
  }

 private:
  int n_layers_, n_kv_heads_, head_dim_, max_slots_, max_tokens_;
  uint64_t uid_;
  bf16* k_ = nullptr;
  bf16* v_ = nullptr;
  std::vector<int> len_;
};

}  // namespace dsinfer::cuda
