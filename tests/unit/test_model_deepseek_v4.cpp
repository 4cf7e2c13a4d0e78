// Model floor: DeepSeek-V4 conformance with transformers 5.17, rollback and batch invariance.
//
// Each tests/data/deepseek_v4/<case>/ holds a tiny random V4 checkpoint plus goldens written
// by tools/reference/gen_deepseek_v4_goldens.py (transformers 5.17, F32, eager):
//   golden.safetensors  F32 logits.prefill / logits.decode / logits.chunked [S, vocab]
//   golden.json         {"prompt", "chunks", "greedy", ...}
// The four cases cover sliding/CSA/HCA layers, hash-routed and learned MoE, mHC with 4 and
// 2 streams, YaRN and default compress RoPE, F32 and BF16 storage, tied and untied heads,
// both checkpoint naming schemes, and Flash's layer schedule given with the legacy fields.
//
// Tolerance: for every logits row, |ours − ref| ≤ 1e-4 · max(1, max |ref| of the row).
// Greedy: prefill, then one token per forward through the state; argmax (lowest index on
// ties); ids must equal the golden continuation (a full-recompute argmax loop).
// Rollback: verifying drafts and truncating must leave exactly the state of a fresh
// prefill of the committed tokens: later logits are compared bit for bit (memcmp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <fstream>
#include <functional>
#include <random>
#include <unistd.h>

#include "core/error.h"
#include "deepseek_v4_golden_util.h"
#include "core/mapped_file.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v4_state.h"
#include "model/deepseek_v4_weights.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"

using namespace dsinfer;

