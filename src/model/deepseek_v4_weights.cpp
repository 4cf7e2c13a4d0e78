// dsinfer model floor: DeepSeek-V4 weight loading (see deepseek_v4_weights.h).
// The rename table is spec §2.1 (transformers 5.17 conversion_mapping.py "deepseek_v4"),
// applied by whole name segments rather than substrings so "attn.compressor.*" and
// "attn.indexer.compressor.*" can never be confused.
#include "model/deepseek_v4_weights.h"

#include <cstring>
#include <utility>

#include "core/error.h"
#include "model/weights.h"

namespace dsinfer {

namespace {

// Original DeepSeek layer suffix (without ".weight") → transformers suffix (without ".weight").
const std::pair<const char*, const char*> kLayerLinearRenames[] = {
    {"attn.wq_a", "self_attn.q_a_proj"},
    {"attn.wq_b", "self_attn.q_b_proj"},
    {"attn.wkv", "self_attn.kv_proj"},
    {"attn.wo_a", "self_attn.o_a_proj"},
    {"attn.wo_b", "self_attn.o_b_proj"},
    {"attn.q_norm", "self_attn.q_a_norm"},
    {"attn.kv_norm", "self_attn.kv_norm"},
    {"attn_norm", "input_layernorm"},
    {"ffn_norm", "post_attention_layernorm"},
    {"attn.compressor.wkv", "self_attn.compressor.kv_proj"},
    {"attn.compressor.wgate", "self_attn.compressor.gate_proj"},
    {"attn.compressor.norm", "self_attn.compressor.kv_norm"},
    {"attn.indexer.compressor.wkv", "self_attn.compressor.indexer.kv_proj"},
    {"attn.indexer.compressor.wgate", "self_attn.compressor.indexer.gate_proj"},
    {"attn.indexer.compressor.norm", "self_attn.compressor.indexer.kv_norm"},
    {"attn.indexer.wq_b", "self_attn.compressor.indexer.q_b_proj"},
    {"attn.indexer.weights_proj", "self_attn.compressor.indexer.scorer.weights_proj"},
    {"ffn.gate", "mlp.gate"},
    {"ffn.shared_experts.w1", "mlp.shared_experts.gate_proj"},
    {"ffn.shared_experts.w2", "mlp.shared_experts.down_proj"},
    {"ffn.shared_experts.w3", "mlp.shared_experts.up_proj"},
};
// Original layer parameter (no ".weight") → transformers name.
const std::pair<const char*, const char*> kLayerParamRenames[] = {
    {"hc_attn_fn", "attn_hc.fn"},     {"hc_attn_base", "attn_hc.base"},   {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},       {"hc_ffn_base", "ffn_hc.base"},     {"hc_ffn_scale", "ffn_hc.scale"},
    {"attn.attn_sink", "self_attn.sinks"},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
};

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string layer_suffix_canonical(const std::string& suf) {
  for (const auto& [from, to] : kLayerParamRenames)
    if (suf == from) return to;
  for (const auto& [from, to] : kLayerLinearRenames) {
    const std::string f = from;
    if (suf == f + ".weight") return std::string(to) + ".weight";
    if (suf == f + ".scale") return std::string(to) + ".weight_scale_inv";
  }
  // Per-expert original names: ffn.experts.{e}.w{1,2,3}.{weight,scale}.
  if (starts_with(suf, "ffn.experts.")) {
    std::string rest = "mlp.experts." + suf.substr(std::strlen("ffn.experts."));
    const size_t dot = rest.rfind('.');
    if (dot != std::string::npos && rest.substr(dot) == ".scale") rest = rest.substr(0, dot) + ".weight_scale_inv";
    return rest;
  }
  return suf;  // already a transformers name
}

}  // namespace

uint64_t V4Linear::bytes() const {
  return quantized ? quant_weight_bytes(quant) : static_cast<uint64_t>(plain.rows * plain.cols) * dtype_size(plain.dtype);
}

void v4_matmul(const float* x, int64_t m, const V4Linear& w, float* y) {
  if (w.quantized) matmul_quant(x, m, w.quant, y);
  else matmul(x, m, w.plain, y);
}

// "mtp.{s}.{rest}" (DSpark drafter stages): the layer renames apply to the block tensors;
// the stage-level extras keep their names, with hc_head_* and ".scale" siblings canonicalised
// as for the target.
static std::string mtp_canonical(const std::string& s) {
  const size_t dot = s.find('.', 4);
  if (dot == std::string::npos || dot == 4) return s;
  for (size_t i = 4; i < dot; ++i)
    if (s[i] < '0' || s[i] > '9') return s;
  const std::string stage = s.substr(0, dot + 1), rest = s.substr(dot + 1);
  if (rest == "hc_head_fn") return stage + "hc_head.hc_fn";
  if (rest == "hc_head_base") return stage + "hc_head.hc_base";
  if (rest == "hc_head_scale") return stage + "hc_head.hc_scale";
  std::string c = layer_suffix_canonical(rest);
  if (c == rest && c.size() > 6 && c.compare(c.size() - 6, 6, ".scale") == 0)
    c = c.substr(0, c.size() - 6) + ".weight_scale_inv";
  return stage + c;
}

std::string V4TensorIndex::canonical_name(const std::string& stored) {
  std::string s = starts_with(stored, "model.") ? stored.substr(6) : stored;
  if (starts_with(s, "mtp.")) return mtp_canonical(s);
  if (s == "embed.weight") return "embed_tokens.weight";
  if (s == "head.weight") return "lm_head.weight";
  if (s == "hc_head_fn") return "hc_head.hc_fn";
  if (s == "hc_head_base") return "hc_head.hc_base";
  if (s == "hc_head_scale") return "hc_head.hc_scale";
  if (starts_with(s, "layers.")) {
    const size_t dot = s.find('.', 7);
    if (dot == std::string::npos) return s;
    return s.substr(0, dot + 1) + layer_suffix_canonical(s.substr(dot + 1));
  }
  return s;
}

V4TensorIndex::V4TensorIndex(const std::string& model_dir, MappedFile::Placement placement) : dir_(model_dir) {
  set_ = SafetensorsSet::open_dir(model_dir, placement);
  for (const auto& [name, loc] : set_->tensors()) {
    const std::string c = canonical_name(name);
    if (c.empty()) continue;
    auto [it, fresh] = by_canonical_.emplace(c, &loc);
    if (!fresh)
      throw Error(loc.file->path() + ": tensor '" + name + "' and '" + it->second->tensor->name +
                  "' are the same DeepSeek-V4 parameter ('" + c + "') under two naming schemes");
  }
}

const TensorLocation* V4TensorIndex::find(const std::string& canonical) const {
  auto it = by_canonical_.find(canonical);
  return it == by_canonical_.end() ? nullptr : it->second;
}

std::string V4TensorIndex::where() const {
  return set_->files().size() == 1 ? set_->files()[0]->path() : dir_ + "/model.safetensors.index.json";
}

class V4WeightLoader {
 public:
  V4WeightLoader(const V4TensorIndex& ix, std::deque<std::vector<uint8_t>>& owned) : ix_(ix), owned_(owned) {}

