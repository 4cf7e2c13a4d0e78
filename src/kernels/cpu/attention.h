// dsinfer kernels: grouped-query attention of a block of new queries against a sequence's
// K/V cache (F32), causal (the target model) or not (the block drafter).
//
// Data flow: the model has already written the new tokens' keys/values into the cache, so
// query i of a causal block (at absolute position start_pos + i) attends to cache positions
// [0, start_pos + i]; with causal = false every query of the block attends to
// [0, start_pos + n_q) (the drafter's block sees itself whole). Prefill, single-token
// decode and multi-token verification are the same call with different n_q / start_pos.
// Query head h reads KV head h / (n_heads / n_kv_heads), as transformers' repeat_kv does.
//
// Cost model: all the query vectors that read one KV head (the group's query heads times
// the block's rows) are attended together, so each key and value row is loaded once for
// all of them instead of once per (query, head) (attention_internal.h has the layout).
//
// Paged K/V (AttentionBlock::block_ids): the grouped kernels are called once per run of
// keys inside one block (scores are per key; values are fma chains in ascending key order
// that survive a store/reload), the per-row fallback gathers the keys into a contiguous
// scratch first; either way every output bit equals the dense layout's.
//
// Batch invariance: the bits of one (query, head) output depend only on that query's row,
// its key count and the cache. Every reduction (q·k over head_dim, the softmax, the
// p-weighted sum over keys) runs in an order fixed by head_dim and the key count alone,
// exactly that of attend_row_avx2 on AVX2 and AVX-512 CPUs (attend_row_scalar's on others).
// It never depends on the other queries of the block, on the other blocks of the batch, or
// on how the work is spread over threads.
#pragma once
#include <cstdint>

namespace dsinfer {

class ThreadPool;

struct AttentionBlock {
  const float* q = nullptr;  // [n_q, n_heads * head_dim], row stride q_stride floats
  int64_t q_stride = 0;
  int n_q = 0;
  int start_pos = 0;
  bool causal = true;  // false: every row sees keys [0, start_pos + n_q)
  // Cache of this sequence: for KV head g, position p, K at k + g * kv_head_stride + p * head_dim.
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_head_stride = 0;
  float* out = nullptr;  // [n_q, n_heads * head_dim], row stride out_stride floats
  int64_t out_stride = 0;
  // Paged cache (block_ids != nullptr): positions live in blocks of page_size tokens, and
  // position p of KV head g is at k + block_ids[p / page_size] * block_stride +
  // g * kv_head_stride + (p % page_size) * head_dim (likewise v). Keys are still reduced
  // in ascending position order, so the bits equal those of the same K/V stored densely.
  const int32_t* block_ids = nullptr;
  int64_t block_stride = 0;
  int page_size = 0;
};

// scale multiplies q·k (1/sqrt(head_dim) for Qwen3). pool == nullptr: ThreadPool::global().
// Despite the name, a block with causal = false is attended non-causally.
void attention_causal(const AttentionBlock* blocks, int n_blocks, int n_heads, int n_kv_heads, int head_dim,
                      float scale, ThreadPool* pool = nullptr);

// One query row against n_keys keys (ISA-specific cores; `scores` has room for n_keys).
// attend_row_avx2 is the bit-exact specification of the AVX2/AVX-512 paths.
void attend_row_scalar(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                       float* scores, float* out);
void attend_row_avx2(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                     float* scores, float* out);

}  // namespace dsinfer
