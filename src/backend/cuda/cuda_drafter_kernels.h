// dsinfer CUDA backend: the kernels of the DeepSpec drafter on the GPU (cuda_drafter.cpp)
// that the target's kernels do not cover. Everything else the drafter runs is the target's
// own code: the GEMMs (cuda_gemm.h, RMSNorm and SwiGLU fused), embed_rows and rope_table.
//
// Draft K/V layout: every drafter sequence owns one device buffer
// [layers][2 (K, V)][kv_heads][cap][head_dim] BF16; row i of a (layer, K|V, head) segment
// holds absolute position store_first + i (the host's DraftContext layout, in BF16).
//
// Batch invariance: every kernel computes a row (a (row, head), an item) in an order fixed
// by that row's own sizes; the number of rows only sets the grid.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

// Where row r's K/V go: buffer base[r] (the sequence's), capacity cap[r], store row dst[r].
struct DraftRowDst {
  const unsigned long long* base = nullptr;  // bf16* of the sequence's buffer, as an integer
  const int32_t* cap = nullptr;
  const int32_t* dst = nullptr;
};

// src f32 rows [T, ld]. For each layer l in [0, layers) the row holds, from column
// l * layer_stride: NQ q heads (only when q_out), then NKV k heads, then NKV v heads, each D
// wide. q and k are RMS-normed over D (q_norm / k_norm [L_total][D]: layer first_layer + l)
// and rotated (rotate-half RoPE with the row's cos/sin [T, D/2]), as qk_norm_rope_store;
// q goes to q_out f32 [T, NQ * D]; k and v to layer first_layer + l of the row's buffer.
void draft_qkv_store(const float* src, int64_t ld, int T, int layers, int64_t layer_stride, int first_layer, int NQ,
                     int NKV, int D, int L_total, const float* q_norm, const float* k_norm, float eps,
                     const float* cos_t, const float* sin_t, DraftRowDst dst, float* q_out, cudaStream_t stream);

// Non-causal attention of block rows over their sequence's visible keys: row r belongs to
// item item[r]; the item's keys are store rows [key_begin[i], key_begin[i] + n_keys[i]) of
// its buffer (visible context, then the whole block), layer `layer`. q f32 [T, NQ * D];
// out bf16 [T, NQ * D]. One block of 8 warps per (row, q head); keys split over warps by
// n_keys alone, online softmax per warp, warps combined in order.
void draft_block_attention(const float* q, int T, const int32_t* item, const unsigned long long* base,
                           const int32_t* cap, const int32_t* key_begin, const int32_t* n_keys, int layer, int L_total,
                           int NQ, int NKV, int D, float scale, bf16* out, cudaStream_t stream);

// hdot[j] = w_h · final_norm(x[rows[j]]) for j < n (the confidence head's h part, F32,
// a fixed block reduction).
void draft_conf_hdot(const float* x, int64_t H, const int32_t* rows, int n, const float* final_norm, float eps,
                     const float* w_h, float* hdot, cudaStream_t stream);

// One draft position k of R items, before its Markov GEMM: prev_i = the anchor (k = 0) or
// the argmax of row (k - 1) * R + i (from keys); ids[(k - 1) * R + i] = prev_i (k > 0);
// e_i = W1[prev_i] (BF16 [R, rank], the Markov GEMM's input) when w1; with a confidence
// head, z[k * R + i] = hdot[k * R + i] + w_e · f32(e_i) + b (w_e null: no Markov feature).
void draft_markov_step(int k, int R, const int32_t* anchors, const unsigned long long* keys, int32_t* ids,
                       const bf16* w1, int rank, bf16* e, const float* hdot, const float* w_e, float conf_b, float* z,
                       cudaStream_t stream);

// ids[j] = the argmax id of keys[j] for j < n.
void draft_keys_to_ids(const unsigned long long* keys, int n, int32_t* ids, cudaStream_t stream);

}  // namespace dsinfer::cuda
