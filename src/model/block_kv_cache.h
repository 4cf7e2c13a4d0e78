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
// The slot bookkeeping (tables, lengths, every id and length checked with one-line Errors)
// lives here, once for every storage; an implementation owns the K/V numbers, copy_block,
// and on_bind if it mirrors the tables elsewhere (the CUDA pool's device copy).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace dsinfer {

class BlockKVCache : public KVCache {
 public:
  int max_slots() const override { return static_cast<int>(slots_.size()); }
  int max_tokens() const override { return max_tokens_; }
  int length(int slot) const override;
  void truncate(int slot, int new_length) override;

  // Points `slot` at a block table: position p lives in blocks[p / block_size()]; the
  // first `length` positions hold K/V. The ids are copied (the table may change later).
  // Throws Error on an id outside [0, num_blocks()) or a length the blocks cannot hold.
  void bind(int slot, std::span<const int32_t> blocks, int length);
  void unbind(int slot) { bind(slot, {}, 0); }
  std::span<const int32_t> blocks(int slot) const;
  // Positions the bound blocks can hold (at most max_tokens()).
  int capacity(int slot) const;
  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  // Called by the model once every layer has written the new positions; Error past capacity.
  void set_length(int slot, int len);
  // Positions [0, n_tokens) of block src -> block dst, every layer, K and V (and the
  // feature rows, when the storage has them).
  virtual void copy_block(int32_t src, int32_t dst, int n_tokens) = 0;
  // Floats of drafter feature rows kept per position next to the K/V (0: none; see
  // Model::make_paged_kv_cache and ForwardBatch::capture_to_cache).
  int feature_floats() const { return feature_floats_; }
  // Commits the storage's pages now (host memory: writes every page once), so serving
  // never stops on a first-touch page fault. Device pools are committed when allocated.
  virtual void prefault() {}

 protected:
  // `name` starts the constructor's Errors ("paged KV cache", "CUDA paged KV cache").
  BlockKVCache(const char* name, int block_size, int64_t num_blocks, int max_slots, int max_tokens);
  // After bind stored a slot's table: an implementation that mirrors the tables updates it.
  virtual void on_bind(int slot, std::span<const int32_t> blocks) {
    (void)slot;
    (void)blocks;
  }
  // copy_block's argument check (Error naming the blocks and count).
  void check_copy(int32_t src, int32_t dst, int n_tokens) const;
  int feature_floats_ = 0;  // set by a storage that keeps feature rows

 private:
  void check_slot(int slot, const char* what) const;
  struct Slot {
    std::vector<int32_t> blocks;
    int length = 0;
  };
  int block_size_;
  int64_t num_blocks_;
  int max_tokens_;
  std::vector<Slot> slots_;
};

}  // namespace dsinfer
