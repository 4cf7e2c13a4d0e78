// The tensor-parallel split (model/tensor_parallel.h) checked without GPUs: each rank's
// shard is read from a tiny checkpoint with ShardReader, a double-precision forward runs
// every rank's share (its heads, its intermediate slice) and adds the ranks' partial o and
// down outputs in rank order, as the all-reduces would; the logits must equal the unsplit
// reference forward's (model_test_util.h) to rounding, with the same greedy tokens. Also:
// what each rank reads, and the refusals of splits that do not divide. And the split run
// for real: the CPU model's ranks on threads meeting in HostAllReduce (load_tensor_parallel)
// decode greedily as the single model does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "model/tensor_parallel_group.h"
#include "model_test_util.h"

namespace dsinfer {
namespace {

using test::RefOutput;
using test::TempDir;
using test::TinySpec;
using test::WeightMap;

// The reference forward of model_test_util.h with every layer's projections split as
// `plan` says: rank r computes its q heads (and its KV heads' k, v), attends, and multiplies
// by its o columns; its gate/up rows and down columns likewise. Replicated tensors come from
// w (the whole checkpoint as the reference sees it).
std::vector<std::vector<double>> split_forward(const TinySpec& s, const WeightMap& w, const TensorParallelPlan& plan,
                                               const std::vector<std::vector<Qwen3LayerShard>>& shards,
                                               const std::vector<int32_t>& toks) {
  const int T = static_cast<int>(toks.size()), H = s.hidden, D = s.head_dim, group = s.heads / s.kv_heads;
  const double eps = 1e-6;
  auto W = [&](const std::string& n) -> const std::vector<float>& { return w.at(n); };
  auto norm = [&](std::vector<double>& x, size_t off, int n, const std::vector<float>& g) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * g[i];
  };
  // Rows of a row-split slice times x: y[o] = sum_i x[i] * m(o, i).
  auto rows_times = [](const std::vector<double>& x, const WeightSlice& m) {
    std::vector<double> y(static_cast<size_t>(m.rows), 0.0);
    for (int64_t o = 0; o < m.rows; ++o)
      for (int64_t i = 0; i < m.cols; ++i) y[static_cast<size_t>(o)] += x[static_cast<size_t>(i)] * m.at(o, i);
    return y;
  };
  std::vector<double> invf(D / 2);
  for (int i = 0; i < D / 2; ++i) invf[i] = std::pow(s.theta, -2.0 * i / D);
  auto rope = [&](std::vector<double>& x, size_t off, int pos) {
    for (int i = 0; i < D / 2; ++i) {
      const double a = pos * static_cast<double>(static_cast<float>(invf[i]));
      const double c = std::cos(a), sn = std::sin(a);
      const double x1 = x[off + i], x2 = x[off + i + D / 2];
      x[off + i] = x1 * c - x2 * sn;
      x[off + i + D / 2] = x2 * c + x1 * sn;
    }
  };
  std::vector<std::vector<double>> x(T, std::vector<double>(H));
  const auto& emb = W("model.embed_tokens.weight");
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[t][i] = emb[static_cast<size_t>(toks[t]) * H + i];
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // Per rank: q, k, v of its heads for every position (k, v of positions before t are
    // what its KV cache would hold).
    std::vector<std::vector<std::vector<double>>> q(plan.ranks), k(plan.ranks), v(plan.ranks);
    for (int r = 0; r < plan.ranks; ++r) {
      const Qwen3LayerShard& sh = shards[static_cast<size_t>(r)][static_cast<size_t>(l)];
      const TensorParallelRank& pr = plan.rank[static_cast<size_t>(r)];
      for (int t = 0; t < T; ++t) {
        std::vector<double> h = x[t];
        norm(h, 0, H, W(p + "input_layernorm.weight"));
        std::vector<double> qt = rows_times(h, sh.q), kt = rows_times(h, sh.k), vt = rows_times(h, sh.v);
        for (size_t i = 0; i < sh.q_bias.size(); ++i) qt[i] += sh.q_bias[i];
        for (size_t i = 0; i < sh.k_bias.size(); ++i) kt[i] += sh.k_bias[i];
        for (size_t i = 0; i < sh.v_bias.size(); ++i) vt[i] += sh.v_bias[i];
        for (int hh = 0; hh < pr.q_head_end - pr.q_head_begin; ++hh) {
          norm(qt, static_cast<size_t>(hh) * D, D, W(p + "self_attn.q_norm.weight"));
          rope(qt, static_cast<size_t>(hh) * D, t);
        }
        for (int hh = 0; hh < pr.kv_head_end - pr.kv_head_begin; ++hh) {
          norm(kt, static_cast<size_t>(hh) * D, D, W(p + "self_attn.k_norm.weight"));
          rope(kt, static_cast<size_t>(hh) * D, t);
        }
        q[r].push_back(qt);
        k[r].push_back(kt);
        v[r].push_back(vt);
      }
    }
    for (int t = 0; t < T; ++t) {
      // Attention and o per rank; the partial rows are added in rank order (the all-reduce).
      std::vector<double> o_sum(H, 0.0);
      for (int r = 0; r < plan.ranks; ++r) {
        const Qwen3LayerShard& sh = shards[static_cast<size_t>(r)][static_cast<size_t>(l)];
        const TensorParallelRank& pr = plan.rank[static_cast<size_t>(r)];
        const int nq = pr.q_head_end - pr.q_head_begin;
        std::vector<double> att(static_cast<size_t>(nq) * D, 0.0);
        for (int hh = 0; hh < nq; ++hh) {
          const int g = (pr.q_head_begin + hh) / group - pr.kv_head_begin;  // its KV head, local
          EXPECT_TRUE(g >= 0 && g < pr.kv_head_end - pr.kv_head_begin) << "rank " << r << " lacks the KV head of q head "
                                                                      << pr.q_head_begin + hh;
          std::vector<double> sc(t + 1);
          double m = -1e300;
          for (int j = 0; j <= t; ++j) {
            double d = 0;
            for (int i = 0; i < D; ++i) d += q[r][t][hh * D + i] * k[r][j][g * D + i];
            sc[j] = d / std::sqrt(double(D));
            m = std::max(m, sc[j]);
          }
          double z = 0;
          for (auto& e : sc) z += (e = std::exp(e - m));
          for (int j = 0; j <= t; ++j)
            for (int i = 0; i < D; ++i) att[hh * D + i] += sc[j] / z * v[r][j][g * D + i];
        }
        const std::vector<double> part = rows_times(att, sh.o);  // o columns: [H, nq * D]
        for (int i = 0; i < H; ++i) o_sum[i] += part[i];
      }
      for (int i = 0; i < H; ++i) x[t][i] += o_sum[i] + (s.bias ? W(p + "self_attn.o_proj.bias")[i] : 0.0);
      std::vector<double> h = x[t];
      norm(h, 0, H, W(p + "post_attention_layernorm.weight"));
      std::vector<double> d_sum(H, 0.0);
      for (int r = 0; r < plan.ranks; ++r) {
        const Qwen3LayerShard& sh = shards[static_cast<size_t>(r)][static_cast<size_t>(l)];
        std::vector<double> gg = rows_times(h, sh.gate), uu = rows_times(h, sh.up);
        for (size_t i = 0; i < gg.size(); ++i) gg[i] = gg[i] / (1 + std::exp(-gg[i])) * uu[i];
        const std::vector<double> part = rows_times(gg, sh.down);  // down columns: [H, inter / ranks]
        for (int i = 0; i < H; ++i) d_sum[i] += part[i];
      }
      for (int i = 0; i < H; ++i) x[t][i] += d_sum[i];
    }
  }
  const auto& head = s.tied ? emb : W("lm_head.weight");
  std::vector<std::vector<double>> logits;
  for (int t = 0; t < T; ++t) {
    std::vector<double> h = x[t];
    norm(h, 0, H, W("model.norm.weight"));
    std::vector<double> y(s.vocab, 0.0);
    for (int o = 0; o < s.vocab; ++o)
      for (int i = 0; i < H; ++i) y[o] += h[i] * head[static_cast<size_t>(o) * H + i];
    logits.push_back(y);
  }
  return logits;
}

