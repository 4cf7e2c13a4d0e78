// dsinfer model floor: the shared Qwen3 layer halves (see qwen3_layer.h).
#include "model/qwen3_layer.h"

#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/silu_mul.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace dsinfer {

Qwen3LayerDims qwen3_layer_dims(const ModelConfig& cfg) {
  Qwen3LayerDims d;
  d.hidden = cfg.hidden_size;
  d.intermediate = cfg.intermediate_size;
  d.heads = cfg.num_attention_heads;
  d.kv_heads = cfg.num_key_value_heads;
  d.head_dim = cfg.head_dim;
  d.eps = static_cast<float>(cfg.rms_norm_eps);
  return d;
}

Qwen3LayerWeights load_qwen3_layer(WeightStore& store, const std::string& p, const Qwen3LayerDims& d,
                                   bool attention_bias) {
  const int64_t H = d.hidden, I = d.intermediate, NQ = d.q_width(), NK = d.kv_width();
  Qwen3LayerWeights w;
  w.q = store.matrix(p + "self_attn.q_proj.weight", NQ, H);
  w.k = store.matrix(p + "self_attn.k_proj.weight", NK, H);
  w.v = store.matrix(p + "self_attn.v_proj.weight", NK, H);
  w.o = store.matrix(p + "self_attn.o_proj.weight", H, NQ);
  w.gate = store.matrix(p + "mlp.gate_proj.weight", I, H);
  w.up = store.matrix(p + "mlp.up_proj.weight", I, H);
  w.down = store.matrix(p + "mlp.down_proj.weight", H, I);
  if (attention_bias) {
    w.q_bias = store.vector_f32(p + "self_attn.q_proj.bias", NQ);
    w.k_bias = store.vector_f32(p + "self_attn.k_proj.bias", NK);
    w.v_bias = store.vector_f32(p + "self_attn.v_proj.bias", NK);
    w.o_bias = store.vector_f32(p + "self_attn.o_proj.bias", H);
  }
  w.q_norm = store.vector_f32(p + "self_attn.q_norm.weight", d.head_dim);
  w.k_norm = store.vector_f32(p + "self_attn.k_norm.weight", d.head_dim);
  w.in_norm = store.vector_f32(p + "input_layernorm.weight", H);
  w.post_norm = store.vector_f32(p + "post_attention_layernorm.weight", H);
  return w;
}

Qwen3LayerWeights load_qwen3_layer_share(WeightStore& store, ShardReader& reader, const ModelConfig& full,
                                         const TensorParallelPlan& plan, int rank, int layer) {
  const int64_t H = full.hidden_size, D = full.head_dim;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  Qwen3LayerShard sh = read_qwen3_layer_shard(reader, full, plan, rank, layer);
  auto view = [&](WeightSlice& w) { return store.adopt(w.name, w.dtype, w.rows, w.cols, std::move(w.bytes)); };
  Qwen3LayerWeights L;
  L.q = view(sh.q);
  L.k = view(sh.k);
  L.v = view(sh.v);
  L.o = view(sh.o);
  L.gate = view(sh.gate);
  L.up = view(sh.up);
  L.down = view(sh.down);
  L.q_bias = std::move(sh.q_bias);
  L.k_bias = std::move(sh.k_bias);
  L.v_bias = std::move(sh.v_bias);
  if (full.attention_bias) L.o_bias = store.vector_f32(p + "self_attn.o_proj.bias", H);  // added after the reduction
  L.q_norm = store.vector_f32(p + "self_attn.q_norm.weight", D);
  L.k_norm = store.vector_f32(p + "self_attn.k_norm.weight", D);
  L.in_norm = store.vector_f32(p + "input_layernorm.weight", H);
  L.post_norm = store.vector_f32(p + "post_attention_layernorm.weight", H);
  return L;
}

void add_bias(float* y, int64_t rows, int64_t n, const std::vector<float>& b) {
  if (b.empty()) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += b[i];
}

void qwen3_attention_inputs(const Qwen3LayerWeights& w, const Qwen3LayerDims& d, const float* x, int64_t T,
                            const float* cos_t, const float* sin_t, float* h, float* q, float* k, float* v) {
  const int64_t H = d.hidden, D = d.head_dim, NQ = d.q_width(), NK = d.kv_width();
  rmsnorm(x, H, T, H, w.in_norm.data(), d.eps, h, H);
  matmul(h, T, w.q, q);
  matmul(h, T, w.k, k);
  matmul(h, T, w.v, v);
  add_bias(q, T, NQ, w.q_bias);
  add_bias(k, T, NK, w.k_bias);
  add_bias(v, T, NK, w.v_bias);
  rmsnorm(q, D, T * d.heads, D, w.q_norm.data(), d.eps, q, D);
  rmsnorm(k, D, T * d.kv_heads, D, w.k_norm.data(), d.eps, k, D);
  apply_rope(q, NQ, T, d.heads, d.head_dim, cos_t, sin_t);
  apply_rope(k, NK, T, d.kv_heads, d.head_dim, cos_t, sin_t);
}

void qwen3_attention_out_mlp(const Qwen3LayerWeights& w, const Qwen3LayerDims& d, const float* att, int64_t T,
                             float* x, float* h, float* g, float* u, float* t, const RankReduce* reduce) {
  const int64_t H = d.hidden, I = d.intermediate;
  matmul(att, T, w.o, t);
  if (reduce) (*reduce)(t, T * H);
  add_bias(t, T, H, w.o_bias);
  for (int64_t j = 0; j < T * H; ++j) x[j] += t[j];
  rmsnorm(x, H, T, H, w.post_norm.data(), d.eps, h, H);
  matmul(h, T, w.gate, g);
  matmul(h, T, w.up, u);
  silu_mul(g, u, g, T * I);
  matmul(g, T, w.down, t);
  if (reduce) (*reduce)(t, T * H);
  for (int64_t j = 0; j < T * H; ++j) x[j] += t[j];
}

}  // namespace dsinfer
