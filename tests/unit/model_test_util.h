// Test helpers for the model floor: temporary directories, tiny random Qwen3 checkpoints
// written to disk (config.json + model.safetensors), and an independent double-precision
// reference forward pass used to check the engine's numbers.
//
// The reference is deliberately written the slow, obvious way (full causal recompute over
// the whole sequence, no KV cache, double everywhere, its own RoPE/YaRN derivation) and
// shares no code with src/model or src/kernels beyond the safetensors writer.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/safetensors.h"

namespace dsinfer::test {

struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsinfer_model_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (!p) std::abort();
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

struct TinySpec {
  int vocab = 97, hidden = 32, inter = 48, layers = 2, heads = 4, kv_heads = 2, head_dim = 8;
  bool tied = false, bias = false;
  std::string rope_type = "default";  // "default" | "yarn" | "linear"
  double theta = 10000.0, factor = 4.0;
  int orig_max = 16, max_pos = 256;
  DType dtype = DType::F32;
  uint32_t seed = 1;
};

// Weights as the model sees them (after the on-disk dtype rounding), by HF name.
using WeightMap = std::map<std::string, std::vector<float>>;

// Random N(mean, std) tensors recorded in creation order, so the safetensors file a test
// writes and the reference it computes agree on names, shapes and values.
struct RandomTensors {
  explicit RandomTensors(uint32_t seed) : rng(seed) {}
  std::mt19937 rng;
  std::normal_distribution<float> nd{0.0f, 1.0f};
  WeightMap w;
  std::vector<std::pair<std::string, std::vector<int64_t>>> order;
  void mat(const std::string& name, int64_t rows, int64_t cols, float std) {
    std::vector<float> v(rows * cols);
    for (auto& x : v) x = std * nd(rng);
    w[name] = v;
    order.push_back({name, {rows, cols}});
  }
  void vec(const std::string& name, int64_t n, float mean, float std) {
    std::vector<float> v(n);
    for (auto& x : v) x = mean + std * nd(rng);
    w[name] = v;
    order.push_back({name, {n}});
  }
};

inline nlohmann::json tiny_config_json(const TinySpec& s) {
  nlohmann::json c = {{"architectures", {"Qwen3ForCausalLM"}},
                      {"model_type", "qwen3"},
                      {"vocab_size", s.vocab},
                      {"hidden_size", s.hidden},
                      {"intermediate_size", s.inter},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim},
                      {"max_position_embeddings", s.max_pos},
                      {"rms_norm_eps", 1e-6},
                      {"tie_word_embeddings", s.tied},
                      {"attention_bias", s.bias},
                      {"hidden_act", "silu"},
                      {"rope_theta", s.theta},
                      {"torch_dtype", s.dtype == DType::BF16 ? "bfloat16" : "float32"}};
  if (s.rope_type != "default") {
    c["rope_scaling"] = {{"rope_type", s.rope_type}, {"factor", s.factor}};
    if (s.rope_type == "yarn") c["rope_scaling"]["original_max_position_embeddings"] = s.orig_max;
  }
  return c;
}

