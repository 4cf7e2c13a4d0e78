// Tests of the DFlash / DeepSpec DFlash / DSpark drafters (src/spec/dflash_*, deepspec_*,
// markov_head, confidence_head, drafter_loader) on hand-made tiny checkpoints.
//
// Data flow: each test writes a tiny Qwen3 target (model_test_util.h) and a tiny draft
// checkpoint (config.json + model.safetensors written here), loads both, commits random or
// real target features and compares propose_debug() against an independent double-precision
// reference written the obvious way below (full recompute of the context K/V every call, no
// cache, direct formulas for the Markov/confidence heads). Also: loader refusals, sliding
// window, sampling distributions, thread-count determinism and a greedy speculative loop
// that must reproduce plain greedy decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/rope_params.h"
#include "model_test_util.h"
#include "spec/deepspec_drafter.h"
#include "spec/dflash_zlab.h"
#include "spec/drafter_loader.h"

using namespace dsinfer;
using namespace dsinfer::test;

namespace {

constexpr int kTargetLayers = 4;

TinySpec target_spec() {
  TinySpec s;
  s.layers = kTargetLayers;
  s.seed = 11;
  return s;
}

struct DraftSpec {
  bool zlab = true;
  int hidden = 32, vocab = 97, inter = 40, layers = 2, heads = 4, kv_heads = 2, head_dim = 8;
  int bs = 5;
  int mask = 95;
  std::vector<int> ids = {0, 2};
  bool write_ids = true;
  int num_target_layers = kTargetLayers;
  int markov_rank = 0;
  std::string markov_type = "vanilla";
  bool conf = false, conf_markov = true;
  bool bias = false;
  std::string prefix;
  std::string rope_type = "default";
  uint32_t seed = 7;
  nlohmann::json extra = nlohmann::json::object();              // merged into config.json
  std::map<std::string, std::vector<int64_t>> shape_override;  // tensor -> written shape
  std::vector<std::string> omit;                                 // tensors not written
};

nlohmann::json draft_config(const DraftSpec& s) {
  nlohmann::json c = {{"model_type", "qwen3"},
                      {"vocab_size", s.vocab},
                      {"hidden_size", s.hidden},
                      {"intermediate_size", s.inter},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim},
                      {"max_position_embeddings", 256},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"attention_bias", s.bias},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", false},
                      {"block_size", s.bs},
                      {"num_target_layers", s.num_target_layers}};
  if (s.rope_type == "yarn")
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}};
  if (s.zlab) {
    c["architectures"] = {"DFlashDraftModel"};
    c["dflash_config"] = {{"mask_token_id", s.mask}};
    if (s.write_ids) c["dflash_config"]["target_layer_ids"] = s.ids;
  } else {
    c["architectures"] = {"Qwen3DSparkModel"};
    c["mask_token_id"] = s.mask;
    if (s.write_ids) c["target_layer_ids"] = s.ids;
    c["markov_rank"] = s.markov_rank;
    if (s.markov_rank > 0) c["markov_head_type"] = s.markov_type;
    c["enable_confidence_head"] = s.conf;
    if (s.conf) c["confidence_head_with_markov"] = s.conf_markov;
  }
  c.merge_patch(s.extra);
  return c;
}

// Writes DIR/config.json + DIR/model.safetensors; returns the weights (unprefixed names).
WeightMap write_draft(const std::string& dir, const DraftSpec& s) {
  write_text(dir + "/config.json", draft_config(s).dump(2));
  RandomTensors rt(s.seed);
  auto& w = rt.w;
  auto& order = rt.order;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols, float std) { rt.mat(name, rows, cols, std); };
  auto vec = [&](const std::string& name, int64_t n, float mean, float std) { rt.vec(name, n, mean, std); };
  const int H = s.hidden, D = s.head_dim, m = static_cast<int>(s.ids.size()), r = s.markov_rank;
  auto isq = [](int n) { return 1.0f / std::sqrt(float(n)); };
  if (!s.zlab) mat("embed_tokens.weight", s.vocab, H, 1.0f);
  mat("fc.weight", H, int64_t{m} * H, isq(m * H));
  vec("hidden_norm.weight", H, 1.0f, 0.2f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    mat(p + "self_attn.q_proj.weight", s.heads * D, H, isq(H));
    mat(p + "self_attn.k_proj.weight", s.kv_heads * D, H, isq(H));
    mat(p + "self_attn.v_proj.weight", s.kv_heads * D, H, isq(H));
    mat(p + "self_attn.o_proj.weight", H, s.heads * D, isq(s.heads * D));
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
    mat(p + "mlp.gate_proj.weight", s.inter, H, isq(H));
    mat(p + "mlp.up_proj.weight", s.inter, H, isq(H));
    mat(p + "mlp.down_proj.weight", H, s.inter, isq(s.inter));
  }
  vec("norm.weight", H, 1.0f, 0.2f);
  if (!s.zlab) {
    mat("lm_head.weight", s.vocab, H, isq(H));
    if (r > 0) {
      mat("markov_head.markov_w1.weight", s.vocab, r, 1.0f);
      mat("markov_head.markov_w2.weight", s.vocab, r, isq(r));
      if (s.markov_type == "gated") {
        mat("markov_head.gate_proj.weight", r, H + r, isq(H + r));
        vec("markov_head.gate_proj.bias", r, 0.0f, 0.3f);
      } else if (s.markov_type == "rnn") {
        mat("markov_head.joint_proj.weight", 3 * r, 2 * r + H, isq(2 * r + H));
        vec("markov_head.joint_proj.bias", 3 * r, 0.0f, 0.3f);
      }
    }
    if (s.conf) {
      mat("confidence_head.proj.weight", 1, H + (s.conf_markov ? r : 0), isq(H));
      vec("confidence_head.proj.bias", 1, 0.0f, 0.5f);
    }
  }
  std::vector<SafetensorsWriteItem> items;
  for (auto& [name, shape] : order) {
    if (std::find(s.omit.begin(), s.omit.end(), name) != s.omit.end()) continue;
    std::vector<int64_t> sh = shape;
    auto it = s.shape_override.find(name);
    if (it != s.shape_override.end()) {
      sh = it->second;
      int64_t n = 1;
      for (auto d : sh) n *= d;
      w[name].resize(n, 0.5f);
    }
    items.push_back({s.prefix + name, DType::F32, sh, w[name].data(), {}});
  }
  write_safetensors(dir + "/model.safetensors", items);
  return w;
}

