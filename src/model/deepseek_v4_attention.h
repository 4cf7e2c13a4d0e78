// dsinfer model floor: one DeepSeek-V4 attention sub-block over a batch, with its state.
//
// Data flow for the rows of one layer (h [T, D] = the normed collapsed stream; rows are
// grouped per sequence into segments of consecutive positions):
//   q_res = rmsw(W_qa·h); q = rms_per_head(W_qb·q_res); kv = rmsw(W_kv·h)  (one K=V head)
//   partial interleaved RoPE on the last r dims of q and kv (main table on sliding layers,
//   compress/YaRN table on CSA/HCA layers); kv rows → state.
//   CSA/HCA: compressor projections C|Z → state; every window that closes in this call is
//   pooled into an entry (HCA: softmax over the window's m slots; CSA: over the previous
//   window's Ca halves and this window's Cb halves), normed and rotated at w·m.
//   CSA: the indexer does the same at d_I, then scores its entries per query
//   (Σ_h ω_h ReLU(q^I_h·k^I_w)/√d_I) and keeps the top-k causally visible ones.
//   Attention per query and head: one softmax with a learned sink over the window rows
//   [p−W+1, p] plus the visible (HCA) or selected (CSA) entries; values = keys.
//   Inverse RoPE on the output; grouped projection W_oa per head group; W_ob.
// The pieces (v4_attn_project, v4_attn_row, v4_attn_output) are exposed for the DSpark
// drafter's stages (spec/v4_dspark_drafter), whose attention is the same sub-block over a
// different key set (committed context rows + the non-causal draft block).
// Every per-token quantity is computed row by row (batch-invariant matmuls, per-row
// loops), so results depend only on the sequence's own tokens.
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek_v4_state.h"
#include "model/deepseek_v4_weights.h"

namespace dsinfer {

struct V4Segment {
  int slot = 0;
  int start = 0;     // position of the first new row (= state length before the call)
  int n = 0;         // new rows
  int64_t row0 = 0;  // first row in the batch matrices
};

struct V4RopeTables {
  std::vector<float> main_inv, compress_inv;  // r/2 inverse frequencies each
};

// h [T, D] in, out [T, D] out. Writes the new positions' rows into `st` (layer `layer`).
void v4_attention(const V4LayerWeights& L, const DeepseekV4Config& c, const V4RopeTables& rope, int layer,
                  V4State& st, const std::vector<V4Segment>& segs, const float* h, int64_t T, float* out);

// cos/sin tables [T, r/2] of the rows' positions for one inverse-frequency table.
void v4_rope_rows(const std::vector<float>& inv, const int32_t* pos, int64_t T, float* cs, float* sn);
// The shared K=V rows of x [T, D]: kv = RoPE(rmsw(W_kv·x)) [T, d] at the tables' positions.
void v4_attn_kv(const V4LayerWeights& L, const DeepseekV4Config& c, int half, const float* cs, const float* sn,
                const float* x, int64_t T, float* kv);
// Queries and K=V rows of h [T, D]: qres [T, q_lora] (normed, for the indexer),
// q [T, H·d] (per-head rms, RoPE), kv [T, d] (as v4_attn_kv).
void v4_attn_project(const V4LayerWeights& L, const DeepseekV4Config& c, int half, const float* cs, const float* sn,
                     const float* h, int64_t T, float* qres, float* q, float* kv);
// One query row over nk keys (values = keys): per head one softmax with the learned sink,
// then the inverse RoPE of the row's position (cs/sn: that row's tables). o_row [H·d].
void v4_attn_row(const V4LayerWeights& L, const DeepseekV4Config& c, const float* q_row, const float* const* keys,
                 size_t nk, const float* cs, const float* sn, int half, std::vector<float>& logit, float* o_row);
// Grouped output projection of att [T, H·d] → out [T, D].
void v4_attn_output(const V4LayerWeights& L, const DeepseekV4Config& c, const float* att, int64_t T, float* out);

}  // namespace dsinfer