// Writes DIR/config.json and DIR/model.safetensors; returns the weights for the reference.
inline WeightMap write_tiny_model(const std::string& dir, const TinySpec& s) {
  write_text(dir + "/config.json", tiny_config_json(s).dump(2));
  RandomTensors rt(s.seed);
  auto& w = rt.w;
  auto& order = rt.order;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols, float std) { rt.mat(name, rows, cols, std); };
  auto vec = [&](const std::string& name, int64_t n, float mean, float std) { rt.vec(name, n, mean, std); };
  const int H = s.hidden, D = s.head_dim;
  mat("model.embed_tokens.weight", s.vocab, H, s.tied ? 0.3f : 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    mat(p + "self_attn.q_proj.weight", s.heads * D, H, 1.0f / std::sqrt(float(H)));
    mat(p + "self_attn.k_proj.weight", s.kv_heads * D, H, 1.0f / std::sqrt(float(H)));
    mat(p + "self_attn.v_proj.weight", s.kv_heads * D, H, 1.0f / std::sqrt(float(H)));
    mat(p + "self_attn.o_proj.weight", H, s.heads * D, 1.0f / std::sqrt(float(s.heads * D)));
    if (s.bias) {
      vec(p + "self_attn.q_proj.bias", s.heads * D, 0.0f, 0.1f);
      vec(p + "self_attn.k_proj.bias", s.kv_heads * D, 0.0f, 0.1f);
      vec(p + "self_attn.v_proj.bias", s.kv_heads * D, 0.0f, 0.1f);
      vec(p + "self_attn.o_proj.bias", H, 0.0f, 0.1f);
    }
    vec(p + "self_attn.q_norm.weight", D, 1.0f, 0.2f);
    vec(p + "self_attn.k_norm.weight", D, 1.0f, 0.2f);
    vec(p + "input_layernorm.weight", H, 1.0f, 0.2f);
    vec(p + "post_attention_layernorm.weight", H, 1.0f, 0.2f);
    mat(p + "mlp.gate_proj.weight", s.inter, H, 1.0f / std::sqrt(float(H)));
    mat(p + "mlp.up_proj.weight", s.inter, H, 1.0f / std::sqrt(float(H)));
    mat(p + "mlp.down_proj.weight", H, s.inter, 1.0f / std::sqrt(float(s.inter)));
  }
  vec("model.norm.weight", H, 1.0f, 0.2f);
  if (!s.tied) mat("lm_head.weight", s.vocab, H, 1.0f / std::sqrt(float(H)));

  std::map<std::string, std::vector<uint16_t>> half;
  std::vector<SafetensorsWriteItem> items;
  for (auto& [name, shape] : order) {
    auto& v = w[name];
    if (s.dtype == DType::BF16) {
      auto& h = half[name];
      for (auto& x : v) {
        h.push_back(f32_to_bf16(x));
        x = bf16_to_f32(h.back());
      }
      items.push_back({name, DType::BF16, shape, h.data(), {}});
    } else if (s.dtype == DType::F16) {
      auto& h = half[name];
      for (auto& x : v) {
        h.push_back(f32_to_f16(x));
        x = f16_to_f32(h.back());
      }
      items.push_back({name, DType::F16, shape, h.data(), {}});
    } else {
      items.push_back({name, DType::F32, shape, v.data(), {}});
    }
  }
  write_safetensors(dir + "/model.safetensors", items);
  return w;
}

// ---- reference forward (double precision, full recompute) ---------------------------------

struct RefOutput {
  std::vector<std::vector<double>> logits;  // [pos][vocab]
  std::vector<std::vector<std::vector<double>>> hidden;  // [layer+1][pos][hidden]; [0] = embeddings
};

