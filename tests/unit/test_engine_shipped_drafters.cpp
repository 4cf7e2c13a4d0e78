// The shipped drafters (models/embedded/{dflash,dspark,dflash-zlab}, trained by tools/train/
// against models/embedded/target): on 20 held-out code prompts, greedy speculative decoding
// with each drafter reproduces plain greedy decoding token for token (with and without the
// calibrated DSpark validation threshold), and the DSpark drafter's mean accepted length τ
// stays above a floor. The floor is a property of these fixed weights and prompts (τ is
// deterministic: greedy, batch-invariant kernels), so it guards the training pipeline and
// the drafter code paths, not the machine's speed.
//
// Why these floors: measured with this test's settings (20 prompts of models/eval/
// heldout_code.jsonl, whole prompt, 128 new tokens, block 8) on the shipped set, every
// drafter drafting from the shipped reduced vocabulary (models/embedded/target/
// draft_vocab.json: the 256 most frequent ids + each sequence's own, spec/draft_vocab.h):
// DSpark mean τ 4.05, DFlash 3.42 (ratio 1.18), z-lab DFlash 1.67, DSpark with threshold 0.3
// 3.57, DSpark with the prefix scheduler 3.85 (4.47 drafts verified per round; the test prints
// them). With the whole vocabulary they were 3.88, 3.27, 1.62, 3.41 and 3.74
// (MODEL_CARD.md has the 256-token table). The floors sit ~10% under those figures: a
// DSpark τ under 3.5, or DSpark no longer beating DFlash by 10%, means the drafter or its
// loading/forward broke (a few argmax flips from a different ISA path move τ by < 1%).
// The tests above run in f32 matmul precision (F32 K/V); Bf16PrecisionIsLossless repeats
// the DSpark and DFlash checks in the CLI's default bf16 precision (BF16 K/V, vdpbf16ps
// attention scores) on the first 8 prompts, against plain greedy decoding in that precision.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "kernels/cpu/matmul.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "spec/prefix_scheduler.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;

namespace {

const std::string kRoot = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";

struct Shipped {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerationResult> plain;
};

constexpr int kPrompts = 20;
constexpr int kNewTokens = 128;

Shipped& shipped() {
  static Shipped s = [] {
    Shipped r;
    r.model = load_model(kRoot + "/target");
    r.tok = Tokenizer::load(kRoot + "/target");
    std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/models/eval/heldout_code.jsonl");
    for (std::string line; std::getline(in, line) && static_cast<int>(r.prompts.size()) < kPrompts;)
      r.prompts.push_back(r.tok->encode(nlohmann::json::parse(line).at("prompt").get<std::string>(), false));
    StopConditions stop;
    stop.max_tokens = kNewTokens;
    for (const auto& p : r.prompts) r.plain.push_back(generate(*r.model, r.tok.get(), p, SamplingParams{}, stop));
    return r;
  }();
  return s;
}

bool have(const std::string& sub) { return std::filesystem::exists(kRoot + "/" + sub + "/model.safetensors"); }

// Runs every prompt with `drafter`; checks ids == plain; returns the mean τ over prompts.
double lossless_tau(const Drafter& drafter, const Calibration* cal, float threshold, const SpsTable* sps = nullptr,
                    double* mean_verify = nullptr, int* lookup_rounds = nullptr) {
  Shipped& s = shipped();
  EXPECT_EQ(static_cast<int>(s.prompts.size()), kPrompts);
  SpecOptions so;
  so.drafter = &drafter;
  so.calibration = cal;
  so.validation_threshold = threshold;
  so.sps = sps;
  so.lookup_assist = lookup_rounds != nullptr;
  StopConditions stop;
  stop.max_tokens = kNewTokens;
  double tau_sum = 0;
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    auto spec = generate(*s.model, s.tok.get(), s.prompts[i], SamplingParams{}, stop, {}, so);
    EXPECT_EQ(spec.ids, s.plain[i].ids) << "prompt " << i;
    EXPECT_EQ(spec.text, s.plain[i].text) << "prompt " << i;
    tau_sum += spec.spec.tau();
    if (lookup_rounds) *lookup_rounds += spec.spec.lookup_rounds;
    if (mean_verify) {
      int64_t v = 0;
      for (auto p : spec.spec.proposed) v += p;
      *mean_verify += static_cast<double>(v) / spec.spec.rounds / static_cast<double>(s.prompts.size());
    }
  }
  return tau_sum / static_cast<double>(s.prompts.size());
}

double g_tau_dflash = 0, g_tau_dspark = 0;

}  // namespace

TEST(ShippedDrafters, DFlashIsLosslessOnHeldOutCode) {
  if (!have("target") || !have("dflash")) GTEST_SKIP() << "shipped DFlash absent";
  auto d = load_drafter(kRoot + "/dflash", *shipped().model);
  EXPECT_EQ(d->info().block_size, 8);
  g_tau_dflash = lossless_tau(*d, nullptr, 0.0f);
  std::printf("DFlash mean tau %.3f over %d prompts\n", g_tau_dflash, kPrompts);
  EXPECT_GT(g_tau_dflash, 2.9);
}

