// dsinfer model floor: synthetic Qwen3 checkpoints (see random_model.h). Each tensor's
// values come from its own splitmix64 stream seeded by (seed, tensor index), so a tensor
// is reproducible without generating the ones before it; normals via Box-Muller.
#include "model/random_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "model/safetensors.h"

namespace dsinfer {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills n values: `ones` → 1.0, else N(0, std).
void fill_values(uint8_t* dst, int64_t n, DType dt, uint64_t seed, bool ones, float std) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i += 2) {
    float v[2] = {1.0f, 1.0f};
    if (!ones) {
      // Box-Muller: two uniforms in (0, 1] → two independent normals.
      double u1 = (static_cast<double>(splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;
      double u2 = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;
      double r = std::sqrt(-2.0 * std::log(u1));
      v[0] = static_cast<float>(std * r * std::cos(2 * M_PI * u2));
      v[1] = static_cast<float>(std * r * std::sin(2 * M_PI * u2));
    }
    for (int k = 0; k < 2 && i + k < n; ++k) {
      if (dt == DType::BF16) {
        uint16_t h = f32_to_bf16(v[k]);
        std::memcpy(dst + 2 * (i + k), &h, 2);
      } else {
        std::memcpy(dst + 4 * (i + k), &v[k], 4);
      }
    }
  }
}

}  // namespace

ModelConfig random_model_preset(const std::string& like) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 1000000.0;
  c.max_position_embeddings = 40960;
  c.eos_token_ids = {151645};
  c.bos_token_id = 151643;
  if (like == "qwen3-0.6b") {
    c.vocab_size = 151936, c.hidden_size = 1024, c.intermediate_size = 3072, c.num_hidden_layers = 28;
    c.num_attention_heads = 16, c.num_key_value_heads = 8, c.head_dim = 128, c.tie_word_embeddings = true;
  } else if (like == "qwen3-1.7b") {
    c.vocab_size = 151936, c.hidden_size = 2048, c.intermediate_size = 6144, c.num_hidden_layers = 28;
    c.num_attention_heads = 16, c.num_key_value_heads = 8, c.head_dim = 128, c.tie_word_embeddings = true;
  } else if (like == "qwen3-4b") {
    c.vocab_size = 151936, c.hidden_size = 2560, c.intermediate_size = 9728, c.num_hidden_layers = 36;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128, c.tie_word_embeddings = true;
  } else if (like == "tiny") {
    c.vocab_size = 1024, c.hidden_size = 64, c.intermediate_size = 192, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16, c.tie_word_embeddings = false;
    c.rope.theta = 10000.0;
    c.max_position_embeddings = 4096;
    c.eos_token_ids = {2};
    c.bos_token_id = 1;
  } else {
    throw Error("--like '" + like + "': unknown preset (expected qwen3-0.6b, qwen3-1.7b, qwen3-4b or tiny)");
  }
  return c;
}

void write_random_model(const ModelConfig& c, DType dtype, const std::string& dir, uint64_t seed, uint64_t shard_bytes) {
  check(dtype == DType::F32 || dtype == DType::BF16, "random model: dtype must be F32 or BF16");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  check(!ec, dir + ": cannot create directory: " + ec.message());

  nlohmann::json cfg = {{"architectures", {c.architecture}},
                        {"model_type", c.model_type},
                        {"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"num_key_value_heads", c.num_key_value_heads},
                        {"head_dim", c.head_dim},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"rms_norm_eps", c.rms_norm_eps},
                        {"rope_theta", c.rope.theta},
                        {"tie_word_embeddings", c.tie_word_embeddings},
                        {"attention_bias", false},
                        {"hidden_act", "silu"},
                        {"use_sliding_window", false},
                        {"bos_token_id", c.bos_token_id},
                        {"eos_token_id", c.eos_token_ids.empty() ? 0 : c.eos_token_ids[0]},
                        {"torch_dtype", dtype == DType::BF16 ? "bfloat16" : "float32"}};
  std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
  nlohmann::json gen = {{"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_ids}, {"do_sample", false}};
  std::ofstream(dir + "/generation_config.json") << gen.dump(2) << "\n";

  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    bool ones;
  };
  std::vector<Spec> specs;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, false});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", {H}, true});
    specs.push_back({p + "self_attn.q_proj.weight", {c.num_attention_heads * D, H}, false});
    specs.push_back({p + "self_attn.k_proj.weight", {c.num_key_value_heads * D, H}, false});
    specs.push_back({p + "self_attn.v_proj.weight", {c.num_key_value_heads * D, H}, false});
    specs.push_back({p + "self_attn.q_norm.weight", {D}, true});
    specs.push_back({p + "self_attn.k_norm.weight", {D}, true});
    specs.push_back({p + "self_attn.o_proj.weight", {H, c.num_attention_heads * D}, false});
    specs.push_back({p + "post_attention_layernorm.weight", {H}, true});
    specs.push_back({p + "mlp.gate_proj.weight", {I, H}, false});
    specs.push_back({p + "mlp.up_proj.weight", {I, H}, false});
    specs.push_back({p + "mlp.down_proj.weight", {H, I}, false});
  }
  specs.push_back({"model.norm.weight", {H}, true});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, H}, false});

  // Group tensors into shards of at most shard_bytes (a single larger tensor gets its own).
  std::vector<std::vector<SafetensorsWriteItem>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(dtype);
    if (in_shard > 0 && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    const uint64_t tseed = seed * 0x100000001b3ull + i;
    const bool ones = s.ones;
    shards.back().push_back({s.name, dtype, s.shape, nullptr,
                             [n, dtype, tseed, ones](uint8_t* dst) { fill_values(dst, n, dtype, tseed, ones, 0.02f); }});
  }
  if (shards.size() == 1) {
    write_safetensors(dir + "/model.safetensors", shards[0], {{"format", "pt"}});
    return;
  }
  nlohmann::json wm = nlohmann::json::object();
  char name[64];
  uint64_t total = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    write_safetensors(dir + "/" + name, shards[k], {{"format", "pt"}});
    for (const auto& it : shards[k]) {
      wm[it.name] = name;
      uint64_t n = dtype_size(dtype);
      for (int64_t d : it.shape) n *= static_cast<uint64_t>(d);
      total += n;
    }
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", wm}}.dump(2) << "\n";
}

}  // namespace dsinfer
