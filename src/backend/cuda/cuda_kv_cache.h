// dsinfer CUDA backend: the KV cache in device memory, behind the KVCache interface.
//
// Layout: K and V each [layers][slots][kv_heads][max_tokens][head_dim] BF16, one
// cudaMalloc each, made once (no growth, no fragmentation). Slot lengths live on the host:
// the model turns (slot, length) into per-row positions before each forward, and
// truncate() (speculation rollback) only moves a length, the stale positions being
// overwritten by the next append. Each cache has a process-unique id so that CUDA graphs,
// which bake the cache's device addresses in, are never replayed against another cache.
// The batched engine's paged pool is the other DeviceKVStorage: cuda_paged_kv_cache.h.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "model/model.h"

namespace dsinfer::cuda {

// Process-unique ids of device caches (dense and paged share the sequence).
uint64_t next_kv_storage_uid();

// What the CUDA forward needs from a device cache, dense or paged: per-layer device views,
// how many positions a slot can hold, and where lengths move once the forward ran. Each
// cache has a process-unique id: CUDA graphs, which bake in its device addresses, are
// keyed by it.
class DeviceKVStorage {
 public:
  virtual ~DeviceKVStorage() = default;
  virtual int storage_layers() const = 0;
  virtual int storage_kv_heads() const = 0;
  virtual int storage_head_dim() const = 0;
  virtual uint64_t uid() const = 0;
  virtual KVLayerView layer(int l) const = 0;
  // Positions slot `slot` can hold now (dense: max_tokens; paged: its bound blocks).
  virtual int slot_capacity(int slot) const = 0;
  virtual void set_length(int slot, int len) = 0;
  // Host state the kernels read (the paged block tables) to the device, on `stream`,
  // before the forward's kernels are enqueued.
  virtual void upload(cudaStream_t stream) { (void)stream; }
  // Bytes the next upload() will copy (a diagnostic: DSINFER_CUDA_FORWARD_TIMES).
  virtual uint64_t pending_table_bytes() const { return 0; }
};

class CudaKVCache final : public KVCache, public DeviceKVStorage {
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
  int storage_layers() const override { return n_layers_; }
  int storage_kv_heads() const override { return n_kv_heads_; }
  int storage_head_dim() const override { return head_dim_; }
  uint64_t uid() const override { return uid_; }
  KVLayerView layer(int l) const override;
  int slot_capacity(int) const override { return max_tokens_; }
  void set_length(int slot, int len) override;

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