TEST(ShippedDrafters, ZlabDFlashIsLosslessOnHeldOutCode) {
  if (!have("target") || !have("dflash-zlab")) GTEST_SKIP() << "shipped z-lab DFlash absent";
  auto d = load_drafter(kRoot + "/dflash-zlab", *shipped().model);
  const double tau = lossless_tau(*d, nullptr, 0.0f);
  std::printf("z-lab DFlash mean tau %.3f over %d prompts\n", tau, kPrompts);
  EXPECT_GT(tau, 1.45);
}

TEST(ShippedDrafters, DSparkIsLosslessAndAboveItsTauFloor) {
  if (!have("target") || !have("dspark")) GTEST_SKIP() << "shipped DSpark absent";
  auto d = load_drafter(kRoot + "/dspark", *shipped().model);
  ASSERT_TRUE(d->info().confidence_head);
  EXPECT_EQ(d->info().draft_vocab, 256) << "the shipped ranking's default_size";
  g_tau_dspark = lossless_tau(*d, nullptr, 0.0f);
  std::printf("DSpark mean tau %.3f over %d prompts\n", g_tau_dspark, kPrompts);
  EXPECT_GE(g_tau_dspark, 3.5);
  if (g_tau_dflash > 0) {
    EXPECT_GE(g_tau_dspark, 1.10 * g_tau_dflash) << "DFlash tau " << g_tau_dflash;
  }

  // With the shipped STS calibration and a validation threshold, fewer drafts are
  // verified but the output is still exactly plain greedy.
  auto cal = load_calibration(kRoot + "/dspark");
  ASSERT_TRUE(cal.has_value()) << "models/embedded/dspark/calibration.json missing";
  const double tau_thr = lossless_tau(*d, &*cal, 0.3f);
  std::printf("DSpark (threshold 0.3) mean tau %.3f\n", tau_thr);
  EXPECT_LE(tau_thr, g_tau_dspark + 1e-9);
  EXPECT_GT(tau_thr, 3.0);

  // The DSpark prefix scheduler (Algorithm 1, R = 1) on a fixed SPS(B) curve shaped like
  // this CPU's (step time affine in B, a 9-token verify ~35% slower than a 1-token one):
  // it verifies fewer drafts than the full block, and the output is still plain greedy.
  std::vector<SpsPoint> pts;
  for (int b = 1; b <= 9; ++b) pts.push_back({b, 1000.0 / (2.8 + 0.12 * b)});
  const SpsTable sps(pts);
  double verified = 0;
  const double tau_sched = lossless_tau(*d, &*cal, 0.0f, &sps, &verified);
  std::printf("DSpark (dspark schedule) mean tau %.3f, mean drafts verified %.2f\n", tau_sched, verified);
  EXPECT_LT(verified, 7.9);
  EXPECT_GT(tau_sched, 3.0);
}

TEST(ShippedDrafters, Bf16PrecisionIsLossless) {
  if (!have("target") || !have("dspark") || !have("dflash")) GTEST_SKIP() << "shipped drafters absent";
  Shipped& s = shipped();  // (its plain outputs are f32-precision ones; not used here)
  const MatmulPrecision saved = matmul_precision();
  set_matmul_precision(MatmulPrecision::Bf16Dot);
  ASSERT_EQ(s.model->kv_dtype(), DType::BF16);
  StopConditions stop;
  stop.max_tokens = kNewTokens;
  for (const char* name : {"dspark", "dflash"}) {
    auto d = load_drafter(kRoot + "/" + name, *s.model);
    SpecOptions so;
    so.drafter = d.get();
    double tau = 0;
    for (size_t i = 0; i < 8; ++i) {
      const auto plain = generate(*s.model, s.tok.get(), s.prompts[i], SamplingParams{}, stop);
      const auto spec = generate(*s.model, s.tok.get(), s.prompts[i], SamplingParams{}, stop, {}, so);
      EXPECT_EQ(spec.ids, plain.ids) << name << " prompt " << i;
      tau += spec.spec.tau() / 8.0;
    }
    std::printf("%s mean tau %.3f over 8 prompts in bf16 precision\n", name, tau);
    EXPECT_GT(tau, 2.5) << name;
  }
  set_matmul_precision(saved);
}

// The lookup assist (spec/lookup_assist.h) next to the DSpark drafter: rounds whose suffix
// recurs verify the lookup's continuation instead of a drafter pass. Which rounds do depends
// on measured costs, so only what holds whatever the timing is asserted: the output is
// still plain greedy, and on these prompts (code, where this small target's greedy output
// repeats itself) some rounds take the lookup.
TEST(ShippedDrafters, DSparkWithLookupAssistIsLossless) {
  if (!have("target") || !have("dspark")) GTEST_SKIP() << "shipped DSpark absent";
  auto d = load_drafter(kRoot + "/dspark", *shipped().model);
  auto cal = load_calibration(kRoot + "/dspark");
  ASSERT_TRUE(cal.has_value());
  int lookup_rounds = 0;
  const double tau = lossless_tau(*d, &*cal, 0.0f, nullptr, nullptr, &lookup_rounds);
  std::printf("DSpark + lookup assist mean tau %.3f, %d lookup rounds\n", tau, lookup_rounds);
  EXPECT_GT(lookup_rounds, 0);
}
