// dsinfer model floor: the architecture-independent view of config.json and
// generation_config.json. Parsing (model/config.cpp) validates every field it reads and
// names the file and field in its errors.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsinfer {

struct RopeConfig {
  double theta = 10000.0;
  std::string type = "default";  // "default" | "yarn" | "linear" | ...
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
  double attention_factor = 0.0;  // 0 = derive (YaRN)
};

struct ModelConfig {
  std::string model_dir;
  std::string architecture;   // e.g. "Qwen3ForCausalLM"
  std::string model_type;     // e.g. "qwen3"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string hidden_act = "silu";
  bool use_sliding_window = false;  // Qwen2/3 family: sliding-window attention switch
  std::string torch_dtype;  // as declared ("bfloat16", "float32", ...)
  RopeConfig rope;

  // generation_config.json (optional file): end-of-sequence ids and sampling defaults.
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;
  int32_t pad_token_id = -1;
  double default_temperature = 1.0;
  double default_top_p = 1.0;
  int default_top_k = 0;
  bool default_do_sample = false;
};

// Parses DIR/config.json and (if present) DIR/generation_config.json.
ModelConfig load_model_config(const std::string& model_dir);

// The architecture a config declares: its 'architectures' entry, or without one its
// model_type. One rule for every loader that dispatches on it.
inline bool is_qwen3(const ModelConfig& c) {
  return c.architecture.empty() ? c.model_type == "qwen3" : c.architecture == "Qwen3ForCausalLM";
}
inline bool is_deepseek_v4(const ModelConfig& c) {
  return c.architecture.empty() ? c.model_type == "deepseek_v4" : c.architecture == "DeepseekV4ForCausalLM";
}

}  // namespace dsinfer