inline RefOutput reference_forward(const TinySpec& s, const WeightMap& w, const std::vector<int32_t>& toks) {
  const int T = static_cast<int>(toks.size()), H = s.hidden, D = s.head_dim;
  const double eps = 1e-6;
  auto W = [&](const std::string& n) -> const std::vector<float>& { return w.at(n); };
  auto linear = [&](const std::vector<double>& x, const std::vector<float>& m, int out, int in) {
    std::vector<double> y(out, 0.0);
    for (int o = 0; o < out; ++o) {
      double acc = 0;
      for (int i = 0; i < in; ++i) acc += x[i] * m[static_cast<size_t>(o) * in + i];
      y[o] = acc;
    }
    return y;
  };
  auto norm = [&](std::vector<double>& x, size_t off, int n, const std::vector<float>& g) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
    double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * g[i];
  };
  // Inverse frequencies, written out from the RoPE/YaRN papers' definitions.
  std::vector<double> invf(D / 2);
  double mscale = 1.0;
  for (int i = 0; i < D / 2; ++i) invf[i] = std::pow(s.theta, -2.0 * i / D);
  if (s.rope_type == "linear") {
    for (auto& f : invf) f /= s.factor;
  } else if (s.rope_type == "yarn") {
    auto dim_for_rotations = [&](double rot) {
      return D * std::log(s.orig_max / (rot * 2 * M_PI)) / (2 * std::log(s.theta));
    };
    double lo = std::max(0.0, std::floor(dim_for_rotations(32.0)));
    double hi = std::min(double(D - 1), std::ceil(dim_for_rotations(1.0)));
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < D / 2; ++i) {
      double t = std::min(1.0, std::max(0.0, (i - lo) / (hi - lo)));  // 0: keep, 1: interpolate
      invf[i] = invf[i] * (1 - t) + invf[i] / s.factor * t;
    }
    mscale = 0.1 * std::log(s.factor) + 1.0;
  }
  auto rope = [&](std::vector<double>& x, size_t off, int pos) {
    for (int i = 0; i < D / 2; ++i) {
      double a = pos * static_cast<double>(static_cast<float>(invf[i]));
      double c = std::cos(a) * mscale, sn = std::sin(a) * mscale;
      double x1 = x[off + i], x2 = x[off + i + D / 2];
      x[off + i] = x1 * c - x2 * sn;
      x[off + i + D / 2] = x2 * c + x1 * sn;
    }
  };

  RefOutput out;
  std::vector<std::vector<double>> x(T, std::vector<double>(H));
  const auto& emb = W("model.embed_tokens.weight");
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[t][i] = emb[static_cast<size_t>(toks[t]) * H + i];
  out.hidden.push_back(x);
  const int NQ = s.heads * D, NKV = s.kv_heads * D, group = s.heads / s.kv_heads;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      std::vector<double> h = x[t];
      norm(h, 0, H, W(p + "input_layernorm.weight"));
      q[t] = linear(h, W(p + "self_attn.q_proj.weight"), NQ, H);
      k[t] = linear(h, W(p + "self_attn.k_proj.weight"), NKV, H);
      v[t] = linear(h, W(p + "self_attn.v_proj.weight"), NKV, H);
      if (s.bias) {
        for (int i = 0; i < NQ; ++i) q[t][i] += W(p + "self_attn.q_proj.bias")[i];
        for (int i = 0; i < NKV; ++i) k[t][i] += W(p + "self_attn.k_proj.bias")[i];
        for (int i = 0; i < NKV; ++i) v[t][i] += W(p + "self_attn.v_proj.bias")[i];
      }
      for (int hh = 0; hh < s.heads; ++hh) {
        norm(q[t], hh * D, D, W(p + "self_attn.q_norm.weight"));
        rope(q[t], hh * D, t);
      }
      for (int hh = 0; hh < s.kv_heads; ++hh) {
        norm(k[t], hh * D, D, W(p + "self_attn.k_norm.weight"));
        rope(k[t], hh * D, t);
      }
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> att(NQ, 0.0);
      for (int hh = 0; hh < s.heads; ++hh) {
        const int g = hh / group;
        std::vector<double> sc(t + 1);
        double m = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][hh * D + i] * k[j][g * D + i];
          sc[j] = d / std::sqrt(double(D));
          m = std::max(m, sc[j]);
        }
        double z = 0;
        for (auto& e : sc) z += (e = std::exp(e - m));
        for (int j = 0; j <= t; ++j)
          for (int i = 0; i < D; ++i) att[hh * D + i] += sc[j] / z * v[j][g * D + i];
      }
      std::vector<double> o = linear(att, W(p + "self_attn.o_proj.weight"), H, NQ);
      for (int i = 0; i < H; ++i) x[t][i] += o[i] + (s.bias ? W(p + "self_attn.o_proj.bias")[i] : 0.0);
      std::vector<double> h = x[t];
      norm(h, 0, H, W(p + "post_attention_layernorm.weight"));
      std::vector<double> gg = linear(h, W(p + "mlp.gate_proj.weight"), s.inter, H);
      std::vector<double> uu = linear(h, W(p + "mlp.up_proj.weight"), s.inter, H);
      for (int i = 0; i < s.inter; ++i) gg[i] = gg[i] / (1 + std::exp(-gg[i])) * uu[i];
      std::vector<double> dd = linear(gg, W(p + "mlp.down_proj.weight"), H, s.inter);
      for (int i = 0; i < H; ++i) x[t][i] += dd[i];
    }
    out.hidden.push_back(x);
  }
  const auto& head = s.tied ? emb : W("lm_head.weight");
  for (int t = 0; t < T; ++t) {
    std::vector<double> h = x[t];
    norm(h, 0, H, W("model.norm.weight"));
    out.logits.push_back(linear(h, head, s.vocab, H));
  }
  return out;
}

}  // namespace dsinfer::test