// ---- independent double-precision reference ---------------------------------------------

using Mat = std::vector<std::vector<double>>;

struct RefResult {
  Mat out;                  // [bs][H]
  Mat base, bias, logits;   // [n][V]
  std::vector<double> conf_logits;
};

std::vector<double> lin(const std::vector<double>& x, const std::vector<float>& m, int out, int in) {
  std::vector<double> y(out, 0.0);
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) y[o] += x[i] * m[static_cast<size_t>(o) * in + i];
  return y;
}
void rms(std::vector<double>& x, size_t off, int n, const std::vector<float>& g) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
  for (int i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * g[i];
}
double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// feats: all committed positions (row p = absolute position p). prev_tokens: the drafts the
// engine sampled (the Markov conditioning uses the anchor then these).
RefResult reference(const DraftSpec& s, const WeightMap& dw, const WeightMap& tw, const Mat& feats, int32_t anchor,
                    int window, const std::vector<int32_t>& drafted) {
  const int H = s.hidden, D = s.head_dim, V = s.vocab, bs = s.bs, m = static_cast<int>(s.ids.size());
  const int NQ = s.heads * D, NKV = s.kv_heads * D, group = s.heads / s.kv_heads;
  const int P = static_cast<int>(feats.size());
  const int first = window > 0 ? std::max(0, P - window) : 0;
  auto W = [&](const std::string& n) -> const std::vector<float>& { return dw.at(n); };
  RopeConfig rc;
  if (s.rope_type == "yarn") {
    rc.type = "yarn";
    rc.factor = 4.0;
    rc.original_max_position_embeddings = 16;
  }
  RopeParams rp = compute_rope_params(rc, D, 256);
  auto rope = [&](std::vector<double>& x, size_t off, int pos) {
    for (int i = 0; i < D / 2; ++i) {
      const double a = static_cast<double>(static_cast<float>(pos) * rp.inv_freq[i]);
      const double c = std::cos(a) * rp.attention_factor, sn = std::sin(a) * rp.attention_factor;
      const double x1 = x[off + i], x2 = x[off + i + D / 2];
      x[off + i] = x1 * c - x2 * sn;
      x[off + i + D / 2] = x2 * c + x1 * sn;
    }
  };
  // Context: visible committed positions.
  Mat ctx;
  std::vector<int> ctx_pos;
  for (int p = first; p < P; ++p) {
    std::vector<double> c = lin(feats[p], W("fc.weight"), H, m * H);
    rms(c, 0, H, W("hidden_norm.weight"));
    ctx.push_back(c);
    ctx_pos.push_back(p);
  }
  // Block embeddings.
  const auto& emb = s.zlab ? tw.at("model.embed_tokens.weight") : W("embed_tokens.weight");
  Mat x(bs, std::vector<double>(H));
  for (int i = 0; i < bs; ++i) {
    const int32_t id = i == 0 ? anchor : s.mask;
    for (int j = 0; j < H; ++j) x[i][j] = emb[static_cast<size_t>(id) * H + j];
  }
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto bias_add = [&](std::vector<double>& y, const std::string& n) {
      if (!s.bias) return;
      for (size_t i = 0; i < y.size(); ++i) y[i] += W(n)[i];
    };
    Mat K, Vv;  // keys/values: context then block
    auto kv = [&](const std::vector<double>& in, int pos) {
      std::vector<double> k = lin(in, W(p + "self_attn.k_proj.weight"), NKV, H);
      std::vector<double> v = lin(in, W(p + "self_attn.v_proj.weight"), NKV, H);
      bias_add(k, p + "self_attn.k_proj.bias");
      bias_add(v, p + "self_attn.v_proj.bias");
      for (int g = 0; g < s.kv_heads; ++g) {
        rms(k, g * D, D, W(p + "self_attn.k_norm.weight"));
        rope(k, g * D, pos);
      }
      K.push_back(k);
      Vv.push_back(v);
    };
    for (size_t c = 0; c < ctx.size(); ++c) kv(ctx[c], ctx_pos[c]);
    Mat q(bs);
    for (int i = 0; i < bs; ++i) {
      std::vector<double> h = x[i];
      rms(h, 0, H, W(p + "input_layernorm.weight"));
      q[i] = lin(h, W(p + "self_attn.q_proj.weight"), NQ, H);
      bias_add(q[i], p + "self_attn.q_proj.bias");
      for (int hh = 0; hh < s.heads; ++hh) {
        rms(q[i], hh * D, D, W(p + "self_attn.q_norm.weight"));
        rope(q[i], hh * D, P + i);
      }
      kv(h, P + i);
    }
    for (int i = 0; i < bs; ++i) {
      std::vector<double> att(NQ, 0.0);
      for (int hh = 0; hh < s.heads; ++hh) {
        const int g = hh / group;
        std::vector<double> sc(K.size());
        double mx = -1e300;
        for (size_t j = 0; j < K.size(); ++j) {
          double d = 0;
          for (int t = 0; t < D; ++t) d += q[i][hh * D + t] * K[j][g * D + t];
          sc[j] = d / std::sqrt(double(D));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (auto& e : sc) z += (e = std::exp(e - mx));
        for (size_t j = 0; j < K.size(); ++j)
          for (int t = 0; t < D; ++t) att[hh * D + t] += sc[j] / z * Vv[j][g * D + t];
      }
      std::vector<double> o = lin(att, W(p + "self_attn.o_proj.weight"), H, NQ);
      bias_add(o, p + "self_attn.o_proj.bias");
      for (int t = 0; t < H; ++t) x[i][t] += o[t];
      std::vector<double> h = x[i];
      rms(h, 0, H, W(p + "post_attention_layernorm.weight"));
      std::vector<double> gg = lin(h, W(p + "mlp.gate_proj.weight"), s.inter, H);
      std::vector<double> uu = lin(h, W(p + "mlp.up_proj.weight"), s.inter, H);
      for (int t = 0; t < s.inter; ++t) gg[t] = gg[t] / (1 + std::exp(-gg[t])) * uu[t];
      std::vector<double> dd = lin(gg, W(p + "mlp.down_proj.weight"), H, s.inter);
      for (int t = 0; t < H; ++t) x[i][t] += dd[t];
    }
  }
  RefResult R;
  for (int i = 0; i < bs; ++i) {
    rms(x[i], 0, H, W("norm.weight"));
    R.out.push_back(x[i]);
  }
  if (s.zlab) {
    for (int i = 1; i < bs; ++i) R.base.push_back(lin(R.out[i], tw.at("lm_head.weight"), V, H));
    R.logits = R.base;
    return R;
  }
  const int r = s.markov_rank;
  std::vector<double> state(r, 0.0);
  for (int k = 0; k < bs; ++k) {
    const std::vector<double>& h = R.out[k];
    std::vector<double> U = lin(h, W("lm_head.weight"), V, H);
    R.base.push_back(U);
    const int32_t prev = k == 0 ? anchor : drafted[k - 1];
    std::vector<double> e(r);
    if (r > 0) {
      for (int j = 0; j < r; ++j) e[j] = W("markov_head.markov_w1.weight")[static_cast<size_t>(prev) * r + j];
      std::vector<double> f(r);
      if (s.markov_type == "vanilla") {
        f = e;
      } else if (s.markov_type == "gated") {
        std::vector<double> z(h);
        z.insert(z.end(), e.begin(), e.end());
        std::vector<double> g = lin(z, W("markov_head.gate_proj.weight"), r, H + r);
        for (int j = 0; j < r; ++j) f[j] = sig(g[j] + W("markov_head.gate_proj.bias")[j]) * e[j];
      } else {
        std::vector<double> z(state);
        z.insert(z.end(), e.begin(), e.end());
        z.insert(z.end(), h.begin(), h.end());
        std::vector<double> y = lin(z, W("markov_head.joint_proj.weight"), 3 * r, 2 * r + H);
        for (int j = 0; j < 3 * r; ++j) y[j] += W("markov_head.joint_proj.bias")[j];
        for (int j = 0; j < r; ++j) {
          const double a = sig(y[j]);
          f[j] = std::tanh(y[2 * r + j]);
          state[j] = a * state[j] + (1 - a) * std::tanh(y[r + j]);
        }
      }
      std::vector<double> B = lin(f, W("markov_head.markov_w2.weight"), V, r);
      R.bias.push_back(B);
      for (int v = 0; v < V; ++v) U[v] += B[v];
    }
    R.logits.push_back(U);
    if (s.conf) {
      const auto& w = W("confidence_head.proj.weight");
      double z = W("confidence_head.proj.bias")[0];
      for (int j = 0; j < H; ++j) z += w[j] * h[j];
      if (s.conf_markov)
        for (int j = 0; j < r; ++j) z += w[H + j] * e[j];
      R.conf_logits.push_back(z);
    }
  }
  return R;
}