namespace {

const std::filesystem::path& kRoot = test::v4_golden_root();
using Golden = test::V4Golden;
using test::run_chunks;
using test::worst_rel;
std::vector<std::string> case_dirs() { return test::v4_case_dirs(); }
Golden read_golden(const std::string& dir, int V) { return test::read_v4_golden(dir, V); }

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

TEST(ModelDeepseekV4, GoldenCasesArePresent) {
  // The conformance tests below iterate over these; an empty directory would make them vacuous.
  EXPECT_GE(case_dirs().size(), 5u) << "expected the committed cases under " << kRoot;
}

TEST(ModelDeepseekV4, TransformersLogitsPrefillDecodeChunkedAndGreedy) {
  for (const std::string& dir : case_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_model(dir);
    ASSERT_NE(deepseek_v4_config(*model), nullptr);
    const int V = model->config().vocab_size;
    const Golden g = read_golden(dir, V);
    const int S = static_cast<int>(g.prompt.size());
    ASSERT_EQ(g.logits.size(), 3u);
    int at = -1;

    // Full-prompt prefill, every row.
    auto kv = model->make_kv_cache(1, S + 32);
    const std::vector<float> pre = run_chunks(*model, *kv, 0, g.prompt, {S});
    double w = worst_rel(pre.data(), g.logits.at("logits.prefill").data(), S, V, &at);
    EXPECT_LE(w, 1e-4) << "prefill: worst relative diff at row " << at;
    std::printf("%s prefill: worst relative diff %.3g (row %d)\n", dir.c_str(), w, at);

    // Token by token.
    auto kv2 = model->make_kv_cache(1, S);
    const std::vector<float> dec = run_chunks(*model, *kv2, 0, g.prompt, std::vector<int>(S, 1));
    w = worst_rel(dec.data(), g.logits.at("logits.decode").data(), S, V, &at);
    EXPECT_LE(w, 1e-4) << "decode: worst relative diff at row " << at;
    std::printf("%s decode: worst relative diff %.3g (row %d)\n", dir.c_str(), w, at);

    // Ragged chunked prefill, the golden's chunk sizes.
    auto kv3 = model->make_kv_cache(1, S);
    const std::vector<float> chk = run_chunks(*model, *kv3, 0, g.prompt, g.chunks);
    w = worst_rel(chk.data(), g.logits.at("logits.chunked").data(), S, V, &at);
    EXPECT_LE(w, 1e-4) << "chunked: worst relative diff at row " << at;
    std::printf("%s chunked: worst relative diff %.3g (row %d)\n", dir.c_str(), w, at);

    // Greedy continuation through the state (prefill → one token per forward).
    std::vector<int32_t> gen;
    int next = argmax(pre.data() + size_t(S - 1) * V, V);
    ForwardOutput out;
    while (gen.size() < g.greedy.size()) {
      gen.push_back(next);
      if (gen.size() == g.greedy.size()) break;
      ForwardBatch d;
      d.entries.push_back({0, {next}, {0}});
      model->forward(*kv, d, out);
      next = argmax(out.logits.data(), V);
    }
    EXPECT_EQ(gen, g.greedy);
  }
}

// Verify a block of drafts (some wrong), truncate to the accepted prefix, continue: the
// continuation's logits equal, bit for bit, those after a fresh prefill of the same tokens.
// Cut points sweep across window, CSA and HCA window boundaries.
TEST(ModelDeepseekV4, RollbackAfterRejectedDraftsEqualsFreshPrefill) {
  for (const char* name : {"mixed4_f32", "shape2_hc2_default_rope", "flash_schedule"}) {
    const std::string dir = (kRoot / name).string();
    SCOPED_TRACE(dir);
    auto model = load_model(dir);
    const int V = model->config().vocab_size;
    const Golden g = read_golden(dir, V);
    const int S = static_cast<int>(g.prompt.size());
    std::mt19937 rng(7);
    const int step = S > 100 ? 37 : 3;
    for (int n0 = 1; n0 + 12 <= S; n0 += step) {
      for (int acc : {0, 2, 4}) {
        SCOPED_TRACE("n0 " + std::to_string(n0) + " accepted " + std::to_string(acc));
        // Speculative path: prefill n0, verify [anchor, 5 drafts] where the first `acc`
        // drafts are the true tokens and the rest are random, keep anchor + acc.
        auto kv = model->make_kv_cache(2, S + 16);
        run_chunks(*model, *kv, 1, std::vector<int32_t>(g.prompt.begin(), g.prompt.begin() + n0), {n0});
        std::vector<int32_t> verify(g.prompt.begin() + n0, g.prompt.begin() + n0 + 1 + acc);
        while (verify.size() < 6) verify.push_back(static_cast<int32_t>(rng() % V));
        run_chunks(*model, *kv, 1, verify, {6});
        kv->truncate(1, n0 + 1 + acc);
        ASSERT_EQ(kv->length(1), n0 + 1 + acc);
        const int c0 = n0 + 1 + acc;
        const std::vector<int32_t> cont(g.prompt.begin() + c0, g.prompt.begin() + std::min(S, c0 + 6));
        const std::vector<float> a = run_chunks(*model, *kv, 1, cont, {static_cast<int>(cont.size())});
        // Fresh path: prefill the committed tokens, then the same continuation.
        auto kv2 = model->make_kv_cache(1, S + 16);
        run_chunks(*model, *kv2, 0, std::vector<int32_t>(g.prompt.begin(), g.prompt.begin() + c0), {c0});
        const std::vector<float> b = run_chunks(*model, *kv2, 0, cont, {static_cast<int>(cont.size())});
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      }
    }
  }
}

// A sequence's logits do not depend on what shares the forward call.
TEST(ModelDeepseekV4, BatchInvariance) {
  const std::string dir = (kRoot / "mixed4_f32").string();
  auto model = load_model(dir);
  const int V = model->config().vocab_size;
  const Golden g = read_golden(dir, V);
  const std::vector<int32_t> a(g.prompt.begin(), g.prompt.begin() + 30), b(g.prompt.begin() + 5, g.prompt.begin() + 22);
  auto kv = model->make_kv_cache(2, 64);
  ForwardBatch both;
  both.entries.push_back({0, a, {}});
  both.entries.push_back({1, b, {}});
  for (int i = 0; i < 30; ++i) both.entries[0].logit_rows.push_back(i);
  for (int i = 0; i < 17; ++i) both.entries[1].logit_rows.push_back(i);
  ForwardOutput out;
  model->forward(*kv, both, out);
  auto kv1 = model->make_kv_cache(1, 64);
  const std::vector<float> alone_a = run_chunks(*model, *kv1, 0, a, {30});
  kv1->clear(0);
  const std::vector<float> alone_b = run_chunks(*model, *kv1, 0, b, {17});
  EXPECT_EQ(std::memcmp(out.logits.data(), alone_a.data(), alone_a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(out.logits.data() + alone_a.size(), alone_b.data(), alone_b.size() * 4), 0);
}

TEST(ModelDeepseekV4, CanonicalNamesOfBothSchemes) {
  EXPECT_EQ(V4TensorIndex::canonical_name("embed.weight"), "embed_tokens.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("model.embed_tokens.weight"), "embed_tokens.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("head.weight"), "lm_head.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("hc_head_base"), "hc_head.hc_base");
  EXPECT_EQ(V4TensorIndex::canonical_name("model.layers.3.attn.wq_a.weight"), "layers.3.self_attn.q_a_proj.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("layers.3.attn.wq_a.scale"), "layers.3.self_attn.q_a_proj.weight_scale_inv");
  EXPECT_EQ(V4TensorIndex::canonical_name("layers.2.attn.indexer.compressor.ape"),
            "layers.2.self_attn.compressor.indexer.position_bias");
  EXPECT_EQ(V4TensorIndex::canonical_name("layers.2.attn.compressor.ape"), "layers.2.self_attn.compressor.position_bias");
  EXPECT_EQ(V4TensorIndex::canonical_name("layers.0.ffn.experts.7.w3.weight"), "layers.0.mlp.experts.7.w3.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("layers.0.ffn.experts.7.w2.scale"), "layers.0.mlp.experts.7.w2.weight_scale_inv");
  EXPECT_EQ(V4TensorIndex::canonical_name("layers.1.hc_ffn_scale"), "layers.1.ffn_hc.scale");
  EXPECT_EQ(V4TensorIndex::canonical_name("layers.1.ffn.gate.bias"), "layers.1.mlp.gate.e_score_correction_bias");
  // DSpark drafter stages: the layer renames under "mtp.{s}.", stage extras canonicalised.
  EXPECT_EQ(V4TensorIndex::canonical_name("mtp.0.attn.wq_a.weight"), "mtp.0.self_attn.q_a_proj.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("model.mtp.1.ffn.experts.3.w1.scale"), "mtp.1.mlp.experts.3.w1.weight_scale_inv");
  EXPECT_EQ(V4TensorIndex::canonical_name("mtp.0.main_proj.scale"), "mtp.0.main_proj.weight_scale_inv");
  EXPECT_EQ(V4TensorIndex::canonical_name("mtp.0.main_norm.weight"), "mtp.0.main_norm.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("mtp.2.hc_head_fn"), "mtp.2.hc_head.hc_fn");
  EXPECT_EQ(V4TensorIndex::canonical_name("mtp.2.markov_head.markov_w1.weight"), "mtp.2.markov_head.markov_w1.weight");
  EXPECT_EQ(V4TensorIndex::canonical_name("mtp.2.hc_attn_fn"), "mtp.2.attn_hc.fn");
}

namespace {

// Copies a case into a temp dir with a patched config.json.
struct PatchedCase {
  std::filesystem::path dir;
  PatchedCase(const std::string& name, const std::function<void(nlohmann::json&)>& patch) {
    dir = std::filesystem::temp_directory_path() / ("dsinfer_v4_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(kRoot / name / "model.safetensors", dir / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    auto j = nlohmann::json::parse(read_text_file((kRoot / name / "config.json").string()));
    patch(j);
    std::ofstream(dir / "config.json") << j.dump();
  }
  ~PatchedCase() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelDeepseekV4, BadConfigAndWeightsGiveOneLineErrors) {
  {
    PatchedCase c("mixed4_f32", [](nlohmann::json& j) { j["layer_types"][1] = "dense_attention"; });
    const std::string e = load_error(c.dir.string());
    EXPECT_NE(e.find("layer_types[1]"), std::string::npos) << e;
  }
  {
    PatchedCase c("flash_schedule", [](nlohmann::json& j) { j["compress_ratios"][2] = 8; });
    const std::string e = load_error(c.dir.string());
    EXPECT_NE(e.find("compress_ratios[2]"), std::string::npos) << e;
  }
  {
    PatchedCase c("mixed4_f32", [](nlohmann::json& j) { j["q_lora_rank"] = 20; });
    const std::string e = load_error(c.dir.string());
    EXPECT_NE(e.find("q_a_proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("shape"), std::string::npos) << e;
  }
  {
    // A schedule that asks for a compressor the checkpoint does not have.
    PatchedCase c("mixed4_f32", [](nlohmann::json& j) { j["layer_types"][0] = "heavily_compressed_attention"; });
    const std::string e = load_error(c.dir.string());
    EXPECT_NE(e.find("layers.0.self_attn.compressor.kv_proj.weight"), std::string::npos) << e;
  }
}

// The transformers-saved config (nested rope_parameters main/compress, moe_intermediate_size,
// architectures null) describes the same model: identical logits.
TEST(ModelDeepseekV4, TransformersSavedConfigGivesTheSameModel) {
  const std::string name = "flash_schedule";
  auto saved = nlohmann::json::parse(read_text_file((kRoot / name / "config.hf_saved.json").string()));
  PatchedCase c(name, [&](nlohmann::json& j) {
    j = saved;
    j["model_type"] = "deepseek_v4";
  });
  auto a = load_model((kRoot / name).string());
  auto b = load_model(c.dir.string());
  const Golden g = read_golden((kRoot / name).string(), a->config().vocab_size);
  auto ka = a->make_kv_cache(1, 300), kb = b->make_kv_cache(1, 300);
  const std::vector<float> la = run_chunks(*a, *ka, 0, g.prompt, {static_cast<int>(g.prompt.size())});
  const std::vector<float> lb = run_chunks(*b, *kb, 0, g.prompt, {static_cast<int>(g.prompt.size())});
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
}

// Greedy speculative decoding at the model level, as the engine runs it: each round
// verifies [anchor, drafts] in one forward, accepts drafts while they equal the argmax, and
// truncates the state to anchor + accepted. Drafts are the true continuation with random
// corruptions, so every acceptance length from 0 to all occurs. Output = plain greedy.
TEST(ModelDeepseekV4, GreedySpeculationEqualsPlainGreedy) {
  for (const char* name : {"mixed4_f32", "flash_schedule"}) {
    const std::string dir = (kRoot / name).string();
    SCOPED_TRACE(dir);
    auto model = load_model(dir);
    const int V = model->config().vocab_size;
    const Golden g = read_golden(dir, V);
    const int n_prompt = std::min<int>(static_cast<int>(g.prompt.size()), 140), n_gen = 40;
    const std::vector<int32_t> prompt(g.prompt.begin(), g.prompt.begin() + n_prompt);
    // Plain greedy.
    auto kv = model->make_kv_cache(1, n_prompt + n_gen + 8);
    std::vector<float> lg = run_chunks(*model, *kv, 0, prompt, {n_prompt});
    std::vector<int32_t> plain{argmax(lg.data() + size_t(n_prompt - 1) * V, V)};
    ForwardOutput out;
    while (static_cast<int>(plain.size()) < n_gen) {
      ForwardBatch b;
      b.entries.push_back({0, {plain.back()}, {0}});
      model->forward(*kv, b, out);
      plain.push_back(argmax(out.logits.data(), V));
    }
    // Speculative greedy.
    std::mt19937 rng(3);
    auto kv2 = model->make_kv_cache(1, n_prompt + n_gen + 8);
    lg = run_chunks(*model, *kv2, 0, prompt, {n_prompt});
    std::vector<int32_t> spec{argmax(lg.data() + size_t(n_prompt - 1) * V, V)};
    int rounds = 0, accepted_total = 0, rejected_rounds = 0;
    while (static_cast<int>(spec.size()) < n_gen) {
      const int start = kv2->length(0);
      const int room = n_gen - static_cast<int>(spec.size());
      const int n_draft = std::min(room - 1 >= 0 ? room - 1 : 0, 1 + static_cast<int>(rng() % 5));
      std::vector<int32_t> block{spec.back()};
      for (int i = 0; i < n_draft; ++i) {
        const size_t at = spec.size() + i;
        int32_t d = at < plain.size() ? plain[at] : 0;
        if (rng() % 4 == 0) d = static_cast<int32_t>(rng() % V);  // corrupt
        block.push_back(d);
      }
      ForwardBatch b;
      ForwardEntry e{0, block, {}};
      for (size_t i = 0; i < block.size(); ++i) e.logit_rows.push_back(static_cast<int>(i));
      b.entries.push_back(e);
      model->forward(*kv2, b, out);
      int acc = 0;
      while (acc < n_draft && argmax(out.logits.data() + size_t(acc) * V, V) == block[acc + 1]) ++acc;
      const int32_t next = argmax(out.logits.data() + size_t(acc) * V, V);
      kv2->truncate(0, start + acc + 1);
      for (int i = 0; i < acc; ++i) spec.push_back(block[i + 1]);
      spec.push_back(next);
      ++rounds;
      accepted_total += acc;
      rejected_rounds += acc < n_draft;
    }
    spec.resize(n_gen);
    EXPECT_EQ(spec, plain);
    EXPECT_GT(accepted_total, 5);    // drafts were accepted...
    EXPECT_GT(rejected_rounds, 3);   // ...and rejected, so rollback really ran
    EXPECT_LT(rounds, n_gen);
  }
}

// The goldens really exercise the indexer's selection: letting every CSA query see every
// visible entry (index_topk larger than any count) moves the logits far beyond tolerance.
TEST(ModelDeepseekV4, IndexerSelectionIsExercisedByTheGoldens) {
  PatchedCase c("mixed4_f32", [](nlohmann::json& j) { j["index_topk"] = 1000; });
  auto model = load_model(c.dir.string());
  const int V = model->config().vocab_size;
  const Golden g = read_golden((kRoot / "mixed4_f32").string(), V);
  const int S = static_cast<int>(g.prompt.size());
  auto kv = model->make_kv_cache(1, S);
  const std::vector<float> pre = run_chunks(*model, *kv, 0, g.prompt, {S});
  EXPECT_GT(worst_rel(pre.data(), g.logits.at("logits.prefill").data(), S, V), 1e-2);
}

TEST(ModelDeepseekV4, StateCapacityBeyondMemoryIsRefused) {
  auto model = load_model((kRoot / "mixed4_f32").string());
  try {
    model->make_kv_cache(4096, 1 << 30);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DeepSeek-V4 state"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(model->make_kv_cache(4, 4096));
}

// Long sequences: the window and raw rows are dropped as the sequence grows (the state stays
// bounded apart from the compressed entries), rollback within kMaxRollback stays exact, and
// a deeper one is refused with an Error rather than computing from missing rows.
TEST(ModelDeepseekV4, LongSequenceStateIsBoundedAndRollbackStaysExact) {
  auto model = load_model((kRoot / "mixed4_f32").string());
  const DeepseekV4Config& cfg = *deepseek_v4_config(*model);
  const int V = model->config().vocab_size, N = 4000;
  std::vector<int32_t> toks;
  for (int i = 0; i < N + 20; ++i) toks.push_back(3 + (i * 31 + i / 7) % (V - 3));
  auto kv = model->make_kv_cache(1, N + 40);
  auto* st = dynamic_cast<V4State*>(kv.get());
  ASSERT_NE(st, nullptr);
  // Grow to N/2 then N tokens in small chunks (a chunk's own rows are held while it runs):
  // beyond the bounded rows, memory grows only by the compressed entries (x2 for vector
  // capacity doubling).
  const int half = N / 2 / 7 * 7;  // 1995; the rest, 2005, is 401 chunks of 5
  run_chunks(*model, *kv, 0, std::vector<int32_t>(toks.begin(), toks.begin() + half), std::vector<int>(half / 7, 7));
  const uint64_t b1 = st->bytes_used(0);
  run_chunks(*model, *kv, 0, std::vector<int32_t>(toks.begin() + half, toks.begin() + N), std::vector<int>((N - half) / 5, 5));
  const uint64_t b2 = st->bytes_used(0);
  EXPECT_LE(b1, V4State::bytes_bounded(cfg) + 2 * uint64_t(half) * V4State::bytes_per_token(cfg) + 4096);
  EXPECT_LE(b2 - b1, 2 * uint64_t(N) * V4State::bytes_per_token(cfg) + 4096) << b1 << " -> " << b2;

  // Verify [anchor, 5 drafts (first 2 right)], keep anchor + 2, continue.
  std::vector<int32_t> verify{toks[N], toks[N + 1], toks[N + 2], 5, 6, 7};
  run_chunks(*model, *kv, 0, verify, {6});
  kv->truncate(0, N + 3);
  const std::vector<int32_t> cont(toks.begin() + N + 3, toks.begin() + N + 12);
  const std::vector<float> a = run_chunks(*model, *kv, 0, cont, {4, 5});
  auto kv2 = model->make_kv_cache(1, N + 40);
  run_chunks(*model, *kv2, 0, std::vector<int32_t>(toks.begin(), toks.begin() + N + 3), {N + 3});
  const std::vector<float> b = run_chunks(*model, *kv2, 0, cont, {9});
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);

  // Deepest allowed rollback works; deeper is refused; clearing always works.
  const int len = kv->length(0);
  EXPECT_THROW(kv->truncate(0, 100), Error);
  EXPECT_EQ(kv->length(0), len);
  EXPECT_NO_THROW(kv->truncate(0, len - V4State::kMaxRollback));
  const std::vector<float> c = run_chunks(*model, *kv, 0, {toks[len - V4State::kMaxRollback]}, {1});
  auto kv3 = model->make_kv_cache(1, N + 40);
  const std::vector<float> d = run_chunks(*model, *kv3, 0, std::vector<int32_t>(toks.begin(), toks.begin() + len - V4State::kMaxRollback + 1),
                                          {len - V4State::kMaxRollback + 1});
  EXPECT_EQ(std::memcmp(c.data(), d.data() + size_t(len - V4State::kMaxRollback) * V, size_t(V) * 4), 0);
  kv->clear(0);
  const std::vector<float> e = run_chunks(*model, *kv, 0, std::vector<int32_t>(toks.begin(), toks.begin() + 20), {20});
  EXPECT_EQ(std::memcmp(e.data(), d.data(), e.size() * 4), 0);
}
