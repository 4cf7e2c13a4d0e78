// Engine floor: the DeepSeek-V4 DSpark drafter (mtp.* stages) behind the Drafter interface,
// driven by the speculative decode loop.
//
// The checkpoint is a committed tiny V4 target (tests/data/deepseek_v4/mixed4_f32: sliding,
// CSA and HCA layers, hash and learned MoE, 4 mHC streams, window 8, compress rates 4/8)
// plus random mtp.{0,1,2} stages written at test time (v4_dspark_test_util.h). Checked:
//   - loading: DrafterInfo from the dspark_* fields, the capture of the target layers;
//   - lossless greedy speculation (block 5) against plain greedy over several prompts, with
//     a random head (nearly everything rejected) and with a Markov head set to the target's
//     own greedy bigrams (many drafts accepted, some rejected), so every round rolls back the
//     window, compressor and indexer state of the target;
//   - after speculative rounds the target state equals a fresh prefill (bit for bit);
//   - the batched commit and propose (the engine's) equal single-sequence calls, bit for bit;
//   - `dsinfer generate --spec dspark` on a V4 model directory uses its own mtp.* drafter;
//   - one-line loader errors naming the tensor or field for missing / ill-shaped mtp.*
//     tensors and missing dspark_* fields.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_helpers.h"
#include "core/error.h"
#include "error_test_util.h"
#include "engine/generator.h"
#include "engine/speculative.h"
#include "model/deepseek_v4.h"
#include "model/model.h"
#include "spec/drafter_loader.h"
#include "v4_dspark_test_util.h"

using namespace dsinfer;
namespace fs = std::filesystem;

namespace {

using Scratch = test::ScratchDir;

std::vector<std::vector<int32_t>> prompts(int vocab) {
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> ps;
  for (int len : {1, 3, 9, 17, 30}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p) t = static_cast<int32_t>(3 + rng() % static_cast<unsigned>(vocab - 3));
    ps.push_back(p);
  }
  return ps;
}

std::vector<int32_t> plain_greedy(Model& m, const std::vector<int32_t>& prompt, int n) {
  StopConditions stop;
  stop.max_tokens = n;
  return generate(m, nullptr, prompt, SamplingParams{}, stop).ids;
}

using test::error_of;

constexpr int kNew = 40;

}  // namespace

TEST(V4DSpark, LoadsStagesAndCapturesStreamMeans) {
  Scratch s;
  test::TinyDSparkSpec sp;
  test::write_tiny_v4_dspark(sp, s.path);
  auto target = load_model(s.path);
  auto d = load_drafter(s.path, *target);
  const DrafterInfo& info = d->info();
  EXPECT_EQ(info.kind, "dspark");
  EXPECT_EQ(info.block_size, 5);
  EXPECT_EQ(info.max_draft_tokens, 5);
  EXPECT_EQ(info.target_layer_ids, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(info.mask_token_id, 2);
  EXPECT_EQ(info.markov_head, "vanilla");
  EXPECT_TRUE(info.confidence_head);
  // The memory plan counts the drafter: target + drafter beyond physical memory is refused.
  EXPECT_GT(deepseek_v4_weight_bytes(*target), 0u);
  const std::string refusal =
      error_of([&] { deepseek_v4_plan_drafter(*target, "DSpark drafter", uint64_t{1} << 60, 0); });
  EXPECT_NE(refusal.find("refusing to load the drafter"), std::string::npos) << refusal;

  // Captured layer -1 is the embedding (the mean of n_hc identical copies).
  auto kv = target->make_kv_cache(1, 16);
  ForwardBatch b;
  b.capture_layers = {-1, 3};
  b.entries.push_back({0, {5, 6, 7}, {2}});
  ForwardOutput out;
  target->forward(*kv, b, out);
  const int H = target->config().hidden_size;
  ASSERT_EQ(out.captured.size(), static_cast<size_t>(3 * 2 * H));
  std::vector<float> emb(static_cast<size_t>(3 * H));
  const int32_t ids[3] = {5, 6, 7};
  target->embed(ids, 3, emb.data());
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < H; ++k) EXPECT_NEAR(out.captured[(r * 2) * H + k], emb[r * H + k], 1e-6f);
  // Capturing changes nothing else: same logits without it.
  auto kv2 = target->make_kv_cache(1, 16);
  ForwardBatch b2 = b;
  b2.capture_layers.clear();
  ForwardOutput out2;
  target->forward(*kv2, b2, out2);
  EXPECT_EQ(0, std::memcmp(out.logits.data(), out2.logits.data(), out.logits.size() * sizeof(float)));
}