void expect_rows_close(const std::vector<float>& got, const Mat& ref, const std::string& what) {
  ASSERT_FALSE(ref.empty()) << what;
  const size_t n = ref[0].size();
  ASSERT_EQ(got.size(), ref.size() * n) << what;
  for (size_t r = 0; r < ref.size(); ++r) {
    double mx = 1.0;
    for (double v : ref[r]) mx = std::max(mx, std::abs(v));
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[r * n + i], ref[r][i], 1e-4 * mx) << what << " row " << r << " col " << i;
  }
}

Mat random_feats(int n, int width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  Mat f(n, std::vector<double>(width));
  for (auto& row : f)
    for (auto& x : row) x = static_cast<float>(nd(rng));
  return f;
}

std::vector<float> flat(const Mat& m, size_t begin, size_t end) {
  std::vector<float> v;
  for (size_t i = begin; i < end; ++i)
    for (double x : m[i]) v.push_back(static_cast<float>(x));
  return v;
}

struct Fixture {
  TempDir tdir, ddir;
  WeightMap tw, dw;
  std::unique_ptr<Model> target;
  std::unique_ptr<Drafter> drafter;
  DraftSpec spec;
  explicit Fixture(const DraftSpec& s, const DrafterOptions& opts = {}) : spec(s) {
    tw = write_tiny_model(tdir.path, target_spec());
    dw = write_draft(ddir.path, s);
    target = load_model(tdir.path);
    drafter = load_drafter(ddir.path, *target, opts);
  }
  BlockDrafter& block() { return dynamic_cast<BlockDrafter&>(*drafter); }
};

