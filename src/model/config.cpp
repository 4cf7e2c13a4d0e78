// dsinfer model floor: config.json / generation_config.json parsing.
// Every field read is type-checked; errors name "<dir>/config.json: field 'x': ...".
// RoPE settings are accepted in both spellings seen in the wild: transformers <= 4.x
// (`rope_theta` at top level, optional `rope_scaling` object) and transformers 5.x
// (`rope_parameters` object holding `rope_theta`, `rope_type` and scaling fields).
#include "model/config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"

namespace dsinfer {

using json = nlohmann::json;

namespace {

struct Fields {
  const json& j;
  std::string file;

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error(file + ": field '" + field + "': " + why);
  }
  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  int int_req(const char* k, int lo, int hi) const {
    if (!has(k)) fail(k, "missing");
    return int_at(k, lo, hi);
  }
  int int_opt(const char* k, int def, int lo, int hi) const { return has(k) ? int_at(k, lo, hi) : def; }
  int int_at(const char* k, int lo, int hi) const {
    const json& v = j.at(k);
    if (!v.is_number_integer()) fail(k, "expected an integer, got " + std::string(v.type_name()));
    auto x = v.get<int64_t>();
    if (x < lo || x > hi) fail(k, "value " + std::to_string(x) + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<int>(x);
  }
  double num_opt(const char* k, double def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    if (!v.is_number()) fail(k, "expected a number, got " + std::string(v.type_name()));
    return v.get<double>();
  }
  bool bool_opt(const char* k, bool def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    if (!v.is_boolean()) fail(k, "expected true/false, got " + std::string(v.type_name()));
    return v.get<bool>();
  }
  std::string str_opt(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    if (!v.is_string()) fail(k, "expected a string, got " + std::string(v.type_name()));
    return v.get<std::string>();
  }
};

json parse_json_file(const std::string& path) {
  json j = read_json_file(path);
  if (!j.is_object()) throw Error(path + ": expected a JSON object at top level");
  return j;
}

void parse_rope_object(const json& r, const std::string& file, const std::string& name, RopeConfig& rope) {
  if (!r.is_object()) throw Error(file + ": field '" + name + "': expected an object");
  Fields f{r, file + " (" + name + ")"};
  rope.theta = f.num_opt("rope_theta", rope.theta);
  std::string type = f.str_opt("rope_type", f.str_opt("type", rope.type));
  rope.type = type;
  rope.factor = f.num_opt("factor", 1.0);
  rope.original_max_position_embeddings = f.int_opt("original_max_position_embeddings", 0, 0, 1 << 30);
  rope.beta_fast = f.num_opt("beta_fast", 32.0);
  rope.beta_slow = f.num_opt("beta_slow", 1.0);
  rope.mscale = f.num_opt("mscale", 1.0);
  rope.mscale_all_dim = f.num_opt("mscale_all_dim", 0.0);
  rope.attention_factor = f.num_opt("attention_factor", 0.0);
  if (type != "default" && type != "yarn" && type != "linear")
    throw Error(file + ": field '" + name + ".rope_type': unsupported RoPE type '" + type + "' (supported: default, linear, yarn)");
  if (rope.theta <= 0) throw Error(file + ": field '" + name + ".rope_theta': must be > 0");
  if ((type == "yarn" || type == "linear") && !(rope.factor > 0))
    throw Error(file + ": field '" + name + ".factor': must be > 0 for rope_type " + type);
}

}  // namespace

ModelConfig load_model_config(const std::string& model_dir) {
  ModelConfig c;
  c.model_dir = model_dir;
  const std::string file = model_dir + "/config.json";
  if (!file_exists(file)) throw Error(file + ": not found (is --model-path a Hugging Face model directory?)");
  json j = parse_json_file(file);
  Fields f{j, file};

  if (f.has("architectures")) {
    const json& a = j.at("architectures");
    if (!a.is_array() || a.empty() || !a.at(0).is_string()) f.fail("architectures", "expected a non-empty list of strings");
    c.architecture = a.at(0).get<std::string>();
  }
  c.model_type = f.str_opt("model_type", "");
  if (c.architecture.empty() && c.model_type.empty()) f.fail("architectures", "missing (and no model_type)");

  c.vocab_size = f.int_req("vocab_size", 1, 1 << 24);
  c.hidden_size = f.int_req("hidden_size", 1, 1 << 16);
  // DeepSeek-V4 configs name the (expert) width moe_intermediate_size; transformers aliases
  // intermediate_size to it.
  if (c.model_type == "deepseek_v4" && !f.has("intermediate_size"))
    c.intermediate_size = f.int_req("moe_intermediate_size", 1, 1 << 20);
  else
    c.intermediate_size = f.int_req("intermediate_size", 1, 1 << 20);
  c.num_hidden_layers = f.int_req("num_hidden_layers", 1, 4096);
  c.num_attention_heads = f.int_req("num_attention_heads", 1, 4096);
  c.num_key_value_heads = f.int_opt("num_key_value_heads", c.num_attention_heads, 1, 4096);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
  if (f.has("head_dim")) {
    c.head_dim = f.int_at("head_dim", 1, 4096);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) f.fail("head_dim", "missing and hidden_size is not divisible by num_attention_heads");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) f.fail("head_dim", "must be even for rotary embeddings");
  c.max_position_embeddings = f.int_opt("max_position_embeddings", 32768, 1, 1 << 30);
  c.rms_norm_eps = f.num_opt("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.fail("rms_norm_eps", "must be > 0");
  c.tie_word_embeddings = f.bool_opt("tie_word_embeddings", false);
  c.attention_bias = f.bool_opt("attention_bias", false);
  c.hidden_act = f.str_opt("hidden_act", "silu");
  c.use_sliding_window = f.bool_opt("use_sliding_window", false);
  c.torch_dtype = f.str_opt("torch_dtype", f.str_opt("dtype", ""));

  c.rope.theta = f.num_opt("rope_theta", 10000.0);
  if (f.has("rope_parameters")) {
    const json& rp = j.at("rope_parameters");
    // transformers 5 may nest per attention type: {"full_attention": {...}}.
    if (rp.is_object() && rp.contains("full_attention") && rp.at("full_attention").is_object())
      parse_rope_object(rp.at("full_attention"), file, "rope_parameters.full_attention", c.rope);
    else
      parse_rope_object(rp, file, "rope_parameters", c.rope);
  } else if (f.has("rope_scaling")) {
    parse_rope_object(j.at("rope_scaling"), file, "rope_scaling", c.rope);
  }

  auto read_ids = [](const json& v, const std::string& where, std::vector<int32_t>& out) {
    if (v.is_null()) return;
    if (v.is_number_integer()) {
      out.push_back(v.get<int32_t>());
    } else if (v.is_array()) {
      for (const auto& e : v) {
        if (!e.is_number_integer()) throw Error(where + ": expected integer ids");
        out.push_back(e.get<int32_t>());
      }
    } else {
      throw Error(where + ": expected an integer or a list of integers");
    }
  };
  if (f.has("eos_token_id")) read_ids(j.at("eos_token_id"), file + ": field 'eos_token_id'", c.eos_token_ids);
  c.bos_token_id = f.int_opt("bos_token_id", -1, -1, 1 << 24);

  const std::string gfile = model_dir + "/generation_config.json";
  if (file_exists(gfile)) {
    json g = parse_json_file(gfile);
    Fields gf{g, gfile};
    if (gf.has("eos_token_id")) {
      c.eos_token_ids.clear();
      read_ids(g.at("eos_token_id"), gfile + ": field 'eos_token_id'", c.eos_token_ids);
    }
    c.bos_token_id = gf.int_opt("bos_token_id", c.bos_token_id, -1, 1 << 24);
    c.pad_token_id = gf.int_opt("pad_token_id", -1, -1, 1 << 24);
    c.default_temperature = gf.num_opt("temperature", 1.0);
    c.default_top_p = gf.num_opt("top_p", 1.0);
    c.default_top_k = gf.int_opt("top_k", 0, 0, 1 << 24);
    c.default_do_sample = gf.bool_opt("do_sample", false);
  }
  for (int32_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      throw Error(file + ": eos_token_id " + std::to_string(id) + " outside the vocabulary (vocab_size " + std::to_string(c.vocab_size) + ")");
  return c;
}

}  // namespace dsinfer