// A tiny model that splits over 1, 2 and 4 ranks: 4 heads over 2 KV heads (replicated at 4
// ranks), 48 intermediate features.
TinySpec split_spec(int layers, DType dtype) {
  TinySpec s;
  s.heads = 4;
  s.kv_heads = 2;
  s.inter = 48;
  s.layers = layers;
  s.dtype = dtype;
  return s;
}

int argmax(const std::vector<double>& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

TEST(TensorParallel, SplitForwardEqualsTheUnsplitReference) {
  // 4 heads over 2 KV heads: 2 ranks split both; 4 ranks replicate each KV head on 2 ranks.
  for (bool bias : {false, true}) {
    TinySpec s = split_spec(2, bias ? DType::BF16 : DType::F32);
    s.bias = bias;
    TempDir dir;
    const WeightMap w = test::write_tiny_model(dir.path, s);
    const ModelConfig cfg = load_model_config(dir.path);
    const std::vector<int32_t> toks = {3, 17, 42, 5, 88, 1, 60};
    const RefOutput ref = test::reference_forward(s, w, toks);
    for (int ranks : {1, 2, 4}) {
      SCOPED_TRACE("bias " + std::to_string(bias) + ", ranks " + std::to_string(ranks));
      const TensorParallelPlan plan = plan_tensor_parallel(cfg, ranks);
      EXPECT_EQ(plan.kv_replicated, ranks > s.kv_heads);
      std::vector<std::vector<Qwen3LayerShard>> shards;
      for (int r = 0; r < ranks; ++r) {
        ShardReader reader(dir.path);
        shards.push_back(read_qwen3_shard(reader, cfg, plan, r));
      }
      const auto split = split_forward(s, w, plan, shards, toks);
      ASSERT_EQ(split.size(), ref.logits.size());
      double worst = 0, scale = 1e-12;
      for (size_t t = 0; t < split.size(); ++t) {
        for (size_t i = 0; i < split[t].size(); ++i) {
          worst = std::max(worst, std::fabs(split[t][i] - ref.logits[t][i]));
          scale = std::max(scale, std::fabs(ref.logits[t][i]));
        }
        EXPECT_EQ(argmax(split[t]), argmax(ref.logits[t])) << "position " << t;
      }
      EXPECT_LT(worst, 1e-9 * scale) << "split logits differ from the reference beyond rounding";
    }
  }
}

// Greedy decoding of `steps` tokens after `prompt`; the logit rows of every step appended to
// `logits`.
std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int steps, std::vector<float>* logits) {
  auto kv = m.make_kv_cache(2, static_cast<int>(prompt.size()) + steps + 1);
  ForwardBatch b;
  b.entries.push_back({1, prompt, {static_cast<int>(prompt.size()) - 1}});
  ForwardOutput out;
  std::vector<int32_t> toks;
  for (int i = 0; i < steps; ++i) {
    m.forward(*kv, b, out);
    if (logits) logits->insert(logits->end(), out.logits.begin(), out.logits.end());
    const int32_t next = static_cast<int32_t>(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
    toks.push_back(next);
    b.entries[0] = {1, {next}, {0}};
  }
  return toks;
}

TEST(TensorParallel, RanksOnThreadsDecodeAsTheSingleModel) {
  struct Case {
    std::string name, dir;
    int ranks;
  };
  TinySpec s = split_spec(2, DType::BF16);
  s.bias = true;
  TempDir tiny;
  test::write_tiny_model(tiny.path, s);
  const std::string embedded = std::string(DSINFER_SOURCE_DIR) + "/models/embedded/target";
  const std::string data = std::string(DSINFER_TEST_DATA) + "/qwen3/";
  for (const Case& c : {Case{"tiny, 2 ranks", tiny.path, 2}, Case{"tiny, 4 ranks (KV heads replicated)", tiny.path, 4},
                        Case{"embedded target, 2 ranks", embedded, 2}, Case{"tied_gqa2, 4 ranks", data + "tied_gqa2", 4},
                        Case{"mha_bias_hd24, 2 ranks", data + "mha_bias_hd24", 2}}) {
    SCOPED_TRACE(c.name);
    const ModelConfig cfg = load_model_config(c.dir);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 12; ++i) prompt.push_back((i * 37 + 11) % cfg.vocab_size);
    auto single = load_model(c.dir);
    auto split = load_tensor_parallel(c.dir, c.ranks);
    EXPECT_EQ(split->config().num_attention_heads, cfg.num_attention_heads);
    std::vector<float> la, lb;
    const int steps = 24;
    const std::vector<int32_t> a = greedy(*single, prompt, steps, &la), b = greedy(*split, prompt, steps, &lb);
    EXPECT_EQ(a, b);
    ASSERT_EQ(la.size(), lb.size());
    double worst = 0, scale = 1e-6;
    for (size_t i = 0; i < la.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(la[i] - lb[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(la[i])));
    }
    EXPECT_LT(worst, 1e-4 * scale) << "logits of the split model differ beyond rounding";
  }
  // A batch the single model refuses is refused by the group too, without leaving a rank
  // waiting in the all-reduce; the group then runs the next forward.
  auto split = load_tensor_parallel(tiny.path, 2);
  auto kv = split->make_kv_cache(1, 8);
  ForwardBatch bad;
  bad.entries.push_back({0, {3, s.vocab + 5}, {1}});
  ForwardOutput out;
  EXPECT_THROW(split->forward(*kv, bad, out), Error);
  ForwardBatch good;
  good.entries.push_back({0, {3, 4}, {1}});
  split->forward(*kv, good, out);
  EXPECT_EQ(kv->length(0), 2);
  EXPECT_EQ(out.logits.size(), static_cast<size_t>(s.vocab));
  auto other = load_model(tiny.path);
  EXPECT_THROW(split->forward(*other->make_kv_cache(1, 8), good, out), Error);
  EXPECT_THROW(load_tensor_parallel(tiny.path, 3), Error);  // 4 heads over 3 ranks
}