  const TensorLocation& need(const std::string& name) const {
    const TensorLocation* loc = ix_.find(name);
    if (!loc) throw Error(ix_.where() + ": tensor '" + name + "' (or its original DeepSeek name) not found");
    return *loc;
  }
  [[noreturn]] void bad_shape(const TensorLocation& l, const std::vector<int64_t>& want) const {
    throw Error(l.file->path() + ": tensor '" + l.tensor->name + "': shape " + shape_str(l.tensor->shape) +
                " but the config implies " + shape_str(want));
  }
  [[noreturn]] void bad_dtype(const TensorLocation& l, const char* allowed) const {
    throw Error(l.file->path() + ": tensor '" + l.tensor->name + "': dtype " + dtype_name(l.tensor->dtype) +
                " not one of " + allowed);
  }

  // F32 copy of a float tensor of the given shape.
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorLocation& l = need(name);
    const DType dt = l.tensor->dtype;
    if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16) bad_dtype(l, "F32, BF16, F16");
    if (l.tensor->shape != shape) bad_shape(l, shape);
    const uint8_t* p = l.file->tensor_data(*l.tensor);
    std::vector<float> v(static_cast<size_t>(l.tensor->numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(p, dt, static_cast<int64_t>(i));
    return v;
  }

  // A plain matrix view from `data` (rows × cols of dtype `dt`), converted/copied as needed.
  WeightView view(const uint8_t* data, DType dt, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    const bool misaligned = reinterpret_cast<uintptr_t>(data) % dtype_size(dt) != 0;
    if (dt == DType::F16 || misaligned) {
      const DType target = dt == DType::BF16 ? DType::BF16 : DType::F32;
      owned_.emplace_back(static_cast<size_t>(n) * dtype_size(target));
      uint8_t* dst = owned_.back().data();
      if (target == dt) std::memcpy(dst, data, static_cast<size_t>(n) * dtype_size(dt));
      else
        for (int64_t i = 0; i < n; ++i) {
          const float f = load_as_f32(data, dt, i);
          std::memcpy(dst + 4 * i, &f, 4);
        }
      return WeightView{dst, target, rows, cols};
    }
    return WeightView{data, dt, rows, cols};
  }

  // name ends in ".weight" for linears; hc fn tensors have no suffix and no scale.
  V4Linear linear(const std::string& name, int64_t rows, int64_t cols) {
    const TensorLocation& l = need(name);
    V4Linear w;
    const TensorLocation* sc = ix_.find(name + "_scale_inv");
    const DType dt = l.tensor->dtype;
    if (sc) {
      if (dtype_size(dt) != 1) bad_dtype(l, "a 1-byte code type (a '.scale' sibling marks it FP8/FP4)");
      if (dtype_size(sc->tensor->dtype) != 1) bad_dtype(*sc, "a 1-byte E8M0 scale type");
      const auto& shp = l.tensor->shape;
      if (shp == std::vector<int64_t>{rows, cols}) {
        const std::vector<int64_t> want{(rows + 127) / 128, (cols + 127) / 128};
        if (sc->tensor->shape != want) bad_shape(*sc, want);
        w.quant = {QuantFormat::Fp8Block128, l.file->tensor_data(*l.tensor), sc->file->tensor_data(*sc->tensor), rows, cols};
      } else if (cols % 32 == 0 && shp == std::vector<int64_t>{rows, cols / 2}) {
        const std::vector<int64_t> want{rows, cols / 32};
        if (sc->tensor->shape != want) bad_shape(*sc, want);
        w.quant = {QuantFormat::Fp4Group32, l.file->tensor_data(*l.tensor), sc->file->tensor_data(*sc->tensor), rows, cols};
      } else {
        bad_shape(l, {rows, cols});
      }
      w.quantized = true;
      return w;
    }
    if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16) bad_dtype(l, "F32, BF16, F16");
    if (l.tensor->shape != std::vector<int64_t>{rows, cols}) bad_shape(l, {rows, cols});
    w.plain = view(l.file->tensor_data(*l.tensor), dt, rows, cols);
    return w;
  }