// Greedy speculation equals plain greedy; with the bigram Markov head drafts are accepted
// (several per round at times) and rejected, each rejection rolling the target back.
TEST(V4DSpark, GreedySpeculationEqualsPlainGreedy) {
  Scratch base_dir;
  test::TinyDSparkSpec sp;
  test::write_tiny_v4_dspark(sp, base_dir.path);
  auto target = load_model(base_dir.path);
  const int V = target->config().vocab_size;
  const auto ps = prompts(V);
  std::vector<std::vector<int32_t>> plain;
  std::map<int32_t, int32_t> bigram;
  for (const auto& p : ps) {
    plain.push_back(plain_greedy(*target, p, kNew));
    int32_t prev = p.back();
    for (int32_t t : plain.back()) {
      bigram.emplace(prev, t);  // first transition seen wins: later ones disagree at times
      prev = t;
    }
  }
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "random Markov head" : "bigram Markov head");
    Scratch dir;
    test::TinyDSparkSpec v = sp;
    if (variant == 1) {
      v.bigram = bigram;
      v.markov_rank = static_cast<int>(bigram.size());
    }
    test::write_tiny_v4_dspark(v, dir.path);
    auto tgt = load_model(dir.path);
    auto d = load_drafter(dir.path, *tgt);
    int64_t accepted = 0, rejected_rounds = 0, multi = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      SpecOptions so;
      so.drafter = d.get();
      StopConditions stop;
      stop.max_tokens = kNew;
      auto r = generate(*tgt, nullptr, ps[i], SamplingParams{}, stop, {}, so);
      ASSERT_EQ(r.ids, plain[i]) << "prompt " << i;
      for (size_t k = 0; k < r.spec.accepted.size(); ++k) accepted += r.spec.accepted[k];
    }
    // Rounds with rejections, rounds with several accepted drafts (SpecDecoder directly).
    for (const auto& p : ps) {
      SpecOptions so;
      so.drafter = d.get();
      SpecDecoder dec(*tgt, SamplingParams{}, so, static_cast<int>(p.size()) + kNew + 8);
      dec.prefill(p);
      for (int k = 0; k < 8; ++k) {
        const SpecRound& r = dec.round(64);
        EXPECT_EQ(r.drafted, 5);
        rejected_rounds += r.accepted < r.drafted;
        multi += r.accepted >= 2;
      }
    }
    EXPECT_GT(rejected_rounds, 0);
    if (variant == 1) {
      EXPECT_GT(accepted, 20);
      EXPECT_GT(multi, 0);
    }
    std::printf("[ v4 dspark ] %s: %lld accepted drafts, %lld rounds with a rejection, %lld with >= 2 accepted\n",
                variant == 0 ? "random" : "bigram", static_cast<long long>(accepted),
                static_cast<long long>(rejected_rounds), static_cast<long long>(multi));
  }
}

// After speculative rounds (accept + reject + rollback), the target state equals that of a
// fresh prefill of the committed tokens: the next token's logits match bit for bit.
TEST(V4DSpark, StateAfterRoundsEqualsFreshPrefill) {
  Scratch base_dir;
  test::TinyDSparkSpec sp;
  test::write_tiny_v4_dspark(sp, base_dir.path);
  auto target0 = load_model(base_dir.path);
  const auto p = prompts(target0->config().vocab_size)[3];
  const auto plain = plain_greedy(*target0, p, kNew);
  std::map<int32_t, int32_t> bigram;
  int32_t prev = p.back();
  for (int32_t t : plain) bigram.emplace(prev, t), prev = t;
  Scratch dir;
  sp.bigram = bigram;
  sp.markov_rank = static_cast<int>(bigram.size());
  test::write_tiny_v4_dspark(sp, dir.path);
  auto target = load_model(dir.path);
  auto d = load_drafter(dir.path, *target);
  SpecOptions so;
  so.drafter = d.get();
  SpecDecoder dec(*target, SamplingParams{}, so, 128);
  std::vector<int32_t> committed = p;
  committed.push_back(dec.prefill(p));
  for (int k = 0; k < 7; ++k) {
    const SpecRound& r = dec.round(64);
    committed.insert(committed.end(), r.tokens.begin(), r.tokens.end());
  }
  // The KV holds everything but the pending anchor (the last committed token).
  const int32_t anchor = committed.back();
  committed.pop_back();
  ASSERT_EQ(dec.kv().length(0), static_cast<int>(committed.size()));
  auto fresh = target->make_kv_cache(1, 128);
  ForwardBatch pre;
  pre.entries.push_back({0, committed, {}});
  ForwardOutput o;
  target->forward(*fresh, pre, o);
  ForwardBatch step;
  step.entries.push_back({0, {anchor}, {0}});
  ForwardOutput a, b;
  target->forward(dec.kv(), step, a);
  target->forward(*fresh, step, b);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)));
}

