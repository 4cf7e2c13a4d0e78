// dsinfer kernels: causal grouped-query attention of a block of new queries against a
// sequence's K/V cache (F32).
//
// Data flow: the model has already written the new tokens' keys/values into the cache, so
// query i of a block (at absolute position start_pos + i) attends to cache positions
// [0, start_pos + i]. Prefill, single-token decode and multi-token verification are the
// same call with different n_q / start_pos. Query head h reads KV head h / (n_heads /
// n_kv_heads), as transformers' repeat_kv does.
//
// Batch invariance: the result for one (query, head) is computed by one thread from that
// query's row and the cache alone, with reductions whose order depends only on head_dim and
// the number of keys. It never depends on the other queries of the block, on the other
// blocks of the batch, or on how (block, head) items are spread over threads.
#pragma once
#include <cstdint>

namespace dsinfer {

class ThreadPool;

struct AttentionBlock {
  const float* q = nullptr;  // [n_q, n_heads * head_dim], row stride q_stride floats
  int64_t q_stride = 0;
  int n_q = 0;
  int start_pos = 0;
  // Cache of this sequence: for KV head g, position p, K at k + g * kv_head_stride + p * head_dim.
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_head_stride = 0;
  float* out = nullptr;  // [n_q, n_heads * head_dim], row stride out_stride floats
  int64_t out_stride = 0;
};

// scale multiplies q·k (1/sqrt(head_dim) for Qwen3). pool == nullptr: ThreadPool::global().
void attention_causal(const AttentionBlock* blocks, int n_blocks, int n_heads, int n_kv_heads, int head_dim,
                      float scale, ThreadPool* pool = nullptr);

// One query row against n_keys keys (ISA-specific cores; `scores` has room for n_keys).
void attend_row_scalar(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                       float* scores, float* out);
void attend_row_avx2(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                     float* scores, float* out);

}  // namespace dsinfer
