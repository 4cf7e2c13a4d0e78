// dsinfer model floor: DeepSeek-V4 config.json parsing (see deepseek_v4_config.h).
// Every rule here mirrors transformers 5.17 configuration_deepseek_v4.py __post_init__;
// the comments say which legacy spelling each branch accepts.
#include "model/deepseek_v4_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"

namespace dsinfer {

using json = nlohmann::json;

namespace {

struct Reader {
  const json& j;
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(file + ": field '" + field + "': " + why);
  }
  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  int integer(const char* k, int def, int lo, int hi) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    if (!v.is_number_integer()) fail(k, "expected an integer");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(k, "value " + std::to_string(x) + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<int>(x);
  }
  double number(const char* k, double def) const {
    if (!has(k)) return def;
    if (!j.at(k).is_number()) fail(k, "expected a number");
    return j.at(k).get<double>();
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j.at(k).is_boolean()) fail(k, "expected true/false");
    return j.at(k).get<bool>();
  }
  std::string str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j.at(k).is_string()) fail(k, "expected a string");
    return j.at(k).get<std::string>();
  }
};

V4Attn attn_from_name(const std::string& s, const Reader& r, const std::string& field) {
  if (s == "sliding_attention") return V4Attn::Sliding;
  if (s == "compressed_sparse_attention") return V4Attn::CSA;
  if (s == "heavily_compressed_attention") return V4Attn::HCA;
  r.fail(field, "unknown layer type '" + s +
                    "' (expected sliding_attention, compressed_sparse_attention or heavily_compressed_attention)");
}

// One flat RoPE dict ({rope_type|type, factor, original_max_position_embeddings, beta_*}).
void read_rope(const json& o, const std::string& file, const std::string& field, RopeConfig& r) {
  if (!o.is_object()) throw Error(file + ": field '" + field + "': expected an object");
  Reader f{o, file + " (" + field + ")"};
  r.type = f.str("rope_type", f.str("type", "default"));
  r.theta = f.number("rope_theta", r.theta);
  r.factor = f.number("factor", 1.0);
  r.original_max_position_embeddings = f.integer("original_max_position_embeddings", 0, 0, 1 << 30);
  r.beta_fast = f.number("beta_fast", 32.0);
  r.beta_slow = f.number("beta_slow", 1.0);
  if (r.type != "default" && r.type != "yarn" && r.type != "linear")
    throw Error(file + ": field '" + field + ".rope_type': unsupported RoPE type '" + r.type + "' (supported: default, linear, yarn)");
  if (!(r.theta > 0)) throw Error(file + ": field '" + field + ".rope_theta': must be > 0");
  if (r.type != "default" && !(r.factor > 0)) throw Error(file + ": field '" + field + ".factor': must be > 0");
}

}  // namespace

const char* v4_attn_name(V4Attn a) {
  switch (a) {
    case V4Attn::Sliding: return "sliding_attention";
    case V4Attn::CSA: return "compressed_sparse_attention";
    case V4Attn::HCA: return "heavily_compressed_attention";
  }
  return "?";
}