TEST(TensorParallel, EachRankReadsOnlyItsShare) {
  const TinySpec s = split_spec(3, DType::BF16);
  TempDir dir;
  test::write_tiny_model(dir.path, s);
  const ModelConfig cfg = load_model_config(dir.path);
  const uint64_t H = s.hidden, D = s.head_dim, I = s.inter, L = s.layers, es = 2;
  for (int ranks : {1, 2, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    const TensorParallelPlan plan = plan_tensor_parallel(cfg, ranks);
    const uint64_t q = s.heads / ranks * D, kv = std::max(1, s.kv_heads / ranks) * D, inter = I / ranks;
    // Per layer: q rows and o columns of its heads, k and v rows of its KV head(s), gate and
    // up rows and down columns of its features.
    const uint64_t expected = L * es * (q * H + 2 * kv * H + H * q + 2 * inter * H + H * inter);
    for (int r = 0; r < ranks; ++r) {
      ShardReader reader(dir.path);
      const auto layers = read_qwen3_shard(reader, cfg, plan, r);
      EXPECT_EQ(reader.bytes_read(), expected) << "rank " << r;
      ASSERT_EQ(layers.size(), L);
      EXPECT_EQ(layers[0].o.rows, static_cast<int64_t>(H));
      EXPECT_EQ(layers[0].o.cols, static_cast<int64_t>(q));
      EXPECT_EQ(layers[0].down.cols, static_cast<int64_t>(inter));
    }
  }
  // Column slices hold the right elements: rank 1's o columns are columns [q, 2q) of the
  // whole matrix.
  ShardReader whole(dir.path), part(dir.path);
  const WeightSlice o_all = whole.rows("model.layers.1.self_attn.o_proj.weight", 0, s.hidden);
  const WeightSlice o_1 = part.cols("model.layers.1.self_attn.o_proj.weight", 16, 32);
  for (int64_t r = 0; r < o_1.rows; ++r)
    for (int64_t c = 0; c < o_1.cols; ++c) ASSERT_EQ(o_1.at(r, c), o_all.at(r, 16 + c));
  EXPECT_THROW(part.cols("model.layers.1.self_attn.o_proj.weight", 16, 33), Error);
  EXPECT_THROW(part.rows("model.layers.9.self_attn.o_proj.weight", 0, 1), Error);
}

TEST(TensorParallel, SplitsThatDoNotDivideAreRefusedByField) {
  auto cfg_with = [](int heads, int kv, int inter) {
    ModelConfig c;
    c.model_dir = "/m";
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv;
    c.intermediate_size = inter;
    c.head_dim = 8;
    return c;
  };
  auto message = [](const ModelConfig& c, int ranks) {
    try {
      plan_tensor_parallel(c, ranks);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(cfg_with(6, 2, 48), 4).find("'num_attention_heads'"), std::string::npos);
  EXPECT_NE(message(cfg_with(6, 2, 48), 3).find("'num_key_value_heads'"), std::string::npos);
  EXPECT_NE(message(cfg_with(8, 4, 50), 4).find("'intermediate_size'"), std::string::npos);
  EXPECT_NE(message(cfg_with(8, 4, 48), 0).find("--tensor-parallel"), std::string::npos);
  EXPECT_NE(message(cfg_with(6, 2, 48), 4).find("/m/config.json"), std::string::npos);
  EXPECT_EQ(message(cfg_with(8, 4, 48), 4), "");
  // Eight ranks over 4 KV heads: each KV head on two ranks, its q heads split between them.
  const TensorParallelPlan p = plan_tensor_parallel(cfg_with(8, 4, 48), 8);
  EXPECT_TRUE(p.kv_replicated);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p.rank[r].q_head_begin, r);
    EXPECT_EQ(p.rank[r].kv_head_begin, r / 2);
    EXPECT_EQ(p.rank[r].inter_end - p.rank[r].inter_begin, 6);
  }
}

