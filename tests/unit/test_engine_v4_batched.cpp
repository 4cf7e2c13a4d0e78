// Engine floor: DeepSeek-V4 targets in the batched engine (LLMEngine, so bench-engine and
// serve too), whose decoding state is kept per sequence (model/slot_state_paged_cache.h).
//
// The targets are committed tiny V4 checkpoints (tests/data/deepseek_v4/: sliding, CSA and
// HCA layers, hash and learned MoE, mHC; the Flash layer schedule with compress rate 128),
// with the random mtp.* DSpark stages of v4_dspark_test_util.h added at test time. Checked:
//   - many concurrent requests of random prompt and output lengths give exactly their
//     single-request plain greedy outputs: plain decoding, a pool so small that requests
//     are preempted and recomputed, the DSpark drafter under the fixed, threshold, dspark
//     and dspark-async policies and with async prefetch (drafts accepted and rejected, so
//     every sequence's window, compressor and indexer state is rolled back in the batch);
//   - the pool is sized from the model's state shape (per-token rate, bounded part per
//     sequence), the pool keeps no prefix cache (identical prompts are recomputed), and
//     what needs one (cache warm-up, defrag) is refused by flag name;
//   - the storage refuses a table longer than the state it holds and block copies;
//   - the SPS profile steps past the state's rollback range (serve's start-up profile).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>

#include "core/error.h"
#include "engine/generator.h"
#include "engine/llm_engine.h"
#include "engine/sps_profile.h"
#include "error_test_util.h"
#include "model/block_kv_cache.h"
#include "model/deepseek_v4.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "spec/prefix_scheduler.h"
#include "v4_dspark_test_util.h"

using namespace dsinfer;
namespace fs = std::filesystem;
using test::error_of;

namespace {

using Scratch = test::ScratchDir;

struct Case {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  std::vector<int32_t> plain;  // single-request plain greedy output
};

// A V4 target (with its DSpark stages: a Markov head set to the target's own greedy
// bigrams, so drafts are often right and sometimes wrong) and requests with their plain
// greedy outputs. Prompts of 1..max_prompt tokens, 4..max_new new tokens each.
struct V4Setup {
  Scratch dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<Drafter> drafter;
  std::vector<Case> cases;
  V4Setup(const std::string& base, int n_cases, int max_prompt, int max_new) {
    test::TinyDSparkSpec sp;
    sp.base = base;
    {
      // Plain outputs and bigrams from the target alone (the stages do not change it).
      Scratch first;
      test::write_tiny_v4_dspark(sp, first.path);
      auto target = load_model(first.path);
      const int V = target->config().vocab_size;
      std::mt19937 rng(13);
      std::map<int32_t, int32_t> bigram;
      for (int i = 0; i < n_cases; ++i) {
        Case c;
        c.prompt.resize(1 + rng() % static_cast<unsigned>(max_prompt));
        for (auto& t : c.prompt) t = static_cast<int32_t>(3 + rng() % static_cast<unsigned>(V - 3));
        c.max_tokens = 4 + static_cast<int>(rng() % static_cast<unsigned>(max_new - 3));
        StopConditions stop;
        stop.max_tokens = c.max_tokens;
        c.plain = generate(*target, nullptr, c.prompt, SamplingParams{}, stop).ids;
        int32_t prev = c.prompt.back();
        for (int32_t t : c.plain) bigram.emplace(prev, t), prev = t;
        cases.push_back(std::move(c));
      }
      sp.bigram = bigram;
      sp.markov_rank = static_cast<int>(bigram.size());
    }
    test::write_tiny_v4_dspark(sp, dir.path);
    model = load_model(dir.path);
    drafter = load_drafter(dir.path, *model);
  }
};

V4Setup& mixed() {
  static V4Setup s("mixed4_f32", 24, 60, 40);
  return s;
}

// Submits every case at once, runs the engine to idle, checks each output == plain.
EngineStats expect_lossless(V4Setup& s, const EngineOptions& opts, const std::string& what) {
  LLMEngine engine(*s.model, opts);
  std::map<uint64_t, std::vector<int32_t>> got;
  std::map<uint64_t, std::string> reason, error;
  std::map<uint64_t, size_t> case_of;
  for (size_t i = 0; i < s.cases.size(); ++i) {
    EngineRequest req;
    req.prompt = s.cases[i].prompt;
    req.stop.max_tokens = s.cases[i].max_tokens;
    req.on_event = [&](const RequestEvent& ev) {
      auto& v = got[ev.id];
      v.insert(v.end(), ev.new_ids.begin(), ev.new_ids.end());
      if (ev.finished) reason[ev.id] = ev.finish_reason, error[ev.id] = ev.error;
    };
    case_of[engine.submit(std::move(req))] = i;
  }
  engine.run_until_idle();
  EXPECT_EQ(reason.size(), s.cases.size()) << what;
  for (const auto& [id, i] : case_of) {
    EXPECT_EQ(reason[id], "length") << what << ": request " << i << ": " << error[id];
    EXPECT_EQ(got[id], s.cases[i].plain) << what << ": request " << i;
  }
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.requests_finished, s.cases.size()) << what;
  EXPECT_EQ(st.requests_failed, 0u) << what;
  return st;
}