DeepseekV4Config parse_deepseek_v4_config(const ModelConfig& g) {
  const std::string file = g.model_dir + "/config.json";
  const json j = read_json_file(file);
  Reader f{j, file};
  DeepseekV4Config c;
  c.vocab = g.vocab_size;
  c.hidden = g.hidden_size;
  c.layers = g.num_hidden_layers;
  c.heads = g.num_attention_heads;
  c.head_dim = f.integer("head_dim", 512, 2, 1 << 14);
  c.q_lora = f.integer("q_lora_rank", 1024, 1, 1 << 16);
  c.o_groups = f.integer("o_groups", 8, 1, 4096);
  c.o_lora = f.integer("o_lora_rank", 1024, 1, 1 << 16);
  if (c.heads % c.o_groups != 0) f.fail("o_groups", "must divide num_attention_heads (" + std::to_string(c.heads) + ")");
  c.experts = f.integer("n_routed_experts", f.integer("num_local_experts", 256, 1, 1 << 16), 1, 1 << 16);
  c.top_k = f.integer("num_experts_per_tok", 6, 1, 1 << 16);
  if (c.top_k > c.experts) f.fail("num_experts_per_tok", "exceeds n_routed_experts (" + std::to_string(c.experts) + ")");
  c.moe_inter = f.integer("moe_intermediate_size", f.integer("intermediate_size", 2048, 1, 1 << 20), 1, 1 << 20);
  c.routed_scale = f.number("routed_scaling_factor", 1.5);
  c.swiglu_limit = f.number("swiglu_limit", 10.0);
  const std::string scoring = f.str("scoring_func", "sqrtsoftplus");
  if (scoring != "sqrtsoftplus" && scoring != "sigmoid")
    f.fail("scoring_func", "'" + scoring + "' is not supported (sqrtsoftplus, sigmoid)");
  c.sigmoid_scores = scoring == "sigmoid";
  const std::string act = f.str("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act", "'" + act + "' is not supported (silu)");
  c.window = f.integer("sliding_window", 128, 1, 1 << 24);
  c.idx_heads = f.integer("index_n_heads", 64, 1, 4096);
  c.idx_head_dim = f.integer("index_head_dim", 128, 1, 1 << 14);
  c.idx_topk = f.integer("index_topk", 512, 1, 1 << 24);
  c.hc_mult = f.integer("hc_mult", 4, 1, 64);
  c.hc_iters = f.integer("hc_sinkhorn_iters", 20, 1, 1000);
  c.hc_eps = f.number("hc_eps", 1e-6);
  c.eps = f.number("rms_norm_eps", 1e-6);
  c.tie = f.boolean("tie_word_embeddings", false);
  c.max_pos = f.integer("max_position_embeddings", 1048576, 1, 1 << 30);

  // Compression rates: compress_rates dict, then legacy scalar overrides.
  if (f.has("compress_rates")) {
    const json& cr = j.at("compress_rates");
    if (!cr.is_object()) f.fail("compress_rates", "expected an object");
    Reader r{cr, file + " (compress_rates)"};
    c.rate_csa = r.integer("compressed_sparse_attention", 4, 1, 1 << 20);
    c.rate_hca = r.integer("heavily_compressed_attention", 128, 1, 1 << 20);
  }
  c.rate_csa = f.integer("compress_rate_csa", c.rate_csa, 1, 1 << 20);
  c.rate_hca = f.integer("compress_rate_hca", c.rate_hca, 1, 1 << 20);

  // Attention schedule: layer_types > legacy compress_ratios > the class default (V4-Pro).
  if (f.has("layer_types")) {
    const json& lt = j.at("layer_types");
    if (!lt.is_array()) f.fail("layer_types", "expected a list of strings");
    for (size_t i = 0; i < lt.size(); ++i) {
      if (!lt[i].is_string()) f.fail("layer_types", "expected a list of strings");
      c.attn.push_back(attn_from_name(lt[i].get<std::string>(), f, "layer_types[" + std::to_string(i) + "]"));
    }
  } else if (f.has("compress_ratios")) {
    const json& cr = j.at("compress_ratios");
    if (!cr.is_array()) f.fail("compress_ratios", "expected a list of integers");
    for (size_t i = 0; i < cr.size(); ++i) {
      const int64_t v = cr[i].is_number_integer() ? cr[i].get<int64_t>() : -1;
      if (v == 0) c.attn.push_back(V4Attn::Sliding);
      else if (v == 4) c.attn.push_back(V4Attn::CSA);
      else if (v == 128) c.attn.push_back(V4Attn::HCA);
      else f.fail("compress_ratios[" + std::to_string(i) + "]", "only 0, 4 and 128 are accepted");
    }
  } else {
    for (int i = 0; i < c.layers; ++i)
      c.attn.push_back(i < 2 ? V4Attn::HCA : (i - 2) % 2 ? V4Attn::CSA : V4Attn::HCA);
  }
  if (static_cast<int>(c.attn.size()) < c.layers)
    f.fail(f.has("layer_types") ? "layer_types" : "compress_ratios",
           "has " + std::to_string(c.attn.size()) + " entries for " + std::to_string(c.layers) + " layers");
  if (f.has("layer_types") && static_cast<int>(c.attn.size()) != c.layers)
    f.fail("layer_types", "must have num_hidden_layers (" + std::to_string(c.layers) + ") entries");
  c.attn.resize(c.layers);  // compress_ratios carries one extra entry per MTP layer

  if (f.has("mlp_layer_types")) {
    const json& mt = j.at("mlp_layer_types");
    if (!mt.is_array() || static_cast<int>(mt.size()) != c.layers)
      f.fail("mlp_layer_types", "expected a list of num_hidden_layers strings");
    for (const json& e : mt) {
      const std::string s = e.is_string() ? e.get<std::string>() : "";
      if (s != "hash_moe" && s != "moe") f.fail("mlp_layer_types", "entries must be 'hash_moe' or 'moe'");
      c.hash_moe.push_back(s == "hash_moe");
    }
  } else {
    const int n_hash = f.integer("num_hash_layers", 3, 0, 1 << 16);
    for (int i = 0; i < c.layers; ++i) c.hash_moe.push_back(i < n_hash);
  }

  // Rotary width: partial_rotary_factor > qk_rope_head_dim / head_dim > 64/512.
  double prf = 64.0 / 512.0;
  if (f.has("partial_rotary_factor")) prf = f.number("partial_rotary_factor", prf);
  else if (f.has("qk_rope_head_dim")) prf = static_cast<double>(f.integer("qk_rope_head_dim", 64, 0, 1 << 14)) / c.head_dim;

  // RoPE: nested {"main", "compress"} (a transformers-saved config), else one flat dict
  // (rope_parameters, or legacy rope_scaling) that goes to "compress" only.
  c.rope_main.theta = f.number("rope_theta", 10000.0);
  c.rope_compress.theta = f.number("compress_rope_theta", 160000.0);
  const json* rp = nullptr;
  std::string rp_name;
  if (f.has("rope_parameters")) rp = &j.at("rope_parameters"), rp_name = "rope_parameters";
  else if (f.has("rope_scaling")) rp = &j.at("rope_scaling"), rp_name = "rope_scaling";
  if (rp && rp->is_object() && rp->contains("main") && rp->contains("compress")) {
    read_rope(rp->at("main"), file, rp_name + ".main", c.rope_main);
    read_rope(rp->at("compress"), file, rp_name + ".compress", c.rope_compress);
    if (rp->at("compress").contains("partial_rotary_factor") && rp->at("compress").at("partial_rotary_factor").is_number())
      prf = rp->at("compress").at("partial_rotary_factor").get<double>();
  } else if (rp) {
    const double theta = c.rope_compress.theta;
    read_rope(*rp, file, rp_name, c.rope_compress);
    c.rope_compress.theta = theta;  // compress_rope_theta always wins
  }
  c.rope_dim = static_cast<int>(c.head_dim * prf);
  if (c.rope_dim <= 0 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim)
    f.fail("partial_rotary_factor", "gives " + std::to_string(c.rope_dim) + " rotary dims; need an even number in (0, head_dim]");
  if (c.rope_dim > c.idx_head_dim)
    f.fail("index_head_dim", "must be >= the rotary width " + std::to_string(c.rope_dim) + " (the indexer rotates it too)");
  for (int i = 0; i < c.layers; ++i)
    if (c.attn[i] != V4Attn::Sliding && c.rope_compress.type == "linear")
      f.fail("rope_parameters", "linear RoPE scaling is not used by DeepSeek-V4");
  return c;
}

}  // namespace dsinfer