// Commits feats in chunks, checking propose_debug against the reference after each chunk.
void check_rounds(Fixture& fx, const std::vector<int>& chunks, int window = 0) {
  const int m = static_cast<int>(fx.spec.ids.size());
  int total = 0;
  for (int c : chunks) total += c;
  Mat feats = random_feats(total, m * fx.spec.hidden, 99);
  auto seq = fx.drafter->start();
  int done = 0;
  int32_t anchor = 3;
  for (int c : chunks) {
    std::vector<float> f = flat(feats, done, done + c);
    std::vector<int32_t> toks(c, 1);
    fx.drafter->commit_context(*seq, toks.data(), f.data(), c);
    done += c;
    ASSERT_EQ(seq->context_length(), done);
    Rng rng(5);
    DraftDebug dbg;
    DraftProposal p = fx.block().propose_debug(*seq, anchor, SamplingParams{}, rng, dbg);
    Mat visible(feats.begin(), feats.begin() + done);
    RefResult R = reference(fx.spec, fx.dw, fx.tw, visible, anchor, window, p.tokens);
    SCOPED_TRACE("after " + std::to_string(done) + " context positions");
    expect_rows_close(dbg.backbone_out, R.out, "backbone_out");
    expect_rows_close(dbg.base_logits, R.base, "base_logits");
    expect_rows_close(dbg.draft_logits, R.logits, "draft_logits");
    if (!R.bias.empty()) expect_rows_close(dbg.markov_bias, R.bias, "markov_bias");
    else EXPECT_TRUE(dbg.markov_bias.empty());
    ASSERT_EQ(p.tokens.size(), R.logits.size());
    for (size_t k = 0; k < p.tokens.size(); ++k) {
      const auto& row = R.logits[k];
      const int32_t best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      EXPECT_EQ(p.tokens[k], best) << "greedy draft " << k;
    }
    EXPECT_TRUE(p.q.empty());
    if (fx.spec.conf) {
      ASSERT_EQ(p.confidence_logits.size(), R.conf_logits.size());
      for (size_t k = 0; k < R.conf_logits.size(); ++k) {
        EXPECT_NEAR(p.confidence_logits[k], R.conf_logits[k], 1e-4 * std::max(1.0, std::abs(R.conf_logits[k])));
        EXPECT_NEAR(p.confidence[k], sig(R.conf_logits[k]), 1e-5);
      }
    } else {
      EXPECT_TRUE(p.confidence.empty());
    }
    ASSERT_EQ(dbg.draft_logprobs.size(), p.tokens.size());
    for (size_t k = 0; k < p.tokens.size(); ++k) {
      const auto& row = R.logits[k];
      double mx = *std::max_element(row.begin(), row.end()), z = 0;
      for (double v : row) z += std::exp(v - mx);
      EXPECT_NEAR(dbg.draft_logprobs[k], row[p.tokens[k]] - mx - std::log(z), 1e-4);
    }
    anchor = (anchor * 7 + 5) % fx.spec.vocab;
  }
}

}  // namespace

// ---- numerics against the reference --------------------------------------------------------

