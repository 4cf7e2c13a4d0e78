// dsinfer model floor: the paged KV cache — K/V storage addressed by block ids, for the
// batched engine's block pool (engine/block_pool.h does the bookkeeping: which blocks a
// sequence holds, the prefix cache, copy-on-write; this class only stores the numbers).
//
// Element type: F32, or BF16 in bf16 matmul precision (Model::kv_dtype(); the forward
// rounds K/V with kv_round_bf16 as it writes them), half the bytes per block.
//
// Layout: per layer, K and V are each [num_blocks][n_kv_heads][block_size][head_dim], so
// one KV head's keys inside a block are contiguous in position order (as in the dense
// cache) and a block is one contiguous run per layer. Memory is reserved up front and
// left untouched (no zero fill): the OS commits pages as blocks are first written.
//
// Data flow: before each Model::forward the engine binds every slot of the batch to its
// sequence's block table and current length (bind); the forward writes the new tokens'
// K/V at positions [length, length + n) through the table (position p in block
// blocks[p / block_size] at offset p % block_size) and attention reads them back through
// the same table, in position order, so the logits are bit-identical to the dense
// cache's. Copy-on-write and compaction moves are applied with copy_block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "model/block_kv_cache.h"

namespace dsinfer {

// The CPU implementation of BlockKVCache (model/block_kv_cache.h).
class PagedKVCache : public BlockKVCache {
 public:
  // max_slots sequences at once, each of up to max_tokens positions; num_blocks blocks of
  // block_size tokens shared by all of them; elements of dtype F32 or BF16 (else Error).
  PagedKVCache(int n_layers, int n_kv_heads, int head_dim, int block_size, int64_t num_blocks, int max_slots,
               int max_tokens, DType dtype = DType::F32);

  // Slots, tables and lengths: BlockKVCache (bind, blocks, capacity, set_length, ...).

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  // Elements of one block in one layer (K or V): n_kv_heads * block_size * head_dim.
  int64_t block_stride() const { return block_stride_; }
  // Elements between consecutive KV heads inside a block.
  int64_t head_stride() const { return static_cast<int64_t>(block_size()) * head_dim_; }
  // Base of layer `layer`'s K (V): block b starts at k(layer) + b * block_stride().
  // k()/v() for an F32 cache, k_bf16()/v_bf16() (BF16 bit patterns) for a BF16 one; the
  // accessor of the other type throws Error.
  float* k(int layer) { return elems<float>(k_.get(), layer); }
  float* v(int layer) { return elems<float>(v_.get(), layer); }
  uint16_t* k_bf16(int layer) { return elems<uint16_t>(k_.get(), layer); }
  uint16_t* v_bf16(int layer) { return elems<uint16_t>(v_.get(), layer); }

  // Positions [0, n_tokens) of block src -> block dst, every layer, K and V.
  void copy_block(int32_t src, int32_t dst, int n_tokens) override;
  void prefault() override;

 private:
  void check_dtype(DType want) const;
  template <class T>
  T* elems(std::byte* base, int layer) {
    check_dtype(sizeof(T) == 4 ? DType::F32 : DType::BF16);
    return reinterpret_cast<T*>(base) + static_cast<int64_t>(layer) * num_blocks() * block_stride_;
  }
  int n_layers_, n_kv_heads_, head_dim_;
  int64_t block_stride_;
  DType dtype_;
  std::unique_ptr<std::byte[]> k_, v_;
};

}  // namespace dsinfer
