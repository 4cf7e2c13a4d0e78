// dsinfer model floor: one Qwen3 decoder layer's weights and its two dense halves, shared
// by the Qwen3 target (model/qwen3.cpp) and the DFlash/DSpark draft backbone
// (spec/dflash_backbone.cpp), whose layers are Qwen3 layers with different attention.
//
// Data flow of a layer over T rows x[T, H]:
//   qwen3_attention_inputs:  h = in_norm(x); q,k,v = h·W (+bias); per-head q_norm/k_norm;
//                            RoPE on q and k at the rows' positions (cos/sin tables).
//   (the caller runs attention: causal over a KV cache, or non-causal over a draft block)
//   qwen3_attention_out_mlp: x += att·Wo (+bias); h = post_norm(x);
//                            x += down(silu(gate(h)) * up(h)).
// Every step is a row-wise kernel, so a row's result does not depend on the other rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "model/tensor_parallel.h"

namespace dsinfer {

struct ModelConfig;
class WeightStore;

struct Qwen3LayerWeights {
  WeightView q, k, v, o, gate, up, down;
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // empty unless attention_bias
  std::vector<float> q_norm, k_norm, in_norm, post_norm;
};

// Layer geometry from a config: widths and head counts.
struct Qwen3LayerDims {
  int64_t hidden = 0, intermediate = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  float eps = 1e-6f;
  int64_t q_width() const { return int64_t{heads} * head_dim; }
  int64_t kv_width() const { return int64_t{kv_heads} * head_dim; }
};
Qwen3LayerDims qwen3_layer_dims(const ModelConfig& cfg);

// Loads "<prefix>self_attn.*", "<prefix>mlp.*" and the two layer norms (prefix e.g.
// "model.layers.3."), checking every shape against `d`; biases when `attention_bias`.
Qwen3LayerWeights load_qwen3_layer(WeightStore& store, const std::string& prefix, const Qwen3LayerDims& d,
                                   bool attention_bias);

// Layer `layer` of one tensor-parallel rank's share (model/tensor_parallel.h): the split
// projections read with ShardReader (only the rank's slices) and held by `store` as its own
// matrices (WeightStore::adopt: its conversion rule); the q/k/v biases split alike; the
// norms and the o bias (added after the reduction) whole from `store`. full: the whole
// model's config; the views' shapes are the rank's.
Qwen3LayerWeights load_qwen3_layer_share(WeightStore& store, ShardReader& reader, const ModelConfig& full,
                                         const TensorParallelPlan& plan, int rank, int layer);

// Scratch: h [T, H]; q [T, q_width]; k, v [T, kv_width]. cos/sin: [T, head_dim / 2].
void qwen3_attention_inputs(const Qwen3LayerWeights& w, const Qwen3LayerDims& d, const float* x, int64_t rows,
                            const float* cos_t, const float* sin_t, float* h, float* q, float* k, float* v);

// att [T, q_width] in; x [T, H] updated in place. Scratch: h, t [T, H]; g, u [T, I].
// reduce (tensor parallelism: w holds one rank's heads and features): the o and down
// outputs are partial sums, added over the ranks before they join x (the o bias after).
void qwen3_attention_out_mlp(const Qwen3LayerWeights& w, const Qwen3LayerDims& d, const float* att, int64_t rows,
                             float* x, float* h, float* g, float* u, float* t, const RankReduce* reduce = nullptr);

// Grows a buffer to at least n floats; never shrinks, so steady-state calls do not allocate.
inline float* grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// y[r, :] += b for every row (no-op when b is empty).
void add_bias(float* y, int64_t rows, int64_t n, const std::vector<float>& b);

}  // namespace dsinfer