TEST(SpecDrafters, ZlabMatchesReference) {
  DraftSpec s;
  Fixture fx(s);
  const DrafterInfo& in = fx.drafter->info();
  EXPECT_EQ(in.kind, "dflash");
  EXPECT_EQ(in.block_size, 5);
  EXPECT_EQ(in.max_draft_tokens, 4);
  EXPECT_EQ(in.target_layer_ids, (std::vector<int>{0, 2}));
  EXPECT_EQ(in.mask_token_id, 95);
  check_rounds(fx, {6, 1, 3});
}

TEST(SpecDrafters, ZlabModelPrefixBiasYarnEmbeddingLayer) {
  DraftSpec s;
  s.prefix = "model.";
  s.bias = true;
  s.rope_type = "yarn";
  s.ids = {-1, 1, 3};
  s.layers = 3;
  Fixture fx(s);
  check_rounds(fx, {4, 2});
}

TEST(SpecDrafters, ZlabDefaultTargetLayerIds) {
  DraftSpec s;
  s.write_ids = false;
  s.layers = 1;  // one draft layer: [L_t / 2] (L_t = 4 makes the multi-layer formula degenerate)
  s.ids = default_target_layer_ids(kTargetLayers, 1);  // what the writer sizes fc for
  ASSERT_EQ(s.ids, (std::vector<int>{2}));
  Fixture fx(s);
  EXPECT_EQ(fx.drafter->info().target_layer_ids, s.ids);
  check_rounds(fx, {3});
}

TEST(SpecDrafters, DeepSpecDFlashMatchesReference) {
  DraftSpec s;
  s.zlab = false;
  s.bs = 4;
  Fixture fx(s);
  EXPECT_EQ(fx.drafter->info().kind, "dflash-deepspec");
  EXPECT_EQ(fx.drafter->info().max_draft_tokens, 4);
  EXPECT_FALSE(fx.drafter->info().confidence_head);
  check_rounds(fx, {5, 2});
}

TEST(SpecDrafters, DSparkVanillaWithConfidence) {
  DraftSpec s;
  s.zlab = false;
  s.markov_rank = 6;
  s.conf = true;
  Fixture fx(s);
  EXPECT_EQ(fx.drafter->info().kind, "dspark");
  EXPECT_EQ(fx.drafter->info().markov_head, "vanilla");
  EXPECT_TRUE(fx.drafter->info().confidence_head);
  check_rounds(fx, {5, 3, 1});
}

TEST(SpecDrafters, DSparkGatedConfidenceWithoutMarkov) {
  DraftSpec s;
  s.zlab = false;
  s.markov_rank = 5;
  s.markov_type = "gated";
  s.conf = true;
  s.conf_markov = false;
  Fixture fx(s);
  EXPECT_EQ(fx.drafter->info().markov_head, "gated");
  check_rounds(fx, {4, 4});
}

TEST(SpecDrafters, DSparkRnn) {
  DraftSpec s;
  s.zlab = false;
  s.markov_rank = 4;
  s.markov_type = "rnn";
  s.extra = {{"markov_head_type", "RNN"}};  // the config value is case-insensitive
  s.conf = true;
  s.bs = 6;
  Fixture fx(s);
  EXPECT_EQ(fx.drafter->info().markov_head, "rnn");
  check_rounds(fx, {3, 2});
}

TEST(SpecDrafters, ConfidenceOnlyIsDSpark) {
  DraftSpec s;
  s.zlab = false;
  s.conf = true;
  s.conf_markov = false;
  Fixture fx(s);
  EXPECT_EQ(fx.drafter->info().kind, "dspark");
  EXPECT_EQ(fx.drafter->info().markov_head, "");
  check_rounds(fx, {4});
}

// ---- sliding window ------------------------------------------------------------------------

TEST(SpecDrafters, SlidingWindowKeepsLastPositions) {
  for (bool zlab : {true, false}) {
    DraftSpec s;
    s.zlab = zlab;
    DrafterOptions o;
    o.window_size = 4;
    Fixture fx(s, o);
    // 80 positions in uneven chunks: exercises the window and the storage compaction.
    check_rounds(fx, {3, 2, 7, 1, 30, 5, 1, 1, 20, 10}, 4);
  }
}

TEST(SpecDrafters, WindowLargerThanContextChangesNothing) {
  DraftSpec s;
  DrafterOptions o;
  o.window_size = 100;
  Fixture a(s, o), b(s);
  Mat feats = random_feats(12, 2 * s.hidden, 3);
  std::vector<float> f = flat(feats, 0, 12);
  auto sa = a.drafter->start(), sb = b.drafter->start();
  a.drafter->commit_context(*sa, nullptr, f.data(), 12);
  b.drafter->commit_context(*sb, nullptr, f.data(), 12);
  Rng r1(1), r2(1);
  DraftDebug da, db;
  a.block().propose_debug(*sa, 4, SamplingParams{}, r1, da);
  b.block().propose_debug(*sb, 4, SamplingParams{}, r2, db);
  EXPECT_EQ(da.backbone_out, db.backbone_out);
  EXPECT_EQ(da.draft_logits, db.draft_logits);
}

