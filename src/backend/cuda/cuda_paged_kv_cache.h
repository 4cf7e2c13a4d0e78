// dsinfer CUDA backend: the batched engine's paged KV pool in device memory, behind the
// BlockKVCache interface (model/block_kv_cache.h) that the CPU's PagedKVCache implements too.
//
// Layout: per layer, K and V each [num_blocks][kv_heads][block_size][head_dim] BF16 (one
// cudaMalloc each for all layers, made once), the CPU pool's layout with BF16 elements. The
// engine's BlockPool hands out block ids; bind() records a slot's table and length on the
// host and in a pinned mirror [max_slots][table_stride] of int32 ids (table_stride =
// ceil(max_tokens / block_size)); before each forward the model calls upload(), one
// host-to-device copy of the mirror's rows bound since the last upload (the range from the
// lowest to the highest such slot: at batch 1 one row of a few hundred bytes, not the whole
// mirror, which is a quarter of a megabyte for 256 slots of 4096 tokens) into a device table
// at a fixed address (so captured CUDA graphs replay against the current tables). The
// kernels address position p of slot s as block table[s][p / block_size], row p %
// block_size (KVLayerView, cuda_kernels.h): the K/V
// store writes the new rows there and attention reads keys [0, pos] through it, for decode
// rows and causal verify blocks alike. copy_block (copy-on-write, compaction moves) copies
// the block's first n rows of every (layer, K/V, head) on the device. Lengths live on the
// host; truncate() (speculation rollback) only moves a length.
// Feature rows (feature_floats F > 0, asked for by an engine whose drafter runs on this
// device): [num_blocks][block_size][F] BF16 beside the K/V, one row per position, written by
// forwards with capture_to_cache (store_feature_columns per captured layer, through the same tables) and read by
// the GPU drafter's commit (gather_feature_rows), so a drafter's captured target rows never
// cross to the host; copy_block moves them with the K/V.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cuda/cuda_kv_cache.h"
#include "model/block_kv_cache.h"

namespace dsinfer::cuda {

class CudaPagedKVCache final : public BlockKVCache, public DeviceKVStorage {
 public:
  CudaPagedKVCache(int n_layers, int n_kv_heads, int head_dim, int block_size, int64_t num_blocks, int max_slots,
                   int max_tokens, int feature_floats);
  ~CudaPagedKVCache() override;
  CudaPagedKVCache(const CudaPagedKVCache&) = delete;
  CudaPagedKVCache& operator=(const CudaPagedKVCache&) = delete;

  // BlockKVCache (slots, tables and lengths are its bookkeeping)
  void copy_block(int32_t src, int32_t dst, int n_tokens) override;
  // DeviceKVStorage
  int storage_layers() const override { return n_layers_; }
  int storage_kv_heads() const override { return n_kv_heads_; }
  int storage_head_dim() const override { return head_dim_; }
  uint64_t uid() const override { return uid_; }
  KVLayerView layer(int l) const override;
  int slot_capacity(int slot) const override { return capacity(slot); }
  void set_length(int slot, int len) override { BlockKVCache::set_length(slot, len); }
  void upload(cudaStream_t stream) override;
  uint64_t pending_table_bytes() const override;

  // Device bytes of one block (K and V, all layers; feature rows).
  static uint64_t bytes_per_block(int n_layers, int n_kv_heads, int head_dim, int block_size, int feature_floats) {
    return (2ull * n_layers * n_kv_heads * head_dim + static_cast<uint64_t>(feature_floats)) *
           static_cast<uint64_t>(block_size) * sizeof(bf16);
  }
  // Feature rows [num_blocks][block_size][feature_floats()] (nullptr without them).
  bf16* feature_plane() const { return feat_; }
  // The device block tables [max_slots][table_stride()] as of the last upload().
  const int32_t* device_tables() const { return table_dev_; }
  int table_stride() const { return table_stride_; }

 private:
  // bind's table into the pinned mirror (uploaded by the next forward).
  void on_bind(int slot, std::span<const int32_t> blocks) override;
  int n_layers_, n_kv_heads_, head_dim_;
  int64_t block_stride_;
  int table_stride_;
  uint64_t uid_;
  bf16* k_ = nullptr;
  bf16* v_ = nullptr;
  bf16* feat_ = nullptr;
  int32_t* table_dev_ = nullptr;
  int32_t* table_host_ = nullptr;  // pinned mirror
  // Slots bound since the last upload: [dirty_lo_, dirty_hi_] (empty when lo > hi); all of
  // them at first, so the zeroed mirror reaches the device once.
  int dirty_lo_ = 0, dirty_hi_ = -1;
};

}  // namespace dsinfer::cuda