  std::vector<int32_t> ints(const std::string& name, const std::vector<int64_t>& shape, int32_t lo, int32_t hi) const {
    const TensorLocation& l = need(name);
    if (l.tensor->shape != shape) bad_shape(l, shape);
    const DType dt = l.tensor->dtype;
    if (dt != DType::I64 && dt != DType::I32) bad_dtype(l, "I64, I32");
    const uint8_t* p = l.file->tensor_data(*l.tensor);
    std::vector<int32_t> v(static_cast<size_t>(l.tensor->numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t x;
      if (dt == DType::I64) std::memcpy(&x, p + 8 * i, 8);
      else {
        int32_t y;
        std::memcpy(&y, p + 4 * i, 4);
        x = y;
      }
      if (x < lo || x >= hi)
        throw Error(l.file->path() + ": tensor '" + l.tensor->name + "': value " + std::to_string(x) + " at index " +
                    std::to_string(i) + " outside [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
      v[i] = static_cast<int32_t>(x);
    }
    return v;
  }

 private:
  const V4TensorIndex& ix_;
  std::deque<std::vector<uint8_t>>& owned_;
};

V4LayerWeights load_v4_block(const V4TensorIndex& ix, const DeepseekV4Config& c, const std::string& prefix, V4Attn attn,
                             int compress_rate, bool hash, std::deque<std::vector<uint8_t>>& owned, uint64_t& bytes,
                             uint64_t& expert_bytes) {
  V4WeightLoader ld(ix, owned);
  const int64_t D = c.hidden, V = c.vocab, d = c.head_dim, H = c.heads, nhc = c.hc_mult, M = c.hc_mix();
  const int64_t I = c.moe_inter, E = c.experts, G = c.o_groups;
  auto add = [&](const V4Linear& w) { bytes += w.bytes(); };
  V4LayerWeights L;
  const std::string& p = prefix;
  L.attn = attn;
  L.hash = hash;
  L.attn_hc_fn = ld.linear(p + "attn_hc.fn", M, nhc * D);
  L.ffn_hc_fn = ld.linear(p + "ffn_hc.fn", M, nhc * D);
  L.attn_hc_base = ld.floats(p + "attn_hc.base", {M});
  L.ffn_hc_base = ld.floats(p + "ffn_hc.base", {M});
  L.attn_hc_scale = ld.floats(p + "attn_hc.scale", {3});
  L.ffn_hc_scale = ld.floats(p + "ffn_hc.scale", {3});
  L.in_norm = ld.floats(p + "input_layernorm.weight", {D});
  L.post_norm = ld.floats(p + "post_attention_layernorm.weight", {D});
  const std::string a = p + "self_attn.";
  L.q_a = ld.linear(a + "q_a_proj.weight", c.q_lora, D);
  L.q_a_norm = ld.floats(a + "q_a_norm.weight", {c.q_lora});
  L.q_b = ld.linear(a + "q_b_proj.weight", H * d, c.q_lora);
  L.kv = ld.linear(a + "kv_proj.weight", d, D);
  L.kv_norm = ld.floats(a + "kv_norm.weight", {d});
  L.o_a = ld.linear(a + "o_a_proj.weight", G * c.o_lora, H * d / G);
  L.o_b = ld.linear(a + "o_b_proj.weight", D, G * c.o_lora);
  if (L.o_a.quantized && L.o_a.quant.format == QuantFormat::Fp8Block128 && G > 1 && c.o_lora % 128 != 0)
    throw Error(ix.where() + ": tensor '" + a + "o_a_proj.weight': FP8 with o_lora_rank " + std::to_string(c.o_lora) +
                " (the per-group row blocks must align with the 128-row scale blocks)");
  L.sinks = ld.floats(a + "sinks", {H});
  for (const V4Linear* w : {&L.attn_hc_fn, &L.ffn_hc_fn, &L.q_a, &L.q_b, &L.kv, &L.o_a, &L.o_b}) add(*w);
  if (L.attn != V4Attn::Sliding) {
    const bool csa = L.attn == V4Attn::CSA;
    const int64_t width = csa ? 2 * d : d;
    const std::string cp = a + "compressor.";
    V4Compressor& C = L.comp;
    C.rate = compress_rate;
    C.dim = static_cast<int>(d);
    C.overlap = csa;
    C.kv = ld.linear(cp + "kv_proj.weight", width, D);
    C.gate = ld.linear(cp + "gate_proj.weight", width, D);
    C.pos_bias = ld.floats(cp + "position_bias", {C.rate, width});
    C.norm = ld.floats(cp + "kv_norm.weight", {d});
    add(C.kv);
    add(C.gate);
    if (csa) {
      const int64_t dI = c.idx_head_dim, HI = c.idx_heads;
      const std::string ip = cp + "indexer.";
      V4Compressor& X = L.idx;
      X.rate = C.rate;
      X.dim = static_cast<int>(dI);
      X.overlap = true;
      X.kv = ld.linear(ip + "kv_proj.weight", 2 * dI, D);
      X.gate = ld.linear(ip + "gate_proj.weight", 2 * dI, D);
      X.pos_bias = ld.floats(ip + "position_bias", {X.rate, 2 * dI});
      X.norm = ld.floats(ip + "kv_norm.weight", {dI});
      L.idx_q_b = ld.linear(ip + "q_b_proj.weight", HI * dI, c.q_lora);
      L.idx_weights = ld.linear(ip + "scorer.weights_proj.weight", HI, D);
      for (const V4Linear* w : {&X.kv, &X.gate, &L.idx_q_b, &L.idx_weights}) add(*w);
    }
  }
  const std::string m = p + "mlp.";
  L.router = ld.linear(m + "gate.weight", E, D);
  add(L.router);
  if (L.hash) L.tid2eid = ld.ints(m + "gate.tid2eid", {V, c.top_k}, 0, static_cast<int32_t>(E));
  else L.score_bias = ld.floats(m + "gate.e_score_correction_bias", {E});
  L.experts.resize(E);
  uint64_t before = bytes;
  if (ix.find(m + "experts.gate_up_proj")) {
    // Stacked transformers layout: expert e's gate/up/down are row blocks of one tensor.
    const TensorLocation& gu = ld.need(m + "experts.gate_up_proj");
    const TensorLocation& dn = ld.need(m + "experts.down_proj");
    if (gu.tensor->shape != std::vector<int64_t>{E, 2 * I, D}) ld.bad_shape(gu, {E, 2 * I, D});
    if (dn.tensor->shape != std::vector<int64_t>{E, D, I}) ld.bad_shape(dn, {E, D, I});
    for (const TensorLocation* t : {&gu, &dn})
      if (t->tensor->dtype != DType::F32 && t->tensor->dtype != DType::BF16 && t->tensor->dtype != DType::F16)
        ld.bad_dtype(*t, "F32, BF16, F16");
    const WeightView gu_all = ld.view(gu.file->tensor_data(*gu.tensor), gu.tensor->dtype, E * 2 * I, D);
    const WeightView dn_all = ld.view(dn.file->tensor_data(*dn.tensor), dn.tensor->dtype, E * D, I);
    const size_t es_gu = dtype_size(gu_all.dtype), es_dn = dtype_size(dn_all.dtype);
    for (int64_t e = 0; e < E; ++e) {
      const auto* g0 = static_cast<const uint8_t*>(gu_all.data) + (e * 2 * I) * D * es_gu;
      L.experts[e].gate.plain = {g0, gu_all.dtype, I, D};
      L.experts[e].up.plain = {g0 + I * D * es_gu, gu_all.dtype, I, D};
      L.experts[e].down.plain = {static_cast<const uint8_t*>(dn_all.data) + e * D * I * es_dn, dn_all.dtype, D, I};
    }
    bytes += static_cast<uint64_t>(E * 3 * I * D) * es_gu;
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = m + "experts." + std::to_string(e) + ".";
      L.experts[e].gate = ld.linear(ep + "w1.weight", I, D);
      L.experts[e].up = ld.linear(ep + "w3.weight", I, D);
      L.experts[e].down = ld.linear(ep + "w2.weight", D, I);
      add(L.experts[e].gate);
      add(L.experts[e].up);
      add(L.experts[e].down);
    }
  }
  expert_bytes += bytes - before;
  L.shared.gate = ld.linear(m + "shared_experts.gate_proj.weight", I, D);
  L.shared.up = ld.linear(m + "shared_experts.up_proj.weight", I, D);
  L.shared.down = ld.linear(m + "shared_experts.down_proj.weight", D, I);
  add(L.shared.gate);
  add(L.shared.up);
  add(L.shared.down);
  return L;
}

V4Linear load_v4_linear(const V4TensorIndex& ix, const std::string& name, int64_t rows, int64_t cols,
                        std::deque<std::vector<uint8_t>>& owned) {
  return V4WeightLoader(ix, owned).linear(name, rows, cols);
}

std::vector<float> load_v4_floats(const V4TensorIndex& ix, const std::string& name, const std::vector<int64_t>& shape) {
  std::deque<std::vector<uint8_t>> none;
  return V4WeightLoader(ix, none).floats(name, shape);
}

uint64_t v4_decode_weight_bytes(const V4Weights& w, const DeepseekV4Config& c) {
  const uint64_t per_layer_expert = c.experts ? w.expert_bytes / c.layers / c.experts : 0;
  const uint64_t unread_embed =
      c.tie ? 0 : static_cast<uint64_t>(w.embed.rows - 1) * w.embed.cols * dtype_size(w.embed.dtype);
  return w.matrix_bytes - w.expert_bytes - unread_embed + per_layer_expert * c.top_k * c.layers;
}

V4Weights load_deepseek_v4_weights(const V4TensorIndex& ix, const DeepseekV4Config& c,
                                   std::deque<std::vector<uint8_t>>& owned) {
  V4WeightLoader ld(ix, owned);
  V4Weights W;
  const int64_t D = c.hidden, V = c.vocab, nhc = c.hc_mult;
  uint64_t bytes = 0;
  auto add = [&](const V4Linear& w) { bytes += w.bytes(); };

  {
    V4Linear e = ld.linear("embed_tokens.weight", V, D);
    if (e.quantized) throw Error(ix.where() + ": tensor 'embed_tokens.weight': a quantized embedding is not supported");
    W.embed = e.plain;
    add(e);
  }
  W.final_norm = ld.floats("norm.weight", {D});
  if (c.tie) {
    W.head.plain = W.embed;
  } else {
    W.head = ld.linear("lm_head.weight", V, D);
    add(W.head);
  }
  W.hc_head_fn = ld.linear("hc_head.hc_fn", nhc, nhc * D);
  W.hc_head_base = ld.floats("hc_head.hc_base", {nhc});
  W.hc_head_scale = ld.floats("hc_head.hc_scale", {1});
  add(W.hc_head_fn);

  W.layers.resize(c.layers);
  uint64_t expert_bytes = 0;
  for (int li = 0; li < c.layers; ++li)
    W.layers[li] = load_v4_block(ix, c, "layers." + std::to_string(li) + ".", c.attn[li], c.compress_rate(li),
                                 c.hash_moe[li], owned, bytes, expert_bytes);
  W.expert_bytes = expert_bytes;
  W.matrix_bytes = bytes;
  return W;
}

}  // namespace dsinfer
