// dsinfer kernels: grouped-query attention of a block of new queries against a sequence's
// K/V cache (F32 or BF16), causal (the target model) or not (the block drafter).
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
//
// BF16 K/V (AttentionBlock::k_bf16/v_bf16; the target's cache in bf16 matmul precision):
// the model writes K/V rounded with kv_round_bf16(); a score is the query rounded to BF16
// dotted with the key as vdpbf16ps computes it, the softmax and the value sums are the F32
// path's on the exactly widened values. attend_row_bf16_reference() states the order; the
// AVX512_BF16 kernel, its AVX-512F emulation and the per-row fallback give its bits, so
// they do not depend on the CPU either (softmax aside on CPUs without AVX2, as for F32).
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
  // BF16 cache: when k_bf16 is set, k and v are ignored and K/V are read from k_bf16 /
  // v_bf16 (BF16 bit patterns) with the same element strides and block mapping.
  const uint16_t* k_bf16 = nullptr;
  const uint16_t* v_bf16 = nullptr;
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

// Rounds n floats to BF16 for the K/V cache: a subnormal becomes a zero of its sign, then
// round-to-nearest-even (NaN kept, quieted) -- matmul's Bf16Dot rounding of activations,
// the same bits on every path. dst may have any alignment.
void kv_round_bf16(const float* src, int64_t n, uint16_t* dst);

// The specification of BF16 K/V attention for one query row (k, v: n_keys rows of
// head_dim BF16 values; `scores` has room for n_keys). In this order:
//   1. qb = the query rounded as kv_round_bf16; qb and every key are zero-padded to D32 =
//      head_dim rounded up to 32.
//   2. score_j: 16 partial sums p[l] = +0; for each 32-chunk c and l = 0..15, odd element
//      first: p[l] = step(p[l], qb[32c+2l+1], k[32c+2l+1]); p[l] = step(p[l], qb[32c+2l],
//      k[32c+2l]) (step = matmul_detail::bf16_dot_step: exact product, one rounding,
//      result below FLT_MIN flushed to a signed zero; this is vdpbf16ps lane for lane);
//      then the tree ((q0+q4)+(q2+q6))+((q1+q5)+(q3+q7)) with q_l = p[l]+p[l+8], every sum
//      flushed (matmul_detail::reduce16_ftz), then times scale as SSE multiplies with FTZ.
//   3. the softmax numerators and their sum: exp_shifted_sum_avx2 where the CPU has AVX2
//      (exp_shifted_sum_scalar else), as the F32 path.
//   4. out[i] = fma(e_j, float(v_j[i]), out[i]) over j ascending from +0 (no flushing),
//      then out[i] *= 1 / sum.
// The grouped kernels give these bits for every head_dim % 32 == 0; other sizes, and CPUs
// without AVX-512, run this function itself.
void attend_row_bf16_reference(const float* q, const uint16_t* k, const uint16_t* v, int n_keys, int head_dim,
                               float scale, float* scores, float* out);
// Steps 1-2 alone: scores[j] for j < n_keys.
void attend_scores_bf16_reference(const float* q, const uint16_t* k, int n_keys, int head_dim, float scale,
                                  float* scores);

}  // namespace dsinfer
