// dsinfer model floor: DeepSeek-V4 weights, by layer, from either checkpoint naming scheme.
//
// Data flow: V4TensorIndex opens every safetensors shard and gives each tensor a canonical
// name, the transformers 5.17 name without the "model." prefix, whatever the file used:
//  - transformers names ("model.layers.3.self_attn.q_a_proj.weight", stacked experts
//    "mlp.experts.gate_up_proj" [E, 2I, D] / "down_proj" [E, D, I]);
//  - the original DeepSeek names ("layers.3.attn.wq_a.weight", per-expert
//    "ffn.experts.7.w1.weight"), renamed by the table of spec §2.1; a ".scale" sibling
//    becomes ".weight_scale_inv" as in transformers;
//  - the mixed output of transformers' save_pretrained (an optional "model." prefix on
//    either scheme);
//  - "mtp.{s}.*" (the DSpark drafter's stages, spec/v4_dspark_drafter): "mtp.{s}." followed by
//    the same layer renames ("mtp.0.attn.wq_a.weight" → "mtp.0.self_attn.q_a_proj.weight"),
//    hc_head_* → hc_head.hc_*, and a ".scale" sibling → ".weight_scale_inv". The target
//    loader never asks for them.
// load_deepseek_v4_weights() then checks every tensor's shape against the config and
// builds per-layer structs of matrix views (in place for F32/BF16; F16 converted once to
// F32) and F32 vectors. A matrix with a scale sibling is block-quantized (FP8 E4M3 with
// 128×128 scales, or FP4 E2M1 with per-32 scales) and stays quantized in memory; the
// matmul dequantises on the fly (kernels/cpu/matmul_quant.h).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_quant.h"
#include "model/deepseek_v4_config.h"
#include "model/safetensors.h"

namespace dsinfer {

// A linear layer's weight [out, in]: plain (F32/BF16) or block-quantized.
struct V4Linear {
  WeightView plain{};
  QuantWeightView quant{};
  bool quantized = false;
  int64_t rows() const { return quantized ? quant.rows : plain.rows; }
  int64_t cols() const { return quantized ? quant.cols : plain.cols; }
  uint64_t bytes() const;
};
// y[m, rows] = x[m, cols] · Wᵀ, batch-invariant either way.
void v4_matmul(const float* x, int64_t m, const V4Linear& w, float* y);

struct V4Compressor {
  V4Linear kv, gate;            // [width, D], width = d (HCA) or 2d (CSA)
  std::vector<float> pos_bias;  // [rate, width]
  std::vector<float> norm;      // [d]
  int rate = 0, dim = 0;        // dim = output entry width (d or d_I)
  bool overlap = false;         // CSA-style overlapping windows (width 2·dim)
};

struct V4Expert {
  V4Linear gate, up, down;  // [I, D], [I, D], [D, I]
};

struct V4LayerWeights {
  V4Attn attn = V4Attn::Sliding;
  bool hash = false;
  // mHC sites: fn [M, n_hc·D], base [M], scale [3].
  V4Linear attn_hc_fn, ffn_hc_fn;
  std::vector<float> attn_hc_base, attn_hc_scale, ffn_hc_base, ffn_hc_scale;
  std::vector<float> in_norm, post_norm;
  // attention
  V4Linear q_a, q_b, kv, o_a, o_b;
  std::vector<float> q_a_norm, kv_norm, sinks;
  V4Compressor comp;  // CSA/HCA only
  V4Compressor idx;   // CSA only (indexer keys)
  V4Linear idx_q_b, idx_weights;
  // MoE
  V4Linear router;                     // [E, D]
  std::vector<float> score_bias;       // [E] (learned top-k layers)
  std::vector<int32_t> tid2eid;        // [V, K] (hash layers)
  std::vector<V4Expert> experts;
  V4Expert shared;
};

struct V4Weights {
  WeightView embed{};  // [V, D]
  V4Linear head;       // [V, D]
  std::vector<float> final_norm;
  V4Linear hc_head_fn;  // [n_hc, n_hc·D]
  std::vector<float> hc_head_base, hc_head_scale;
  std::vector<V4LayerWeights> layers;
  uint64_t matrix_bytes = 0;   // all matrices as held in memory
  uint64_t expert_bytes = 0;   // of which routed experts
};

// Canonical name → tensor over all shards of a model directory (see the header comment).
class V4TensorIndex {
 public:
  // placement: how the files are held (MappedFile); an expert-parallel rank maps them, so
  // the experts it never runs are never read.
  explicit V4TensorIndex(const std::string& model_dir, MappedFile::Placement placement = MappedFile::Placement::Auto);
  const TensorLocation* find(const std::string& canonical) const;
  // Where to point a "not found" error.
  std::string where() const;
  const std::string& dir() const { return dir_; }
  // Canonical name of a stored key. Exposed for the tests.
  static std::string canonical_name(const std::string& stored);

 private:
  std::string dir_;
  std::unique_ptr<SafetensorsSet> set_;
  std::map<std::string, const TensorLocation*> by_canonical_;
};


// One V4 block (mHC sites, norms, attention of kind `attn`, MoE) whose canonical names start
// with `prefix` ("layers.3." for a target layer, "mtp.0." for a DSpark stage). Adds its matrix
// bytes to `bytes` and, of those, the routed experts' to `expert_bytes`.
V4LayerWeights load_v4_block(const V4TensorIndex& ix, const DeepseekV4Config& c, const std::string& prefix, V4Attn attn,
                             int compress_rate, bool hash, std::deque<std::vector<uint8_t>>& owned, uint64_t& bytes,
                             uint64_t& expert_bytes);
// Single tensors by canonical name, shape-checked; errors name the file and the tensor.
V4Linear load_v4_linear(const V4TensorIndex& ix, const std::string& name, int64_t rows, int64_t cols,
                        std::deque<std::vector<uint8_t>>& owned);
std::vector<float> load_v4_floats(const V4TensorIndex& ix, const std::string& name, const std::vector<int64_t>& shape);

// Bytes one decode step reads, as bench-model's roofline counts them: every matrix but the
// unrouted experts (top-k of E per layer) and, unless the head is the embedding, all but one
// embedding row. The CPU and CUDA V4 models both report this.
uint64_t v4_decode_weight_bytes(const V4Weights& w, const DeepseekV4Config& c);

// Loads and checks every target tensor. `owned` keeps converted copies alive.
V4Weights load_deepseek_v4_weights(const V4TensorIndex& index, const DeepseekV4Config& cfg,
                                   std::deque<std::vector<uint8_t>>& owned);

}  // namespace dsinfer