// Sampled drafting: q rows are the distributions the drafts were drawn from (normalised,
// positive at the drawn token), and sampled speculation runs to the requested length.
TEST(V4DSpark, SampledDraftsCarryTheirDistributions) {
  Scratch dir;
  test::write_tiny_v4_dspark(test::TinyDSparkSpec{}, dir.path);
  auto target = load_model(dir.path);
  auto d = load_drafter(dir.path, *target);
  const int V = target->config().vocab_size;
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.95f;
  sp.seed = 3;
  const std::vector<int32_t> prompt = prompts(V)[2];
  auto kv = target->make_kv_cache(1, 64);
  ForwardBatch b;
  b.capture_layers = d->info().target_layer_ids;
  b.entries.push_back({0, prompt, {}});
  ForwardOutput out;
  target->forward(*kv, b, out);
  auto seq = d->start();
  d->commit_context(*seq, prompt.data(), out.captured.data(), static_cast<int>(prompt.size()));
  EXPECT_EQ(seq->context_length(), static_cast<int>(prompt.size()));
  Rng rng(5);
  const DraftProposal p = d->propose(*seq, 7, 4, sp, rng);
  ASSERT_EQ(p.tokens.size(), 4u);
  ASSERT_EQ(p.q.size(), static_cast<size_t>(4 * V));
  ASSERT_EQ(p.confidence.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += p.q[k * V + j];
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_GT(p.q[k * V + p.tokens[k]], 0.0f);
    EXPECT_GT(p.confidence[k], 0.0f);
    EXPECT_LT(p.confidence[k], 1.0f);
  }
  SpecOptions so;
  so.drafter = d.get();
  StopConditions stop;
  stop.max_tokens = 30;
  auto r = generate(*target, nullptr, prompt, sp, stop, {}, so);
  EXPECT_EQ(r.ids.size(), 30u);
}

// The batched pass (what the engine calls for every drafting request at once) gives each
// item exactly what a pass of that item alone gives: commits of several sequences at once,
// then greedy and sampled proposals (tokens, q rows, confidences), bit for bit; an item with
// no room to draft gets an empty proposal and does not disturb the others.
TEST(V4DSpark, BatchedPassEqualsSinglePasses) {
  Scratch dir;
  test::write_tiny_v4_dspark(test::TinyDSparkSpec{}, dir.path);
  auto target = load_model(dir.path);
  auto d = load_drafter(dir.path, *target);
  const auto ps = prompts(target->config().vocab_size);  // lengths 1, 3, 9, 17, 30
  // Each prompt's captured target rows.
  std::vector<ForwardOutput> cap(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    auto kv = target->make_kv_cache(1, 64);
    ForwardBatch b;
    b.capture_layers = d->info().target_layer_ids;
    b.entries.push_back({0, ps[i], {}});
    target->forward(*kv, b, cap[i]);
  }
  std::vector<std::unique_ptr<DraftSequence>> one, many;
  std::vector<ContextBatchItem> commits;
  for (size_t i = 0; i < ps.size(); ++i) {
    one.push_back(d->start());
    many.push_back(d->start());
    d->commit_context(*one.back(), ps[i].data(), cap[i].captured.data(), static_cast<int>(ps[i].size()));
    commits.push_back({many.back().get(), ps[i].data(), cap[i].captured.data(), static_cast<int>(ps[i].size())});
  }
  d->commit_context_batch(commits);
  for (int sampled = 0; sampled < 2; ++sampled) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    SamplingParams sp;
    if (sampled) {
      sp.temperature = 0.9f;
      sp.top_p = 0.9f;
    }
    std::vector<DraftProposal> single;
    std::vector<Rng> rngs;
    for (size_t i = 0; i < ps.size(); ++i) rngs.emplace_back(100 + i);
    std::vector<DraftBatchItem> items;
    for (size_t i = 0; i < ps.size(); ++i) {
      Rng r(100 + i);
      const int max_tokens = i == 2 ? 0 : i == 3 ? 3 : 5;  // one item with no room, one short
      single.push_back(d->propose(*one[i], static_cast<int32_t>(7 + i), max_tokens, sp, r));
      items.push_back({many[i].get(), static_cast<int32_t>(7 + i), max_tokens, &sp, &rngs[i]});
    }
    const std::vector<DraftProposal> batched = d->propose_batch(items);
    ASSERT_EQ(batched.size(), ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(batched[i].tokens, single[i].tokens) << "item " << i;
      EXPECT_EQ(batched[i].q, single[i].q) << "item " << i;
      EXPECT_EQ(batched[i].confidence, single[i].confidence) << "item " << i;
      EXPECT_EQ(batched[i].confidence_logits, single[i].confidence_logits) << "item " << i;
    }
    EXPECT_TRUE(batched[2].tokens.empty());
    EXPECT_EQ(batched[3].tokens.size(), 3u);
    if (sampled) EXPECT_FALSE(batched[0].q.empty());
  }
}

