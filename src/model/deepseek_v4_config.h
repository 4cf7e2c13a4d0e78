// dsinfer model floor: the DeepSeek-V4 view of config.json (model_type "deepseek_v4").
//
// Data flow: parse_deepseek_v4_config() reads DIR/config.json once more (the generic
// ModelConfig only carries the fields every architecture shares) and resolves everything
// transformers 5.17's DeepseekV4Config.__post_init__ derives (../shared/docs/
// deepseek_v4_spec.md §1): the per-layer attention schedule from `layer_types` or the legacy
// `compress_ratios` (0 → sliding, 4 → CSA, 128 → HCA), the hash/learned MoE schedule from
// `mlp_layer_types` or `num_hash_layers`, the rotary width from `partial_rotary_factor` or
// `qk_rope_head_dim`, and the two RoPE tables ("main" for sliding layers, "compress" with
// YaRN for CSA/HCA layers) from `rope_parameters` (flat or nested main/compress) or the
// legacy `rope_scaling`. Errors name the file and field.
#pragma once
#include <string>
#include <vector>

#include "model/config.h"

namespace dsinfer {

enum class V4Attn { Sliding, CSA, HCA };

struct DeepseekV4Config {
  int vocab = 0, hidden = 0, layers = 0;
  int heads = 0, head_dim = 0, rope_dim = 0, q_lora = 0;
  int o_groups = 0, o_lora = 0;
  int experts = 0, top_k = 0, moe_inter = 0;
  double routed_scale = 1.5, swiglu_limit = 10.0;
  bool sigmoid_scores = false;  // scoring_func "sigmoid"; default "sqrtsoftplus"
  int window = 128;
  int idx_heads = 0, idx_head_dim = 0, idx_topk = 0;
  int hc_mult = 4, hc_iters = 20;
  double hc_eps = 1e-6, eps = 1e-6;
  int rate_csa = 4, rate_hca = 128;
  bool tie = false;
  int max_pos = 0;
  std::vector<V4Attn> attn;     // per layer
  std::vector<bool> hash_moe;   // per layer
  RopeConfig rope_main, rope_compress;

  int compress_rate(int layer) const {
    return attn[layer] == V4Attn::CSA ? rate_csa : attn[layer] == V4Attn::HCA ? rate_hca : 0;
  }
  int hc_mix() const { return (2 + hc_mult) * hc_mult; }
  int count(V4Attn a) const {
    int n = 0;
    for (V4Attn x : attn) n += x == a;
    return n;
  }
};

const char* v4_attn_name(V4Attn a);

// Reads DIR/config.json; `generic` supplies the already validated shared fields.
DeepseekV4Config parse_deepseek_v4_config(const ModelConfig& generic);

}  // namespace dsinfer
