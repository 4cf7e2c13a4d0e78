// dsinfer model floor: the paged KV cache interface — K/V storage addressed through a block
// table per slot, as the batched engine's block pool (engine/block_pool.h) hands blocks out.
//
// Data flow: the engine owns the bookkeeping (which blocks a sequence holds, the prefix
// cache, copy-on-write) and creates the storage with Model::make_paged_kv_cache, so each
// model keeps K/V where its forward reads them: the CPU Qwen3 in host memory
// (model/paged_kv_cache.h, PagedKVCache), the CUDA model in a device pool
// (backend/cuda/cuda_paged_kv_cache.h). Before each Model::forward the engine binds every
// slot of the batch to its table and current length (bind); the forward writes the new
// positions [length, length + n) through the table (position p lives in block
// blocks[p / block_size()] at offset p % block_size()) and attention reads them back through
// it. copy_block applies copy-on-write and compaction moves inside the storage.
#pragma once
#include <cstdint>
#include <span>

#include "model/model.h"

namespace dsinfer {

class BlockKVCache : public KVCache {
 public:
  // Points `slot` at a block table: position p lives in blocks[p / block_size()]; the
  // first `length` positions hold K/V. The ids are copied (the table may change later).
  // Throws Error on an id outside [0, num_blocks()) or a length the blocks cannot hold.
  virtual void bind(int slot, std::span<const int32_t> blocks, int length) = 0;
  void unbind(int slot) { bind(slot, {}, 0); }
  virtual std::span<const int32_t> blocks(int slot) const = 0;
  // Positions the bound blocks can hold (at most max_tokens()).
  virtual int capacity(int slot) const = 0;
  virtual int block_size() const = 0;
  virtual int64_t num_blocks() const = 0;
  // Positions [0, n_tokens) of block src -> block dst, every layer, K and V.
  virtual void copy_block(int32_t src, int32_t dst, int n_tokens) = 0;
};

}  // namespace dsinfer