TEST(V4DSpark, CliGenerateUsesTheEmbeddedDrafter) {
  Scratch dir;
  test::TinyDSparkSpec sp;
  test::write_tiny_v4_dspark(sp, dir.path);
  const std::vector<std::string> base = {"generate", "--model-path", dir.path, "--prompt-ids", "5,9,14,20,33,41,8,9,10",
                                         "--max-tokens", "24", "--ignore-eos", "--threads", "1", "--json"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto plain = dsinfer_test::run_dsinfer(with({"--spec", "none"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto spec = dsinfer_test::run_dsinfer(with({"--spec", "dspark", "--spec-schedule", "fixed"}));
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  auto jp = nlohmann::json::parse(plain.out), js = nlohmann::json::parse(spec.out);
  EXPECT_EQ(js["ids"], jp["ids"]);
  EXPECT_EQ(js["spec"]["method"], "dspark");
  EXPECT_NE(spec.err.find("DSpark drafter (3 mtp stages"), std::string::npos) << spec.err;
}

TEST(V4DSpark, LoaderErrorsNameTheTensorOrField) {
  struct Case {
    std::string drop, reshape_name;
    std::vector<int64_t> reshape;
    std::string needle;
  };
  // mixed4_f32: D = 32, d = 16, vocab 97; markov rank 24.
  const std::vector<Case> cases = {
      {"mtp.1.attn.wq_a.weight", "", {}, "mtp.1.self_attn.q_a_proj.weight"},
      {"mtp.0.main_proj.weight", "", {}, "mtp.0.main_proj.weight"},
      {"mtp.2.hc_head_fn", "", {}, "mtp.2.hc_head.hc_fn"},
      {"mtp.2.ffn.experts.5.w2.weight", "", {}, "mtp.2.mlp.experts.5.w2.weight"},
      {"", "mtp.2.attn.wkv.weight", {17, 32}, "tensor 'mtp.2.attn.wkv.weight': shape [17, 32]"},
      {"", "mtp.0.main_proj.weight", {32, 64}, "tensor 'mtp.0.main_proj.weight': shape [32, 64]"},
      {"", "mtp.2.markov_head.markov_w1.weight", {97, 23}, "tensor 'mtp.2.markov_head.markov_w1.weight'"},
      {"", "mtp.1.ffn.gate.bias", {7}, "tensor 'mtp.1.ffn.gate.bias'"},
  };
  Scratch good;
  test::write_tiny_v4_dspark(test::TinyDSparkSpec{}, good.path);
  auto target = load_model(good.path);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.needle);
    Scratch dir;
    test::TinyDSparkSpec sp;
    sp.drop = c.drop;
    sp.reshape_name = c.reshape_name;
    sp.reshape = c.reshape;
    test::write_tiny_v4_dspark(sp, dir.path);
    const std::string msg = error_of([&] { load_drafter(dir.path, *target); });
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // A V4 drafter needs a V4 target.
  {
    auto qwen = load_model(std::string(DSINFER_TEST_DATA) + "/qwen3/yarn_gqa3");
    const std::string msg = error_of([&] { load_drafter(good.path, *qwen); });
    EXPECT_NE(msg.find("needs a DeepSeek-V4 target"), std::string::npos) << msg;
  }
  // No mtp.* stages at all, and missing / bad dspark_* fields.
  {
    Scratch dir;
    test::TinyDSparkSpec sp;
    sp.stages = 0;
    test::write_tiny_v4_dspark(sp, dir.path);
    EXPECT_NE(error_of([&] { load_drafter(dir.path, *target); }).find("no DSpark drafter tensors"), std::string::npos);
  }
  for (const auto& [field, value, needle] :
       std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"dspark_block_size", nullptr, "field 'dspark_block_size': missing"},
           {"dspark_noise_token_id", 97, "field 'dspark_noise_token_id': value 97 out of range"},
           {"dspark_target_layer_ids", nlohmann::json::array({1, 4}), "field 'dspark_target_layer_ids': [1, 4]: id 4"},
           {"dspark_target_layer_ids", nlohmann::json::array({2, 1}), "not strictly increasing"}}) {
    SCOPED_TRACE(needle);
    Scratch dir;
    test::write_tiny_v4_dspark(test::TinyDSparkSpec{}, dir.path);
    auto cfg = nlohmann::json::parse(read_text_file(dir.path + "/config.json"));
    if (value.is_null()) cfg.erase(field);
    else cfg[field] = value;
    std::ofstream(dir.path + "/config.json") << cfg.dump(1);
    const std::string msg = error_of([&] { load_drafter(dir.path, *target); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  }
}

// Writes the default tiny checkpoint for tools/reference/v4_dspark_ref.py when
// DSINFER_V4DSPARK_EXPORT names a directory (skipped otherwise).
TEST(V4DSpark, ExportForReference) {
  const char* out = std::getenv("DSINFER_V4DSPARK_EXPORT");
  if (!out || !*out) GTEST_SKIP() << "DSINFER_V4DSPARK_EXPORT not set";
  test::write_tiny_v4_dspark(test::TinyDSparkSpec{}, out);
}

// Goldens from the PyTorch reference (tools/reference/v4_dspark_ref.py, transformers 5.17 for
// the target's layer outputs, float64 for the drafter) on the default tiny checkpoint:
// our captured features match transformers' (mean over the n_hc streams), and from the
// golden features our drafter gives the same greedy drafts and confidence logits.
TEST(V4DSpark, MatchesPyTorchReference) {
  const std::string golden = std::string(DSINFER_TEST_DATA) + "/deepseek_v4/dspark_golden.json";
  if (!fs::exists(golden)) GTEST_SKIP() << golden << " absent";
  const auto g = nlohmann::json::parse(read_text_file(golden));
  Scratch dir;
  test::write_tiny_v4_dspark(test::TinyDSparkSpec{}, dir.path);
  {
    // The checkpoint is regenerated here (std::normal_distribution of this libstdc++): make
    // sure it is byte for byte the one the goldens were computed from.
    const std::string bytes = read_text_file(dir.path + "/model.safetensors");
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    ASSERT_EQ(std::string(hex), g["checkpoint_fnv1a64"].get<std::string>())
        << "the regenerated tiny checkpoint differs from the goldens' (another standard library?)";
  }
  auto target = load_model(dir.path);
  auto d = load_drafter(dir.path, *target);
  const std::vector<int32_t> prompt = g["prompt"].get<std::vector<int32_t>>();
  const int S = static_cast<int>(prompt.size());
  const int F = static_cast<int>(d->info().target_layer_ids.size()) * target->config().hidden_size;
  auto kv = target->make_kv_cache(1, S + 8);
  ForwardBatch b;
  b.capture_layers = d->info().target_layer_ids;
  b.entries.push_back({0, prompt, {S - 1}});
  ForwardOutput out;
  target->forward(*kv, b, out);
  const int anchor = static_cast<int>(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
  EXPECT_EQ(anchor, g["anchor"].get<int>());
  std::vector<float> feats;
  for (const auto& row : g["features"]) {
    ASSERT_EQ(static_cast<int>(row.size()), F);
    for (const auto& v : row) feats.push_back(v.get<float>());
  }
  ASSERT_EQ(feats.size(), out.captured.size());
  for (int r = 0; r < S; ++r) {
    float mx = 1.0f;
    for (int k = 0; k < F; ++k) mx = std::max(mx, std::fabs(feats[r * F + k]));
    for (int k = 0; k < F; ++k) ASSERT_NEAR(out.captured[r * F + k], feats[r * F + k], 1e-4f * mx) << "row " << r << " k " << k;
  }
  auto seq = d->start();
  d->commit_context(*seq, prompt.data(), feats.data(), S);
  Rng rng(0);
  const DraftProposal p = d->propose(*seq, anchor, d->info().max_draft_tokens, SamplingParams{}, rng);
  const auto want = g["draft_tokens"].get<std::vector<int32_t>>();
  const auto margins = g["draft_logit_margins"].get<std::vector<double>>();
  const auto conf = g["confidence_logits"].get<std::vector<double>>();
  ASSERT_EQ(p.tokens.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    if (margins[k] < 1e-3) break;  // a near tie: the chain may legitimately part here
    EXPECT_EQ(p.tokens[k], want[k]) << "draft " << k;
    if (p.tokens[k] != want[k]) break;
    ASSERT_LT(k, p.confidence_logits.size());
    EXPECT_NEAR(p.confidence_logits[k], conf[k], 1e-4 * std::max(1.0, std::fabs(conf[k]))) << "draft " << k;
  }
}