SpsTable linear_sps(double base_ms, double per_token_ms) {
  std::vector<SpsPoint> pts;
  for (int b : {1, 16, 64, 256}) pts.push_back({b, 1000.0 / (base_ms + per_token_ms * b)});
  return SpsTable(pts);
}

}  // namespace

TEST(V4Engine, PlainBatchedEqualsSingleRequestGreedy) {
  V4Setup& s = mixed();
  EngineOptions o;
  o.max_running = 8;
  o.max_batch_tokens = 64;  // long prompts arrive in chunks beside decode rows
  o.max_model_len = 128;
  const EngineStats st = expect_lossless(s, o, "plain");
  EXPECT_EQ(st.preemptions, 0u);
}

TEST(V4Engine, PreemptedRequestsAreRecomputedExactly) {
  // A pool of a few blocks for 8 running requests: requests are preempted (their state
  // cleared with the unbind), requeued and recomputed from prompt + emitted tokens, often
  // into a slot another request used before.
  V4Setup& s = mixed();
  EngineOptions o;
  o.max_running = 8;
  o.max_batch_tokens = 64;
  o.max_model_len = 128;
  o.kv_block_size = 4;
  o.kv_num_blocks = 40;  // one request of up to 100 tokens fits alone, not 8 at once
  o.shard_count = 1;
  const EngineStats st = expect_lossless(s, o, "preempting");
  EXPECT_GT(st.preemptions, 0u);
}

TEST(V4Engine, DSparkDrafterIsLosslessUnderEveryPolicy) {
  V4Setup& s = mixed();
  EngineOptions o;
  o.max_running = 8;
  o.max_batch_tokens = 96;
  o.max_model_len = 128;
  o.drafter = s.drafter.get();
  const EngineStats fixed = expect_lossless(s, o, "dspark fixed");
  EXPECT_GT(fixed.accepted_draft_tokens, 20u) << "the bigram head should get drafts accepted";
  EXPECT_GT(fixed.verified_draft_tokens, fixed.accepted_draft_tokens) << "and some rejected (rollbacks)";
  o.policy = VerifyPolicy::Threshold;
  o.validation_threshold = 0.2f;
  expect_lossless(s, o, "dspark threshold");
  const SpsTable sps = linear_sps(2.0, 0.3);
  o.policy = VerifyPolicy::DSpark;
  o.validation_threshold = 0.0f;
  o.sps = &sps;
  expect_lossless(s, o, "dspark scheduler");
  o.policy = VerifyPolicy::DSparkAsync;
  expect_lossless(s, o, "dspark-async scheduler");
  // Async prefetch: one cohort drafts on the drafter's own thread while the target verifies
  // the other.
  o.policy = VerifyPolicy::Fixed;
  o.sps = nullptr;
  o.async_prefetch = true;
  const EngineStats pf = expect_lossless(s, o, "dspark fixed, async prefetch");
  EXPECT_GT(pf.prefetch_passes, 0u);
  o.async_prefetch = false;
  // Speculation and preemption together.
  o.policy = VerifyPolicy::Fixed;
  o.sps = nullptr;
  o.kv_block_size = 4;
  o.kv_num_blocks = 48;
  o.shard_count = 1;
  const EngineStats pre = expect_lossless(s, o, "dspark fixed, preempting");
  EXPECT_GT(pre.preemptions, 0u);
}

TEST(V4Engine, FlashLayerScheduleInTheEngine) {
  // Compress rate 128 (HCA) and 4 (CSA with the indexer) with prompts past a 128-token
  // window, the drafter on.
  static V4Setup s("flash_schedule", 8, 200, 24);
  EngineOptions o;
  o.max_running = 4;
  o.max_batch_tokens = 80;
  o.max_model_len = 256;
  expect_lossless(s, o, "flash plain");
  o.drafter = s.drafter.get();
  const EngineStats st = expect_lossless(s, o, "flash dspark");
  EXPECT_GT(st.accepted_draft_tokens, 0u);
}

TEST(V4Engine, PoolIsSizedFromTheStateShapeAndKeepsNoPrefixCache) {
  V4Setup& s = mixed();
  const Model::PagedStateShape shape = s.model->paged_state_shape();
  EXPECT_FALSE(shape.prefix_sharing);
  EXPECT_GT(shape.bytes_per_token, 0u);
  EXPECT_GT(shape.bytes_per_sequence, 0u);
  EngineOptions o;
  o.max_running = 4;
  o.max_model_len = 128;
  o.kv_block_size = 8;
  o.shard_count = 1;
  const uint64_t want_blocks = 50;
  o.kv_budget_bytes = 4 * shape.bytes_per_sequence + want_blocks * 8 * shape.bytes_per_token + 8 * shape.bytes_per_token / 2;
  {
    LLMEngine e(*s.model, o);
    EXPECT_EQ(e.stats().kv_blocks_total, static_cast<int>(want_blocks));
  }
  // --cache-prealloc-ratio takes its share of the budget before the bounded state comes off.
  o.cache_prealloc_ratio = 0.5;
  o.kv_budget_bytes = 2 * (4 * shape.bytes_per_sequence + 20 * 8 * shape.bytes_per_token) + 8 * shape.bytes_per_token;
  {
    LLMEngine e(*s.model, o);
    EXPECT_EQ(e.stats().kv_blocks_total, 20);
  }
  // A budget beyond what max_running full-length sequences can use is not taken: without a
  // prefix cache no block outlives its request (4 x (ceil(129 / 8) + 1) = 72 blocks).
  o.kv_budget_bytes = uint64_t{1} << 34;
  {
    LLMEngine e(*s.model, o);
    EXPECT_EQ(e.stats().kv_blocks_total, 72);
  }
  // The bounded state of the running sequences alone does not fit: refused in one line.
  o.cache_prealloc_ratio = 1.0;
  o.kv_budget_bytes = 3 * shape.bytes_per_sequence;
  const std::string small = error_of([&] { LLMEngine e(*s.model, o); });
  EXPECT_NE(small.find("bounded decoding state"), std::string::npos) << small;

  // The same prompt twice, one after the other: the second is recomputed, not served from
  // cached blocks (a V4 state cannot be rebuilt from blocks), and both give the plain output.
  o.kv_budget_bytes = 0;
  o.kv_num_blocks = 64;
  LLMEngine e(*s.model, o);
  const Case& c = s.cases[3];
  for (int round = 0; round < 2; ++round) {
    std::vector<int32_t> got;
    EngineRequest req;
    req.prompt = c.prompt;
    req.stop.max_tokens = c.max_tokens;
    req.on_event = [&](const RequestEvent& ev) { got.insert(got.end(), ev.new_ids.begin(), ev.new_ids.end()); };
    e.submit(std::move(req));
    e.run_until_idle();
    EXPECT_EQ(got, c.plain) << "round " << round;
  }
  EXPECT_EQ(e.stats().prompt_tokens_cached, 0u);
  EXPECT_EQ(e.stats().kv_pool.cached, 0);
}

TEST(V4Engine, SpsProfileStepsLongerThanTheStatesRollbackRange) {
  // serve profiles verify steps of up to max_running x (block + 1) tokens; a V4 state rolls
  // back at most V4State::kMaxRollback (256) positions, so a longer step is undone by
  // clearing the slot and prefilling the context again (it used to stop serve at start-up).
  V4Setup& s = mixed();
  SpsProfileOptions po;
  po.points = {1, 8, 300};
  po.context = 16;
  po.repeats = 2;
  const SpsTable t = profile_sps(*s.model, s.drafter.get(), po);
  EXPECT_GT(t.sps(300), 0.0);
  EXPECT_GE(t.sps(1), t.sps(300));
}

TEST(V4Engine, WhatNeedsAPrefixCacheIsRefusedByName) {
  V4Setup& s = mixed();
  EngineOptions o;
  o.max_running = 2;
  o.max_model_len = 64;
  o.cache_warmup_prompts = {{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}};
  const std::string warm = error_of([&] { LLMEngine e(*s.model, o); });
  EXPECT_NE(warm.find("--cache-warmup-file"), std::string::npos) << warm;
  EXPECT_NE(warm.find("deepseek_v4"), std::string::npos) << warm;
  o.cache_warmup_prompts.clear();
  o.enable_cache_defrag = true;
  const std::string defrag = error_of([&] { LLMEngine e(*s.model, o); });
  EXPECT_NE(defrag.find("--enable-cache-defrag"), std::string::npos) << defrag;
}

TEST(V4Engine, StorageRefusesTablesItsStateDoesNotHoldAndBlockCopies) {
  V4Setup& s = mixed();
  auto kv = s.model->make_paged_kv_cache(4, 16, 2, 64, 0);
  const std::vector<int32_t> blocks = {0, 1, 2};
  kv->bind(0, blocks, 0);
  ForwardBatch b;
  b.entries.push_back({0, {5, 6, 7, 8, 9, 10}, {5}});
  ForwardOutput out;
  s.model->forward(*kv, b, out);
  EXPECT_EQ(kv->length(0), 6);
  // Slot 1 bound at 5 tokens it never computed: the forward refuses it.
  kv->bind(1, blocks, 5);
  ForwardBatch b1;
  b1.entries.push_back({1, {5}, {0}});
  const std::string e = error_of([&] { s.model->forward(*kv, b1, out); });
  EXPECT_NE(e.find("paged decoding state: slot 1 is bound at 5 tokens but its state holds 0"), std::string::npos) << e;
  // A rollback (the engine truncating the table) is applied to the state: the next token's
  // logits equal those after a prefill of the kept tokens alone.
  kv->truncate(0, 3);
  ForwardBatch next;
  next.entries.push_back({0, {11}, {0}});
  ForwardOutput a;
  s.model->forward(*kv, next, a);
  auto fresh = s.model->make_kv_cache(1, 64);
  ForwardBatch pre;
  pre.entries.push_back({0, {5, 6, 7, 11}, {3}});
  ForwardOutput f;
  s.model->forward(*fresh, pre, f);
  ASSERT_EQ(a.logits.size(), f.logits.size());
  EXPECT_EQ(a.logits, f.logits);
  // An unbind clears the slot: bound again at 0 it starts a new sequence.
  kv->unbind(0);
  kv->bind(0, blocks, 0);
  ForwardBatch again;
  again.entries.push_back({0, {5, 6, 7, 11}, {3}});
  ForwardOutput g;
  s.model->forward(*kv, again, g);
  EXPECT_EQ(g.logits, f.logits);
  const std::string copy = error_of([&] { kv->copy_block(0, 5, 4); });
  EXPECT_NE(copy.find("blocks cannot be copied"), std::string::npos) << copy;
}
