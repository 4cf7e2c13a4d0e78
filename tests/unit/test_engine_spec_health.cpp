// Per-request speculation health (engine/spec_health.h) and the per-sequence drafter window
// it drives (Drafter::set_window):
//   - self-healing: five consecutive collapsed rounds fall back, the pause counts down and
//     doubles on repeated collapses, a healthy round resets the back-off, rounds without
//     drafts carry no evidence;
//   - dynamic window: high acceptance shrinks towards the minimum, low acceptance grows
//     back to the maximum, never outside the bounds; option errors name the flag;
//   - set_window(w) on a drafter loaded without a window proposes exactly what a drafter
//     loaded with --dflash-window-size w proposes, and growing it back restores the
//     unwindowed proposals (every row stays stored when no window is configured);
//   - in the engine: synthetic acceptance accepts position 1 at its rate (benchmark mode),
//     and a request whose drafts are never accepted falls back (counted) and drafts less.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "cli_helpers.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/spec_health.h"
#include "model/model.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"

namespace dsinfer {
namespace {

TEST(SpecHealth, FiveCollapsedRoundsFallBackAndThePauseBacksOff) {
  SpecHealthOptions o;
  o.reprobe_steps = 3;
  o.max_reprobe_steps = 6;
  SpecHealth h(o);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.observe(8, 0), HealthEvent::None);
  EXPECT_TRUE(h.drafting_allowed());
  EXPECT_EQ(h.observe(8, 0), HealthEvent::FellBack);
  EXPECT_FALSE(h.drafting_allowed());
  EXPECT_EQ(h.fallbacks(), 1u);
  EXPECT_EQ(h.tick(), HealthEvent::None);
  EXPECT_EQ(h.tick(), HealthEvent::None);
  EXPECT_EQ(h.tick(), HealthEvent::Resumed);
  EXPECT_TRUE(h.drafting_allowed());
  // Collapsing again right away: the pause doubles (3 -> 6), capped at 6 afterwards.
  for (int i = 0; i < 5; ++i) h.observe(4, 0);
  int steps = 0;
  while (!h.drafting_allowed()) h.tick(), ++steps;
  EXPECT_EQ(steps, 6);
  for (int i = 0; i < 5; ++i) h.observe(4, 0);
  steps = 0;
  while (!h.drafting_allowed()) h.tick(), ++steps;
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(h.fallbacks(), 3u);
  // A healthy round resets both the streak and the back-off.
  EXPECT_EQ(h.observe(8, 3), HealthEvent::None);
  for (int i = 0; i < 4; ++i) h.observe(8, 0);
  EXPECT_EQ(h.observe(8, 1), HealthEvent::None);  // streak broken at 4
  for (int i = 0; i < 5; ++i) h.observe(8, 0);
  steps = 0;
  while (!h.drafting_allowed()) h.tick(), ++steps;
  EXPECT_EQ(steps, 3);
}

TEST(SpecHealth, RoundsWithoutDraftsCarryNoEvidence) {
  SpecHealth h;
  for (int i = 0; i < 4; ++i) h.observe(8, 0);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(h.observe(0, 0), HealthEvent::None);
  EXPECT_EQ(h.observe(8, 0), HealthEvent::FellBack);
}

TEST(SpecHealth, SelfHealingCanBeTurnedOff) {
  SpecHealthOptions o;
  o.collapse_rounds = 0;
  SpecHealth h(o);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(h.observe(8, 0), HealthEvent::None);
  EXPECT_TRUE(h.drafting_allowed());
}

TEST(SpecHealth, WindowFollowsAcceptanceWithinBounds) {
  SpecHealthOptions o;
  o.min_window = 64;
  o.max_window = 1024;
  SpecHealth h(o);
  EXPECT_EQ(h.window(), 1024);
  for (int i = 0; i < 20; ++i) {
    h.observe(8, 8);
    EXPECT_GE(h.window(), 64);
  }
  EXPECT_EQ(h.window(), 64);
  for (int i = 0; i < 20; ++i) {
    h.observe(8, 1);
    EXPECT_LE(h.window(), 1024);
  }
  EXPECT_EQ(h.window(), 1024);
  SpecHealth off;
  off.observe(8, 8);
  EXPECT_EQ(off.window(), 0);
}

TEST(SpecHealth, InconsistentOptionsNameTheFlag) {
  SpecHealthOptions o;
  o.min_window = 512;
  o.max_window = 128;
  try {
    SpecHealth h(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dspark-dsw-min-window"), std::string::npos) << e.what();
  }
  o.min_window = 0;
  EXPECT_THROW(SpecHealth{o}, Error);
}

TEST(SpecHealth, SetWindowEqualsALoadTimeWindowAndGrowsBack) {
  const std::string root = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";
  if (!std::filesystem::exists(root + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped drafter";
  auto target = load_model(root + "/target");
  auto unbounded = load_drafter(root + "/dspark", *target);
  DrafterOptions w64;
  w64.window_size = 64;
  auto windowed = load_drafter(root + "/dspark", *target, w64);
  ASSERT_TRUE(unbounded->supports_window());
  const int V = target->config().vocab_size;
  std::mt19937 gen(3);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 200; ++i) prompt.push_back(static_cast<int32_t>(gen() % (V - 8)));
  auto kv = target->make_kv_cache(1, 256);
  ForwardBatch b;
  b.capture_layers = unbounded->info().target_layer_ids;
  b.entries.push_back(ForwardEntry{0, prompt, {199}});
  ForwardOutput o;
  target->forward(*kv, b, o);
  auto sa = unbounded->start(), sb = windowed->start(), sc = unbounded->start();
  for (auto* p : {&sa, &sc}) unbounded->commit_context(**p, prompt.data(), o.captured.data(), 200);
  windowed->commit_context(*sb, prompt.data(), o.captured.data(), 200);
  SamplingParams greedy;
  Rng r1(1), r2(1), r3(1);
  unbounded->set_window(*sa, 64);
  const DraftProposal pa = unbounded->propose(*sa, 17, 8, greedy, r1);
  const DraftProposal pb = windowed->propose(*sb, 17, 8, greedy, r2);
  EXPECT_EQ(pa.tokens, pb.tokens);
  EXPECT_EQ(pa.confidence_logits, pb.confidence_logits);
  unbounded->set_window(*sa, 0);  // back to the whole context
  const DraftProposal pa2 = unbounded->propose(*sa, 17, 8, greedy, r1);
  const DraftProposal pc = unbounded->propose(*sc, 17, 8, greedy, r3);
  EXPECT_EQ(pa2.tokens, pc.tokens);
  EXPECT_EQ(pa2.confidence_logits, pc.confidence_logits);
  EXPECT_NE(pa.confidence_logits, pc.confidence_logits);  // the window did change the input
}


struct EngineRun {
  EngineStats stats;
  uint64_t proposed1 = 0, accepted1 = 0;  // draft position 1 over all requests
};

EngineRun run_engine(const EngineOptions& base, Model& model, int requests, int max_tokens) {
  LLMEngine engine(model, base);
  EngineRun out;
  std::mt19937 gen(9);
  const int V = model.config().vocab_size;
  for (int i = 0; i < requests; ++i) {
    EngineRequest req;
    for (int t = 0; t < 20 + i; ++t) req.prompt.push_back(static_cast<int32_t>(gen() % (V - 8)));
    req.stop.max_tokens = max_tokens;
    req.on_event = [&out](const RequestEvent& ev) {
      if (!ev.finished) return;
      if (!ev.spec.proposed.empty()) {
        out.proposed1 += ev.spec.proposed[0];
        out.accepted1 += ev.spec.accepted[0];
      }
    };
    engine.submit(std::move(req));
  }
  engine.run_until_idle();
  out.stats = engine.stats();
  return out;
}

TEST(SpecHealth, EngineSyntheticAcceptanceFollowsItsRate) {
  const std::string root = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";
  if (!std::filesystem::exists(root + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped drafter";
  auto target = load_model(root + "/target");
  auto drafter = load_drafter(root + "/dspark", *target);
  EngineOptions o;
  o.max_running = 8;
  o.drafter = drafter.get();
  o.synthetic_acceptance_rate = 0.5;
  o.health.collapse_rounds = 0;
  const EngineRun r = run_engine(o, *target, 16, 40);
  ASSERT_GT(r.proposed1, 200u);
  const double rate = static_cast<double>(r.accepted1) / static_cast<double>(r.proposed1);
  EXPECT_NEAR(rate, 0.5, 0.12) << r.accepted1 << "/" << r.proposed1;  // > 4 sigma
  // Out of range values are refused with the flag's name.
  o.synthetic_acceptance_rate = 1.5;
  try {
    LLMEngine bad(*target, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--synthetic-acceptance-rate"), std::string::npos);
  }
}

TEST(SpecHealth, EngineFallsBackWhenNothingIsAccepted) {
  const std::string root = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";
  if (!std::filesystem::exists(root + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped drafter";
  auto target = load_model(root + "/target");
  auto drafter = load_drafter(root + "/dspark", *target);
  EngineOptions o;
  o.max_running = 4;
  o.drafter = drafter.get();
  o.synthetic_acceptance_rate = 1e-12;  // no draft is ever accepted
  o.health.collapse_rounds = 0;
  const EngineRun off = run_engine(o, *target, 4, 60);
  EXPECT_EQ(off.stats.self_heal_fallbacks, 0u);
  o.health.collapse_rounds = 5;
  o.health.reprobe_steps = 16;
  const EngineRun on = run_engine(o, *target, 4, 60);
  EXPECT_GE(on.stats.self_heal_fallbacks, 4u);  // every request collapsed at least once
  EXPECT_LT(on.stats.drafted_tokens * 2, off.stats.drafted_tokens);  // most steps did not draft
  EXPECT_EQ(on.stats.generated_tokens, off.stats.generated_tokens);  // and every request finished
}


TEST(SpecHealth, ServerRefusesSyntheticAcceptanceAndBenchEngineLabelsIt) {
  const auto r = dsinfer_test::run_dsinfer({"serve", "--synthetic-acceptance-rate", "0.5"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--synthetic-acceptance-rate"), std::string::npos) << r.err;
  const std::string root = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";
  if (!std::filesystem::exists(root + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped drafter";
  const auto b = dsinfer_test::run_dsinfer({"bench-engine", "--model-path", root + "/target", "--draft-model-path",
                                             root + "/dspark", "--prompts", std::string(DSINFER_SOURCE_DIR) + "/models/eval/heldout_code.jsonl",
                                             "--concurrency", "2", "--policies", "fixed", "--max-tokens", "8",
                                             "--prompt-tokens", "32", "--rounds-per-slot", "1", "--threads", "1",
                                             "--synthetic-acceptance-rate", "0.5"});
  EXPECT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.out.find("SYNTHETIC ACCEPTANCE"), std::string::npos) << b.out;
}

}  // namespace
}  // namespace dsinfer