TEST(SpecDrafters, NegativeWindowRefused) {
  TempDir t, d;
  write_tiny_model(t.path, target_spec());
  write_draft(d.path, DraftSpec{});
  auto target = load_model(t.path);
  DrafterOptions o;
  o.window_size = -2;  // -1 is "the checkpoint's recommended window"
  EXPECT_THROW(load_drafter(d.path, *target, o), Error);
  o.window_size = -1;
  EXPECT_NO_THROW(load_drafter(d.path, *target, o));
}

// ---- sampling -------------------------------------------------------------------------------

TEST(SpecDrafters, SampledDraftsCarryExactDistributions) {
  for (bool zlab : {true, false}) {
    DraftSpec s;
    s.zlab = zlab;
    s.markov_rank = zlab ? 0 : 4;
    s.markov_type = "rnn";
    Fixture fx(s);
    Mat feats = random_feats(7, 2 * s.hidden, 8);
    std::vector<float> f = flat(feats, 0, 7);
    auto seq = fx.drafter->start();
    fx.drafter->commit_context(*seq, nullptr, f.data(), 7);
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_k = 20;
    sp.top_p = 0.9f;
    Rng rng(42);
    DraftDebug dbg;
    DraftProposal p = fx.block().propose_debug(*seq, 9, sp, rng, dbg);
    const int V = s.vocab, n = static_cast<int>(p.tokens.size());
    ASSERT_EQ(p.q.size(), static_cast<size_t>(n) * V);
    // Replay: q_k = sampling_distribution(final logits), x_k = sample_from(q_k) in order.
    Rng replay(42);
    std::vector<float> probs;
    for (int k = 0; k < n; ++k) {
      sampling_distribution(dbg.draft_logits.data() + static_cast<size_t>(k) * V, V, sp, probs);
      for (int v = 0; v < V; ++v) ASSERT_EQ(p.q[static_cast<size_t>(k) * V + v], probs[v]);
      EXPECT_EQ(p.tokens[k], sample_from(probs, replay));
      EXPECT_GT(probs[p.tokens[k]], 0.0f);
    }
    // The Markov conditioning used the sampled tokens: the reference given them agrees.
    Mat vis(feats.begin(), feats.end());
    RefResult R = reference(s, fx.dw, fx.tw, vis, 9, 0, p.tokens);
    expect_rows_close(dbg.draft_logits, R.logits, "sampled draft_logits");
  }
}

TEST(SpecDrafters, MaxTokensTruncatesWithoutStateChange) {
  DraftSpec s;
  s.zlab = false;
  s.markov_rank = 3;
  s.conf = true;
  Fixture fx(s);
  Mat feats = random_feats(5, 2 * s.hidden, 4);
  std::vector<float> f = flat(feats, 0, 5);
  auto seq = fx.drafter->start();
  fx.drafter->commit_context(*seq, nullptr, f.data(), 5);
  Rng rng(0);
  DraftProposal full = fx.drafter->propose(*seq, 2, 100, SamplingParams{}, rng);
  EXPECT_EQ(full.tokens.size(), 5u);
  DraftProposal two = fx.drafter->propose(*seq, 2, 2, SamplingParams{}, rng);
  ASSERT_EQ(two.tokens.size(), 2u);
  EXPECT_EQ(two.tokens[0], full.tokens[0]);
  EXPECT_EQ(two.tokens[1], full.tokens[1]);
  EXPECT_EQ(two.confidence_logits[1], full.confidence_logits[1]);
  EXPECT_TRUE(fx.drafter->propose(*seq, 2, 0, SamplingParams{}, rng).tokens.empty());
  EXPECT_EQ(seq->context_length(), 5);
  DraftProposal again = fx.drafter->propose(*seq, 2, 100, SamplingParams{}, rng);
  EXPECT_EQ(again.tokens, full.tokens);
  EXPECT_THROW(fx.drafter->propose(*seq, 97, 3, SamplingParams{}, rng), Error);
  EXPECT_THROW(fx.drafter->commit_context(*seq, nullptr, nullptr, 2), Error);
}

TEST(SpecDrafters, DeterministicAcrossThreadCounts) {
  DraftSpec s;
  s.zlab = false;
  s.markov_rank = 4;
  s.markov_type = "gated";
  s.conf = true;
  s.heads = 8;
  s.kv_heads = 2;
  Fixture fx(s);
  Mat feats = random_feats(40, 2 * s.hidden, 6);
  std::vector<float> f = flat(feats, 0, 40);
  SamplingParams sp;
  sp.temperature = 1.0f;
  std::vector<DraftDebug> runs;
  std::vector<DraftProposal> props;
  for (int threads : {1, 2, 3}) {
    ThreadPool::set_global_threads(threads);
    auto seq = fx.drafter->start();
    fx.drafter->commit_context(*seq, nullptr, f.data(), 25);
    fx.drafter->commit_context(*seq, nullptr, f.data() + 25 * 2 * s.hidden, 15);
    Rng rng(7);
    DraftDebug dbg;
    props.push_back(fx.block().propose_debug(*seq, 11, sp, rng, dbg));
    runs.push_back(dbg);
  }
  ThreadPool::set_global_threads(0);
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].backbone_out, runs[0].backbone_out);
    EXPECT_EQ(runs[i].draft_logits, runs[0].draft_logits);
    EXPECT_EQ(props[i].tokens, props[0].tokens);
    EXPECT_EQ(props[i].q, props[0].q);
    EXPECT_EQ(props[i].confidence_logits, props[0].confidence_logits);
  }
}

// ---- greedy speculative loop == plain greedy ------------------------------------------------

TEST(SpecDrafters, GreedySpeculationEqualsPlainGreedy) {
  for (bool zlab : {true, false}) {
    DraftSpec s;
    s.zlab = zlab;
    s.ids = {-1, 1, 2};
    s.markov_rank = zlab ? 0 : 4;
    DrafterOptions o;
    o.window_size = zlab ? 0 : 6;
    Fixture fx(s, o);
    Model& T = *fx.target;
    const std::vector<int32_t> prompt = {5, 17, 42, 8, 60, 23};
    const int n_new = 24;
    // Plain greedy.
    std::vector<int32_t> plain;
    {
      auto kv = T.make_kv_cache(1, 128);
      ForwardOutput out;
      ForwardBatch b;
      b.entries.push_back({0, prompt, {static_cast<int>(prompt.size()) - 1}});
      T.forward(*kv, b, out);
      int32_t tok = argmax(out.logits.data(), out.vocab_size);
      for (int i = 0; i < n_new; ++i) {
        plain.push_back(tok);
        ForwardBatch d;
        d.entries.push_back({0, {tok}, {0}});
        T.forward(*kv, d, out);
        tok = argmax(out.logits.data(), out.vocab_size);
      }
    }
    // Speculative.
    const DrafterInfo& in = fx.drafter->info();
    auto kv = T.make_kv_cache(1, 128);
    ForwardOutput out;
    ForwardBatch b;
    b.capture_layers = in.target_layer_ids;
    b.entries.push_back({0, prompt, {static_cast<int>(prompt.size()) - 1}});
    T.forward(*kv, b, out);
    auto seq = fx.drafter->start();
    fx.drafter->commit_context(*seq, prompt.data(), out.captured.data(), static_cast<int>(prompt.size()));
    int32_t anchor = argmax(out.logits.data(), out.vocab_size);
    std::vector<int32_t> spec;
    Rng rng(0);
    int rounds = 0;
    while (static_cast<int>(spec.size()) < n_new) {
      ++rounds;
      const int start = seq->context_length();
      ASSERT_EQ(kv->length(0), start);
      DraftProposal p = fx.drafter->propose(*seq, anchor, in.max_draft_tokens, SamplingParams{}, rng);
      ForwardBatch vb;
      vb.capture_layers = in.target_layer_ids;
      ForwardEntry e{0, {anchor}, {}};
      e.tokens.insert(e.tokens.end(), p.tokens.begin(), p.tokens.end());
      for (size_t i = 0; i < e.tokens.size(); ++i) e.logit_rows.push_back(static_cast<int>(i));
      vb.entries.push_back(e);
      T.forward(*kv, vb, out);
      std::vector<int32_t> tg;
      for (size_t i = 0; i < e.tokens.size(); ++i)
        tg.push_back(argmax(out.logits.data() + i * out.vocab_size, out.vocab_size));
      size_t acc = 0;
      while (acc < p.tokens.size() && p.tokens[acc] == tg[acc]) ++acc;
      std::vector<int32_t> committed(e.tokens.begin(), e.tokens.begin() + acc + 1);
      spec.insert(spec.end(), committed.begin(), committed.end());
      fx.drafter->commit_context(*seq, committed.data(), out.captured.data(), static_cast<int>(acc + 1));
      kv->truncate(0, start + static_cast<int>(acc) + 1);
      anchor = tg[acc];
    }
    spec.resize(n_new);
    EXPECT_EQ(spec, plain) << (zlab ? "zlab" : "deepspec");
    EXPECT_LE(rounds, n_new);
  }
}

// ---- loader refusals ----------------------------------------------------------------------

