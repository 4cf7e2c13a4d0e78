// Batched drafter passes (Drafter::propose_batch / commit_context_batch) against the
// single-sequence calls, on the shipped target and every shipped drafter kind:
//   - R sequences with different prompts (so different context lengths), committed one by
//     one on side A and in one batched commit on side B;
//   - several rounds of proposals: side A proposes per sequence, side B in one batch with a
//     different max_tokens per item (including 0 and more than the block); tokens, q rows,
//     confidences and confidence logits must be bit-identical, greedy and sampled (each item
//     has its own rng, seeded alike on both sides);
//   - then a batched commit of each sequence's drafts, so the next round runs at new lengths.
// Also: one-line errors for a sequence named twice; a DeepSpec drafter uses the target's own
// embedding and LM head (its checkpoint copies are bit-identical) and drafts exactly as
// with its own copies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "kernels/cpu/matmul.h"
#include "spec/dflash_backbone.h"
#include "spec/drafter.h"
#include "spec/draft_vocab.h"
#include "spec/drafter_loader.h"

namespace dsinfer {
namespace {

const std::string kRoot = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";

struct Side {
  std::vector<std::unique_ptr<DraftSequence>> seqs;
  std::vector<Rng> rngs;
};

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void check_drafter(const std::string& dir, bool sampled, const DrafterOptions& opts = {}) {
  if (!std::filesystem::exists(kRoot + "/" + dir + "/model.safetensors")) GTEST_SKIP() << "no shipped " << dir;
  auto target = load_model(kRoot + "/target");
  auto drafter = load_drafter(kRoot + "/" + dir, *target, opts);
  const DrafterInfo& info = drafter->info();
  const int V = target->config().vocab_size;
  const int R = 5;
  std::mt19937 gen(7);
  // Prompts of different lengths; their captured target rows are what both sides commit.
  std::vector<std::vector<int32_t>> prompts(R);
  std::vector<std::vector<float>> hidden(R);
  auto kv = target->make_kv_cache(R, 512);
  for (int i = 0; i < R; ++i) {
    const int len = 5 + 17 * i;
    for (int t = 0; t < len; ++t) prompts[i].push_back(static_cast<int32_t>(gen() % (V - 8)));
    ForwardBatch b;
    b.capture_layers = info.target_layer_ids;
    b.entries.push_back(ForwardEntry{i, prompts[i], {len - 1}});
    ForwardOutput o;
    target->forward(*kv, b, o);
    hidden[i] = o.captured;
  }
  SamplingParams params;
  if (sampled) {
    params.temperature = 0.9f;
    params.top_k = 50;
  }
  Side a, b;
  for (Side* s : {&a, &b})
    for (int i = 0; i < R; ++i) {
      s->seqs.push_back(drafter->start());
      s->rngs.emplace_back(100 + i);
    }
  for (int i = 0; i < R; ++i)
    drafter->commit_context(*a.seqs[i], prompts[i].data(), hidden[i].data(), static_cast<int>(prompts[i].size()));
  {
    std::vector<ContextBatchItem> items;
    for (int i = 0; i < R; ++i)
      items.push_back({b.seqs[i].get(), prompts[i].data(), hidden[i].data(), static_cast<int>(prompts[i].size())});
    drafter->commit_context_batch(items);
  }
  const int bs = info.max_draft_tokens;
  for (int round = 0; round < 3; ++round) {
    std::vector<int32_t> anchors(R);
    std::vector<int> max_tokens(R);
    for (int i = 0; i < R; ++i) {
      anchors[i] = static_cast<int32_t>(gen() % (V - 8));
      max_tokens[i] = (i + round) % 4 == 0 ? 0 : (i == 3 ? bs + 5 : 1 + static_cast<int>(gen() % bs));
    }
    std::vector<DraftProposal> pa;
    for (int i = 0; i < R; ++i) pa.push_back(drafter->propose(*a.seqs[i], anchors[i], max_tokens[i], params, a.rngs[i]));
    std::vector<DraftBatchItem> items;
    for (int i = 0; i < R; ++i) items.push_back({b.seqs[i].get(), anchors[i], max_tokens[i], &params, &b.rngs[i]});
    const std::vector<DraftProposal> pb = drafter->propose_batch(items);
    ASSERT_EQ(pb.size(), static_cast<size_t>(R));
    for (int i = 0; i < R; ++i) {
      SCOPED_TRACE(dir + " round " + std::to_string(round) + " item " + std::to_string(i));
      EXPECT_EQ(pa[i].tokens, pb[i].tokens);
      EXPECT_TRUE(same_floats(pa[i].q, pb[i].q));
      EXPECT_TRUE(same_floats(pa[i].confidence, pb[i].confidence));
      EXPECT_TRUE(same_floats(pa[i].confidence_logits, pb[i].confidence_logits));
      if (max_tokens[i] > 0) EXPECT_FALSE(pa[i].tokens.empty());
    }
    // Commit [anchor, drafts...] with made-up hidden rows (the drafter does not care where
    // they come from), one by one on A, batched on B.
    std::vector<std::vector<int32_t>> toks(R);
    std::vector<std::vector<float>> rows(R);
    const size_t feat = info.target_layer_ids.size() * static_cast<size_t>(target->config().hidden_size);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<ContextBatchItem> commits;
    for (int i = 0; i < R; ++i) {
      toks[i].push_back(anchors[i]);
      toks[i].insert(toks[i].end(), pa[i].tokens.begin(), pa[i].tokens.end());
      rows[i].resize(toks[i].size() * feat);
      for (float& x : rows[i]) x = nd(gen);
      drafter->commit_context(*a.seqs[i], toks[i].data(), rows[i].data(), static_cast<int>(toks[i].size()));
      commits.push_back({b.seqs[i].get(), toks[i].data(), rows[i].data(), static_cast<int>(toks[i].size())});
    }
    drafter->commit_context_batch(commits);
    for (int i = 0; i < R; ++i) EXPECT_EQ(a.seqs[i]->context_length(), b.seqs[i]->context_length());
  }
}

// The matmul precision for one test (a drafter picks its context K/V dtype when it loads).
struct PrecisionScope {
  MatmulPrecision old;
  explicit PrecisionScope(MatmulPrecision p) : old(matmul_precision()) { set_matmul_precision(p); }
  ~PrecisionScope() { set_matmul_precision(old); }
};

bool keeps_bf16_kv(const Drafter& d) {
  const auto* b = dynamic_cast<const BlockDrafter*>(&d);
  return b && b->backbone().kv_bf16();
}

TEST(SpecDrafterBatch, DSparkBatchEqualsSingleGreedy) { check_drafter("dspark", false); }
// In bf16 matmul precision the drafter keeps its context K/V in BF16 (as serve and generate
// run it): batched passes and commits still give each sequence its single-call bits.
TEST(SpecDrafterBatch, DSparkBatchEqualsSingleWithBf16ContextKV) {
  if (!std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped dspark";
  PrecisionScope bf16(MatmulPrecision::Bf16Dot);
  {
    auto target = load_model(kRoot + "/target");
    ASSERT_TRUE(keeps_bf16_kv(*load_drafter(kRoot + "/dspark", *target)));
  }
  check_drafter("dspark", false);
  check_drafter("dspark", true);
}

// A windowed context compacts its stored rows as positions arrive (apply_window moves them
// down). Committed in many small chunks (many compactions) or in one (one compaction), a
// drafter whose configured window is 16 drafts exactly as one that keeps every row (its
// configured window is 512) and only looks at the last 16 (a per-sequence window): with
// F32 and with BF16 K/V.
TEST(SpecDrafterBatch, WindowCompactionKeepsTheVisibleRowsInBothKVTypes) {
  if (!std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped dspark";
  for (MatmulPrecision prec : {MatmulPrecision::F32, MatmulPrecision::Bf16Dot}) {
    PrecisionScope scope(prec);
    SCOPED_TRACE(matmul_precision_name(prec));
    auto target = load_model(kRoot + "/target");
    DrafterOptions small;
    small.window_size = 16;  // rows beyond the last 16 are dropped: the store compacts
    DrafterOptions large;
    large.window_size = 512;  // nothing is dropped for 211 positions
    auto compacting = load_drafter(kRoot + "/dspark", *target, small);
    auto keeping = load_drafter(kRoot + "/dspark", *target, large);
    EXPECT_EQ(keeps_bf16_kv(*compacting), prec == MatmulPrecision::Bf16Dot);
    const size_t feat = compacting->info().target_layer_ids.size() * static_cast<size_t>(target->config().hidden_size);
    const int n = 211;
    std::mt19937 gen(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<int32_t> toks(n);
    std::vector<float> rows(static_cast<size_t>(n) * feat);
    for (int32_t& t : toks) t = static_cast<int32_t>(gen() % 8000);
    for (float& x : rows) x = nd(gen);
    auto chunked = compacting->start();
    auto whole = compacting->start();
    auto reference = keeping->start();
    keeping->set_window(*reference, 16);
    int at = 0;
    for (int c : {3, 2, 7, 1, 30, 5, 1, 1, 20, 10, 64, 17, 50}) {
      compacting->commit_context(*chunked, toks.data() + at, rows.data() + static_cast<size_t>(at) * feat, c);
      at += c;
    }
    ASSERT_EQ(at, n);
    compacting->commit_context(*whole, toks.data(), rows.data(), n);
    keeping->commit_context(*reference, toks.data(), rows.data(), n);
    SamplingParams params;
    Rng ra(1), rb(1), rr(1);
    const DraftProposal pa = compacting->propose(*chunked, 42, 8, params, ra);
    const DraftProposal pb = compacting->propose(*whole, 42, 8, params, rb);
    const DraftProposal pr = keeping->propose(*reference, 42, 8, params, rr);
    EXPECT_EQ(pa.tokens, pr.tokens);
    EXPECT_EQ(pb.tokens, pr.tokens);
    EXPECT_TRUE(same_floats(pa.confidence_logits, pr.confidence_logits));
    EXPECT_TRUE(same_floats(pb.confidence_logits, pr.confidence_logits));
  }
}

TEST(SpecDrafterBatch, DSparkBatchEqualsSingleSampled) { check_drafter("dspark", true); }

// With a reduced draft vocabulary (spec/draft_vocab.h) every sequence drafts from the subset
// plus its own committed ids: a batch of sequences with different extras still gives each
// exactly what it gets alone. The ranking puts high ids first, so the random prompts' ids
// (below V - 8) mostly fall outside the 64-id subset and become extras.
TEST(SpecDrafterBatch, ReducedDraftVocabularyBatchEqualsSingle) {
  if (!std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped dspark";
  const std::string rank =
      (std::filesystem::temp_directory_path() / ("dsinfer_batch_rank_" + std::to_string(::getpid()) + ".json")).string();
  std::vector<uint64_t> counts(static_cast<size_t>(load_model_config(kRoot + "/target").vocab_size));
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = i + 1;
  write_draft_vocab(rank, rank_token_counts(counts));
  DrafterOptions o;
  o.draft_vocab_file = rank;
  o.draft_vocab_size = 64;
  check_drafter("dspark", false, o);
  check_drafter("dspark", true, o);
  check_drafter("dflash-zlab", true, o);
  std::filesystem::remove(rank);
}
TEST(SpecDrafterBatch, DFlashBatchEqualsSingleGreedy) { check_drafter("dflash", false); }
TEST(SpecDrafterBatch, ZlabDFlashBatchEqualsSingleSampled) { check_drafter("dflash-zlab", true); }

// The target as it is, minus the host weight views: a drafter bound to it keeps its own copies.
class WithoutHostWeights final : public Model {
 public:
  explicit WithoutHostWeights(Model& m) : m_(m) {}
  const ModelConfig& config() const override { return m_.config(); }
  std::unique_ptr<KVCache> make_kv_cache(int s, int t) const override { return m_.make_kv_cache(s, t); }
  void forward(KVCache& kv, const ForwardBatch& b, ForwardOutput& o) override { m_.forward(kv, b, o); }
  void embed(const int32_t* ids, int n, float* out) const override { m_.embed(ids, n, out); }
  void lm_head(const float* h, int n, float* l, bool norm) const override { m_.lm_head(h, n, l, norm); }

 private:
  Model& m_;
};

TEST(SpecDrafterBatch, DeepSpecDrafterUsesTheTargetsEmbeddingAndHeadWithSameDrafts) {
  if (!std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped dspark";
  auto target = load_model(kRoot + "/target");
  WithoutHostWeights plain(*target);
  auto shared = load_drafter(kRoot + "/dspark", *target);
  auto own = load_drafter(kRoot + "/dspark", plain);
  EXPECT_EQ(shared->info().shared_with_target, (std::vector<std::string>{"embed_tokens.weight", "lm_head.weight"}));
  EXPECT_TRUE(own->info().shared_with_target.empty());
  std::vector<int32_t> prompt;
  for (int t = 0; t < 40; ++t) prompt.push_back(static_cast<int32_t>((t * 131 + 7) % 8000));
  auto kv = target->make_kv_cache(1, 128);
  ForwardBatch b;
  b.capture_layers = shared->info().target_layer_ids;
  b.entries.push_back(ForwardEntry{0, prompt, {39}});
  ForwardOutput o;
  target->forward(*kv, b, o);
  for (bool sampled : {false, true}) {
    SamplingParams params;
    if (sampled) params.temperature = 0.8f;
    auto sa = shared->start();
    auto sb = own->start();
    shared->commit_context(*sa, prompt.data(), o.captured.data(), 40);
    own->commit_context(*sb, prompt.data(), o.captured.data(), 40);
    Rng ra(5), rb(5);
    const DraftProposal pa = shared->propose(*sa, prompt.back(), 8, params, ra);
    const DraftProposal pb = own->propose(*sb, prompt.back(), 8, params, rb);
    EXPECT_EQ(pa.tokens, pb.tokens);
    EXPECT_TRUE(same_floats(pa.q, pb.q));
    EXPECT_TRUE(same_floats(pa.confidence_logits, pb.confidence_logits));
  }
}

TEST(SpecDrafterBatch, SequenceNamedTwiceIsRefused) {
  if (!std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped dspark";
  auto target = load_model(kRoot + "/target");
  auto drafter = load_drafter(kRoot + "/dspark", *target);
  auto seq = drafter->start();
  SamplingParams params;
  Rng rng(1);
  std::vector<DraftBatchItem> items = {{seq.get(), 1, 2, &params, &rng}, {seq.get(), 1, 2, &params, &rng}};
  try {
    drafter->propose_batch(items);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same sequence"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsinfer
