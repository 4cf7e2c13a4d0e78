// Golden tests of the DFlash / DeepSpec DFlash / DSpark drafters against an independent
// PyTorch reference (tests/data/drafters/<case>/: target/ = HF Qwen3 dir, draft/ = the draft
// checkpoint, golden.json = the recorded greedy rounds, golden_tensors.safetensors = the
// per-round intermediates).
//
// Data flow per case: load target + drafter → prefill the prompt capturing the drafter's
// target_layer_ids (compared with `context_features`) → commit the prompt context → anchor =
// target greedy token → for every recorded round: propose_debug (full block, greedy) and
// compare ids exactly and backbone_out / base_logits / markov_bias / draft_logits /
// confidence_logits / draft_logprobs within |a−b| ≤ 1e-4·max(1, max|ref| of the row) →
// verify [anchor, drafts] with the target (capturing layers) → accepted prefix (golden
// `committed` = accepted drafts + bonus) → commit anchor + accepted drafts with their
// captured features → truncate the target KV cache to start + acc + 1 → the bonus becomes
// the next anchor. Cases that are absent are skipped with a message. The environment
// variable DSINFER_DRAFTER_GOLDENS=DIR replays the cases of another directory instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "sampling/sampler.h"
#include "spec/dflash_backbone.h"
#include "spec/drafter_loader.h"

using namespace dsinfer;
using json = nlohmann::json;