// DeepSeek-V4's routed experts split over ranks on threads (load_expert_parallel): every
// test checkpoint (hash-routed layers, sigmoid router, BF16 and F32, 6 and 8 experts) decodes
// greedily as the single model, its logits to rounding.
TEST(ExpertParallel, RanksOnThreadsDecodeAsTheSingleModel) {
  const std::string root = std::string(DSINFER_TEST_DATA) + "/deepseek_v4";
  int ran = 0;
  for (const char* name : {"mixed4_f32", "mixed5_bf16_tied_orignames", "flash_schedule", "sigmoid_router_topk_all",
                           "shape2_hc2_default_rope"}) {
    const std::string dir = root + "/" + name;
    if (!std::filesystem::exists(dir + "/config.json")) continue;
    const ModelConfig cfg = load_model_config(dir);
    for (int ranks : {2, std::string(name) == "shape2_hc2_default_rope" ? 3 : 4}) {
      SCOPED_TRACE(std::string(name) + ", " + std::to_string(ranks) + " ranks");
      ++ran;
      auto single = load_model(dir);
      auto split = load_expert_parallel(dir, ranks);
      std::vector<int32_t> prompt;
      for (int i = 0; i < 9; ++i) prompt.push_back((i * 53 + 3) % cfg.vocab_size);
      std::vector<float> la, lb;
      EXPECT_EQ(greedy(*single, prompt, 12, &la), greedy(*split, prompt, 12, &lb));
      ASSERT_EQ(la.size(), lb.size());
      double worst = 0, scale = 1e-6;
      for (size_t i = 0; i < la.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(la[i] - lb[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(la[i])));
      }
      EXPECT_LT(worst, 1e-4 * scale);
    }
  }
  EXPECT_GT(ran, 0) << "no DeepSeek-V4 test checkpoint found under " << root;
  EXPECT_THROW(load_expert_parallel(root + "/mixed4_f32", 3), Error);  // 8 experts over 3 ranks
  EXPECT_THROW(load_expert_parallel(std::string(DSINFER_TEST_DATA) + "/qwen3/tied_gqa2", 2), Error);  // not a MoE model
}

TEST(ExpertParallel, ExpertsSplitIntoContiguousRanges) {
  const auto e = plan_expert_parallel(64, 8, "v4/config.json: field 'n_routed_experts'");
  ASSERT_EQ(e.size(), 8u);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(e[r], std::make_pair(r * 8, r * 8 + 8));
  try {
    plan_expert_parallel(6, 4, "v4/config.json: field 'n_routed_experts'");
    FAIL() << "6 experts over 4 ranks must be refused";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("'n_routed_experts'"), std::string::npos) << err.what();
  }
  EXPECT_THROW(plan_expert_parallel(8, 0, "x"), Error);
}

}  // namespace
}  // namespace dsinfer