namespace {
// Loads a draft written from `s` against the standard tiny target; returns the error text.
std::string load_error(const DraftSpec& s) {
  TempDir t, d;
  write_tiny_model(t.path, target_spec());
  write_draft(d.path, s);
  auto target = load_model(t.path);
  try {
    load_drafter(d.path, *target, {});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
void expect_refused(const DraftSpec& s, const std::vector<std::string>& needles) {
  const std::string msg = load_error(s);
  ASSERT_FALSE(msg.empty()) << "expected a refusal mentioning " << needles[0];
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
}
DraftSpec ds() {
  DraftSpec s;
  s.zlab = false;
  return s;
}
}  // namespace

TEST(SpecDraftersLoad, HiddenSizeMismatch) {
  DraftSpec s;
  s.hidden = 48;
  expect_refused(s, {"config.json", "hidden_size", "48", "32"});
}

TEST(SpecDraftersLoad, VocabMismatch) {
  DraftSpec s = ds();
  s.vocab = 101;
  expect_refused(s, {"config.json", "vocab_size"});
  // Config right, tensors wrong: embed_tokens/lm_head must be [V_target, H].
  DraftSpec t = ds();
  t.shape_override["embed_tokens.weight"] = {101, 32};
  expect_refused(t, {"model.safetensors", "embed_tokens.weight", "[101, 32]"});
  DraftSpec u = ds();
  u.shape_override["lm_head.weight"] = {96, 32};
  expect_refused(u, {"lm_head.weight"});
}

TEST(SpecDraftersLoad, TargetLayerIds) {
  DraftSpec a;
  a.ids = {0, 4};
  expect_refused(a, {"dflash_config.target_layer_ids", "[0, 4]"});
  DraftSpec b = ds();
  b.ids = {2, 1};
  expect_refused(b, {"target_layer_ids", "strictly increasing"});
  DraftSpec c = ds();
  c.ids = {-2, 1};
  expect_refused(c, {"target_layer_ids"});
  DraftSpec d = ds();
  d.write_ids = false;
  expect_refused(d, {"target_layer_ids", "missing"});
  DraftSpec e;
  e.num_target_layers = 36;
  expect_refused(e, {"num_target_layers", "36"});
  DraftSpec f = ds();
  f.ids = {0, 0};
  expect_refused(f, {"strictly increasing"});
}

TEST(SpecDraftersLoad, FcShape) {
  DraftSpec s;
  s.shape_override["fc.weight"] = {32, 96};  // m = 2 → [32, 64]
  expect_refused(s, {"model.safetensors", "fc.weight", "[32, 96]", "[32, 64]"});
}

TEST(SpecDraftersLoad, MaskAndBlockSize) {
  DraftSpec a;
  a.mask = 97;
  expect_refused(a, {"dflash_config.mask_token_id", "97"});
  DraftSpec b = ds();
  b.mask = -1;
  expect_refused(b, {"mask_token_id"});
  DraftSpec c;
  c.bs = 1;
  expect_refused(c, {"block_size", "[2, 4096]"});
  DraftSpec d;
  d.extra = {{"block_size", nullptr}};
  expect_refused(d, {"block_size", "missing"});
}

TEST(SpecDraftersLoad, MarkovAndConfidenceShapes) {
  DraftSpec a = ds();
  a.markov_rank = 4;
  a.shape_override["markov_head.markov_w1.weight"] = {97, 5};
  expect_refused(a, {"markov_head.markov_w1.weight", "[97, 4]"});
  DraftSpec b = ds();
  b.markov_rank = 4;
  b.markov_type = "gated";
  b.omit = {"markov_head.gate_proj.bias"};
  expect_refused(b, {"markov_head.gate_proj.bias", "not found"});
  DraftSpec c = ds();
  c.markov_rank = 4;
  c.markov_type = "lstm";
  expect_refused(c, {"markov_head_type", "lstm"});
  DraftSpec d = ds();
  d.markov_rank = 4;
  d.markov_type = "rnn";
  d.shape_override["markov_head.joint_proj.weight"] = {12, 41};  // [3r, 2r + H] = [12, 40]
  expect_refused(d, {"markov_head.joint_proj.weight", "[12, 41]", "[12, 40]"});
  DraftSpec e = ds();
  e.conf = true;
  e.conf_markov = true;  // but markov_rank 0
  expect_refused(e, {"confidence_head_with_markov"});
  DraftSpec f = ds();
  f.markov_rank = 4;
  f.conf = true;
  f.shape_override["confidence_head.proj.weight"] = {1, 32};
  expect_refused(f, {"confidence_head.proj.weight", "[1, 36]"});
}

TEST(SpecDraftersLoad, ArchitectureAndBackbone) {
  DraftSpec a;
  a.extra = {{"architectures", {"Gemma4DSparkModel"}}};
  expect_refused(a, {"architectures", "Gemma4DSparkModel"});
  DraftSpec b;
  b.extra = {{"architectures", {"Qwen3ForCausalLM"}}};
  expect_refused(b, {"architectures", "not a draft model"});
  DraftSpec c;
  c.extra = {{"layer_types", {"full_attention", "sliding_attention"}}};
  expect_refused(c, {"layer_types"});
  DraftSpec d;
  d.omit = {"layers.1.mlp.up_proj.weight"};
  expect_refused(d, {"layers.1.mlp.up_proj.weight", "not found"});
  DraftSpec e;
  e.shape_override["layers.0.self_attn.q_norm.weight"] = {4};
  expect_refused(e, {"layers.0.self_attn.q_norm.weight"});
  DraftSpec f;
  f.extra = {{"hidden_act", "gelu"}};
  expect_refused(f, {"hidden_act"});
}