namespace {

const std::string kDir = std::getenv("DSINFER_DRAFTER_GOLDENS") ? std::getenv("DSINFER_DRAFTER_GOLDENS")
                                                                 : std::string(DSINFER_TEST_DATA) + "/drafters";

struct Tensors {
  std::unique_ptr<SafetensorsFile> file;
  const SafetensorsTensor* find(const std::string& name) const {
    for (const auto& t : file->header().tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  std::vector<float> get(const SafetensorsTensor& t) const {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = load_as_f32(file->tensor_data(t), t.dtype, i);
    return v;
  }
};

// |a − b| ≤ 1e-4 · max(1, max|ref| of the row); rows of `row_len` elements.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, size_t row_len, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what << ": size";
  if (row_len == 0) row_len = 1;
  int reported = 0;
  for (size_t r = 0; r * row_len < ref.size(); ++r) {
    double mx = 1.0;
    for (size_t i = 0; i < row_len; ++i) mx = std::max(mx, std::abs(static_cast<double>(ref[r * row_len + i])));
    for (size_t i = 0; i < row_len; ++i) {
      const double a = got[r * row_len + i], b = ref[r * row_len + i];
      if (!(std::abs(a - b) <= 1e-4 * mx) && reported++ < 5)
        ADD_FAILURE() << what << " row " << r << " col " << i << ": got " << a << " ref " << b << " (tol " << 1e-4 * mx << ")";
    }
  }
}

std::vector<int32_t> ints(const json& j) {
  std::vector<int32_t> v;
  for (const auto& e : j) v.push_back(e.get<int32_t>());
  return v;
}
std::vector<float> floats(const json& j) {
  std::vector<float> v;
  for (const auto& e : j) v.push_back(e.get<float>());
  return v;
}

void run_case(const std::string& name) {
  const std::string dir = kDir + "/" + name;
  const json g = json::parse(read_text_file(dir + "/golden.json"));
  Tensors T{std::make_unique<SafetensorsFile>(dir + "/golden_tensors.safetensors")};
  auto target = load_model(dir + "/target");
  auto drafter = load_drafter(dir + "/draft", *target, {});
  auto* block = dynamic_cast<BlockDrafter*>(drafter.get());
  ASSERT_NE(block, nullptr);
  const DrafterInfo& info = drafter->info();
  const std::string dialect = g.at("dialect").get<std::string>();
  EXPECT_EQ(dialect == "zlab", info.kind == "dflash") << "dialect " << dialect << " vs kind " << info.kind;
  EXPECT_EQ(info.block_size, g.at("block_size").get<int>());
  EXPECT_EQ(info.mask_token_id, g.at("mask_token_id").get<int32_t>());
  const std::vector<int32_t> ref_ids = ints(g.at("target_layer_ids"));
  EXPECT_EQ(info.target_layer_ids, std::vector<int>(ref_ids.begin(), ref_ids.end()));

  const std::vector<int32_t> prompt = ints(g.at("prompt"));
  const json& rounds = g.at("rounds");
  const int bs = info.block_size;
  const int V = target->config().vocab_size, H = target->config().hidden_size;
  auto kv = target->make_kv_cache(1, static_cast<int>(prompt.size()) + static_cast<int>(rounds.size()) * (bs + 1) + 8);

  // Prefill, capturing the drafter's layers.
  ForwardOutput out;
  ForwardBatch pb;
  pb.capture_layers = info.target_layer_ids;
  pb.entries.push_back({0, prompt, {static_cast<int>(prompt.size()) - 1}});
  target->forward(*kv, pb, out);
  const size_t feat_w = info.target_layer_ids.size() * static_cast<size_t>(H);
  const auto* cf = T.find("context_features");
  ASSERT_NE(cf, nullptr) << "golden tensor context_features missing";
  expect_close(out.captured, T.get(*cf), feat_w, "context_features");
  auto seq = drafter->start();
  drafter->commit_context(*seq, prompt.data(), out.captured.data(), static_cast<int>(prompt.size()));
  int32_t anchor = argmax(out.logits.data(), V);

  std::vector<int32_t> generated;
  Rng rng(0);
  for (size_t i = 0; i < rounds.size(); ++i) {
    const json& R = rounds[i];
    const std::string pre = "round" + std::to_string(i) + ".";
    SCOPED_TRACE(name + " round " + std::to_string(i));
    const int start = seq->context_length();
    ASSERT_EQ(start, R.at("start").get<int>());
    ASSERT_EQ(anchor, R.at("anchor").get<int32_t>());
    DraftDebug dbg;
    DraftProposal p = block->propose_debug(*seq, anchor, SamplingParams{}, rng, dbg);
    const size_t n = p.tokens.size();

    for (const char* req : {"backbone_out", "base_logits", "draft_logits"})
      ASSERT_NE(T.find(pre + req), nullptr) << "golden tensor " << pre << req << " missing";
    if (const auto* t = T.find(pre + "backbone_out")) expect_close(dbg.backbone_out, T.get(*t), H, pre + "backbone_out");
    if (const auto* t = T.find(pre + "base_logits")) expect_close(dbg.base_logits, T.get(*t), V, pre + "base_logits");
    if (const auto* t = T.find(pre + "markov_bias")) expect_close(dbg.markov_bias, T.get(*t), V, pre + "markov_bias");
    else EXPECT_TRUE(dbg.markov_bias.empty()) << "drafter has a Markov head the golden lacks";
    if (const auto* t = T.find(pre + "draft_logits")) expect_close(dbg.draft_logits, T.get(*t), V, pre + "draft_logits");
    if (const auto* t = T.find(pre + "confidence_logits"))
      expect_close(dbg.confidence_logits, T.get(*t), 1, pre + "confidence_logits");
    else EXPECT_TRUE(dbg.confidence_logits.empty()) << "drafter has a confidence head the golden lacks";
    ASSERT_EQ(p.tokens, ints(R.at("draft_ids"))) << "draft ids";
    if (R.contains("draft_logprobs") && !R.at("draft_logprobs").is_null())
      expect_close(dbg.draft_logprobs, floats(R.at("draft_logprobs")), 1, pre + "draft_logprobs");
    if (R.contains("confidence") && !R.at("confidence").is_null())
      expect_close(p.confidence, floats(R.at("confidence")), 1, pre + "confidence");

    // Verify the full block with the target, capturing the drafter's layers.
    ForwardBatch vb;
    vb.capture_layers = info.target_layer_ids;
    ForwardEntry e{0, {anchor}, {}};
    e.tokens.insert(e.tokens.end(), p.tokens.begin(), p.tokens.end());
    for (size_t r = 0; r < e.tokens.size(); ++r) e.logit_rows.push_back(static_cast<int>(r));
    vb.entries.push_back(e);
    target->forward(*kv, vb, out);
    std::vector<int32_t> tg;
    for (size_t r = 0; r < e.tokens.size(); ++r) tg.push_back(argmax(out.logits.data() + r * V, V));
    const std::vector<int32_t> ref_tg = ints(R.at("target_greedy"));
    ASSERT_LE(ref_tg.size(), tg.size());
    EXPECT_EQ(std::vector<int32_t>(tg.begin(), tg.begin() + ref_tg.size()), ref_tg) << "target greedy";
    size_t acc = 0;
    while (acc < n && p.tokens[acc] == tg[acc]) ++acc;
    ASSERT_EQ(static_cast<int>(acc), R.at("accepted").get<int>());
    // Positions whose features enter the draft context: the anchor + the accepted drafts.
    std::vector<int32_t> committed(e.tokens.begin(), e.tokens.begin() + acc + 1);
    // The golden records the tokens this round appends to the output: the accepted drafts
    // + the bonus (older format: anchor + accepted drafts). Either must match.
    std::vector<int32_t> appended(p.tokens.begin(), p.tokens.begin() + acc);
    appended.push_back(tg[acc]);
    const std::vector<int32_t> ref_committed = ints(R.at("committed"));
    ASSERT_TRUE(ref_committed == appended || ref_committed == committed) << "committed tokens differ";
    drafter->commit_context(*seq, committed.data(), out.captured.data(), static_cast<int>(acc + 1));
    kv->truncate(0, start + static_cast<int>(acc) + 1);
    generated.insert(generated.end(), committed.begin(), committed.end());
    anchor = tg[acc];
  }
  generated.push_back(anchor);

  // greedy_output: the generated tokens (optionally preceded by the prompt).
  if (g.contains("greedy_output")) {
    std::vector<int32_t> ref = ints(g.at("greedy_output"));
    if (ref.size() > prompt.size() && std::equal(prompt.begin(), prompt.end(), ref.begin()))
      ref.erase(ref.begin(), ref.begin() + static_cast<long>(prompt.size()));
    const size_t k = std::min(ref.size(), generated.size());
    EXPECT_EQ(std::vector<int32_t>(generated.begin(), generated.begin() + k), std::vector<int32_t>(ref.begin(), ref.begin() + k))
        << "greedy output";
  }
}

class DrafterGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(DrafterGolden, Replay) {
  const std::string name = GetParam();
  if (!std::filesystem::exists(kDir + "/" + name + "/golden.json"))
    GTEST_SKIP() << "no golden case tests/data/drafters/" << name << " (produced by the PyTorch reference; not present yet)";
  run_case(name);
}

INSTANTIATE_TEST_SUITE_P(Cases, DrafterGolden,
                         ::testing::Values("zlab_dflash", "zlab_dflash_default_layers", "deepspec_dflash", "dspark_vanilla",
                                           "dspark_gated", "dspark_rnn"));

}  // namespace
