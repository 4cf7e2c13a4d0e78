// The batched engine on the paged KV pool (engine/llm_engine.h over engine/block_pool.h and
// model/paged_kv_cache.h), on the shipped models:
//  - 64 concurrent greedy requests whose prompts share long prefixes give exactly their
//    single-request plain greedy outputs (dense cache, `generate`), with a roomy pool
//    (prefix-cache hits: shared blocks are not recomputed) and with a pool so small that
//    running requests are preempted and recomputed; plain decoding and the DSpark drafter
//    under the fixed / threshold / dspark policies;
//  - after every run each block is back (free or idle cached) and the pool's invariants hold;
//  - cancelling frees the request's blocks at once;
//  - warm-up prompts are cached at start-up and then hit; idle defrag keeps outputs exact;
//  - bad pool options and requests that could never fit are one-line errors;
//  - in bf16 matmul precision (BF16 K/V in both caches) the engine's outputs, plain and
//    DSpark, with a small pool that preempts, still equal single-request plain greedy, and
//    a memory budget buys twice the blocks (the block bytes follow the K/V element type);
//    the drafter's BF16 feature store gives the drafts the captured F32 rows give.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "engine/block_pool.h"
#include "kernels/cpu/matmul.h"
#include "engine/generator.h"
#include "engine/llm_engine.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "model/tensor_parallel_group.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "spec/prefix_scheduler.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;

namespace {

const std::string kRoot = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";

struct Case {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  std::vector<int32_t> plain;  // single-request plain greedy output (dense cache)
};

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Drafter> dspark;
  std::optional<Calibration> cal;
  std::vector<std::vector<int32_t>> prefixes;
  std::vector<Case> cases;
};

Fixture& fixture() {
  static Fixture f = [] {
    Fixture r;
    r.model = load_model(kRoot + "/target");
    auto tok = Tokenizer::load(kRoot + "/target");
    if (std::filesystem::exists(kRoot + "/dspark/model.safetensors")) {
      r.dspark = load_drafter(kRoot + "/dspark", *r.model);
      r.cal = load_calibration(kRoot + "/dspark");
    }
    std::vector<std::vector<int32_t>> texts;
    for (const char* set : {"code", "python", "prose"}) {
      std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/models/eval/heldout_" + set + ".jsonl");
      for (std::string line; std::getline(in, line);)
        texts.push_back(tok->encode(nlohmann::json::parse(line).at("prompt").get<std::string>(), false));
    }
    // Four "system prompts" of 40..100 tokens; every request = one of them + its own tail.
    std::mt19937 rng(11);
    for (size_t i = 0; i < 4; ++i) {
      std::vector<int32_t> p = texts[i * 7 % texts.size()];
      p.resize(std::min(p.size(), static_cast<size_t>(40 + 20 * i)));
      r.prefixes.push_back(p);
    }
    for (int i = 0; i < 64; ++i) {
      Case c;
      c.prompt = r.prefixes[static_cast<size_t>(i) % 4];
      const std::vector<int32_t>& tail = texts[(static_cast<size_t>(i) * 5 + 1) % texts.size()];
      const size_t n = std::min(tail.size(), static_cast<size_t>(1 + rng() % 50));
      c.prompt.insert(c.prompt.end(), tail.begin(), tail.begin() + static_cast<ptrdiff_t>(n));
      c.max_tokens = 4 + static_cast<int>(rng() % 36);
      StopConditions stop;
      stop.max_tokens = c.max_tokens;
      c.plain = generate(*r.model, nullptr, c.prompt, SamplingParams{}, stop).ids;
      r.cases.push_back(std::move(c));
    }
    return r;
  }();
  return f;
}

bool have_models() { return std::filesystem::exists(kRoot + "/target/model.safetensors"); }

// Every block back: none held by a table, the rest free or idle cache entries.
void expect_pool_drained(LLMEngine& engine, const std::string& what) {
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.kv_pool.used, 0) << what;
  EXPECT_EQ(st.kv_pool.free + st.kv_pool.cached_idle, st.kv_pool.total) << what;
  EXPECT_EQ(engine.check_kv_invariants(), "") << what;
}

// Submits every case at once, runs to idle, checks outputs == plain; returns the stats.
EngineStats expect_lossless(const EngineOptions& opts, const std::string& what) {
  Fixture& f = fixture();
  LLMEngine engine(*f.model, opts);
  std::map<uint64_t, std::vector<int32_t>> got;
  std::map<uint64_t, std::string> reason;
  std::map<uint64_t, size_t> case_of;
  for (size_t i = 0; i < f.cases.size(); ++i) {
    EngineRequest req;
    req.prompt = f.cases[i].prompt;
    req.stop.max_tokens = f.cases[i].max_tokens;
    req.priority = static_cast<int>(i % 3);
    req.on_event = [&](const RequestEvent& ev) {
      auto& v = got[ev.id];
      v.insert(v.end(), ev.new_ids.begin(), ev.new_ids.end());
      if (ev.finished) reason[ev.id] = ev.finish_reason;
    };
    case_of[engine.submit(std::move(req))] = i;
  }
  int steps = 0;
  while (engine.step()) {
    if (++steps % 25 == 0) {
      EXPECT_EQ(engine.check_kv_invariants(), "") << what << " at step " << steps;
    }
  }
  EXPECT_EQ(reason.size(), f.cases.size()) << what;
  for (const auto& [id, i] : case_of) {
    EXPECT_EQ(got[id], f.cases[i].plain) << what << ": request " << i;
    EXPECT_EQ(reason[id], "length") << what << ": request " << i;
  }
  expect_pool_drained(engine, what);
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.requests_finished, f.cases.size()) << what;
  EXPECT_GT(st.kv_pool.hit_ratio, 0.0) << what;  // the shared prefixes were served from the cache
  EXPECT_GT(st.prompt_tokens_cached, 0u) << what;
  if (opts.drafter) {
    EXPECT_GT(st.accepted_draft_tokens, 0u) << what;
  }
  return st;
}

EngineOptions small_pool(EngineOptions o) {
  // 12 running requests of up to ~200 tokens would need ~150 blocks of 16: 40 force
  // preemptions (one request needs at most 15).
  o.kv_block_size = 16;
  o.kv_num_blocks = 40;
  o.shard_count = 4;
  o.max_model_len = 256;
  return o;
}

}  // namespace

TEST(PagedEngine, PlainSharedPrefixesAndPreemptionAreLossless) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  EngineOptions o;
  o.max_running = 16;
  o.max_batch_tokens = 128;
  const EngineStats roomy = expect_lossless(o, "plain, roomy pool");
  EXPECT_EQ(roomy.preemptions, 0u);
  o.max_running = 12;
  const EngineStats tight = expect_lossless(small_pool(o), "plain, small pool");
  EXPECT_GT(tight.preemptions, 0u);
  int64_t evictions = 0;
  for (const ShardStats& sh : tight.kv_pool.shards) evictions += sh.evictions;
  EXPECT_GT(evictions, 0);  // the pressure evicted idle cached prefixes too
}

TEST(PagedEngine, DSparkPoliciesWithSharingAndPreemptionAreLossless) {
  if (!have_models() || !fixture().dspark) GTEST_SKIP() << "shipped DSpark absent";
  Fixture& f = fixture();
  EngineOptions o;
  o.max_running = 12;
  o.max_batch_tokens = 128;
  o.drafter = f.dspark.get();
  o.calibration = f.cal ? &*f.cal : nullptr;
  o = small_pool(o);
  o.kv_block_size = 8;  // verify blocks cross block edges often; copy-on-write after rollback
  o.kv_num_blocks = 80;
  EXPECT_GT(expect_lossless(o, "dspark fixed, small pool").preemptions, 0u);
  o.policy = VerifyPolicy::Threshold;
  o.validation_threshold = 0.3f;
  expect_lossless(o, "dspark threshold, small pool");
  std::vector<SpsPoint> pts;
  for (int b : {1, 16, 64, 256}) pts.push_back({b, 1000.0 / (2.0 + 0.3 * b)});
  const SpsTable sps(pts);
  o.policy = VerifyPolicy::DSpark;
  o.validation_threshold = 0.0f;
  o.sps = &sps;
  expect_lossless(o, "dspark scheduler, small pool");
  o.kv_num_blocks = 0;  // roomy: the drafter's context rows of cached prefixes come from the feature store
  EXPECT_EQ(expect_lossless(o, "dspark scheduler, roomy pool").preemptions, 0u);
}

TEST(PagedEngine, CancelFreesBlocksAtOnce) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  EngineOptions o;
  o.max_running = 2;
  LLMEngine engine(*f.model, o);
  std::map<uint64_t, std::string> reason;
  auto submit = [&](size_t i) {
    EngineRequest req;
    req.prompt = f.cases[i].prompt;
    req.stop.max_tokens = 200;
    req.on_event = [&](const RequestEvent& ev) {
      if (ev.finished) reason[ev.id] = ev.finish_reason;
    };
    return engine.submit(std::move(req));
  };
  const uint64_t a = submit(0), b = submit(1);
  for (int i = 0; i < 5; ++i) engine.step();
  const EngineStats mid = engine.stats();
  const int64_t used_both = mid.kv_pool.used;
  EXPECT_GT(used_both, 0);
  // Each request's last block is partly empty: some fragmentation, far from all of it.
  EXPECT_GT(mid.kv_pool.fragmentation, 0.0);
  EXPECT_LT(mid.kv_pool.fragmentation, 0.5);
  EXPECT_EQ(mid.kv_pool.shards.size(), 8u);
  EXPECT_EQ(mid.kv_blocks_used, used_both);
  engine.cancel(a);
  engine.step();
  EXPECT_EQ(reason[a], "cancelled");
  const int64_t used_one = engine.stats().kv_pool.used;
  EXPECT_LT(used_one, used_both);
  EXPECT_EQ(engine.check_kv_invariants(), "");
  engine.cancel(b);
  EXPECT_FALSE(engine.step());  // b ends at the step boundary, nothing left to run
  EXPECT_EQ(reason[b], "cancelled");
  expect_pool_drained(engine, "after cancelling both");
}

TEST(PagedEngine, WarmupPromptsAreCachedAndHit) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  EngineOptions o;
  o.max_running = 4;
  o.cache_warmup_prompts = {f.prefixes[2], f.prefixes[3]};
  LLMEngine engine(*f.model, o);
  EngineStats st = engine.stats();
  EXPECT_EQ(st.warmup_prompts, 2);
  EXPECT_GE(st.kv_pool.cached_idle, static_cast<int64_t>((f.prefixes[2].size() + f.prefixes[3].size()) / 16) - 1);
  std::vector<int32_t> got;
  EngineRequest req;
  req.prompt = f.cases[3].prompt;  // prefixes[3] + a tail
  req.stop.max_tokens = f.cases[3].max_tokens;
  req.on_event = [&](const RequestEvent& ev) { got.insert(got.end(), ev.new_ids.begin(), ev.new_ids.end()); };
  engine.submit(std::move(req));
  engine.run_until_idle();
  EXPECT_EQ(got, f.cases[3].plain);
  st = engine.stats();
  EXPECT_EQ(st.prompt_tokens_cached, f.prefixes[3].size() / 16 * 16);
  expect_pool_drained(engine, "warm-up");

  EngineOptions bad = o;
  bad.cache_warmup_prompts = {{1, 2, 999999}};
  try {
    LLMEngine e(*f.model, bad);
    ADD_FAILURE() << "bad warm-up prompt accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache warm-up prompt 0: token id 999999"), std::string::npos) << e.what();
  }
}

// The body of IdleDefragKeepsCachedPrefixesExact on `model` (its greedy outputs must be
// the fixture's single-request ones).
static void expect_defrag_keeps_prefixes(Model& model, const std::string& what) {
  SCOPED_TRACE(what);
  Fixture& f = fixture();
  EngineOptions o;
  o.max_running = 8;
  o.kv_block_size = 8;
  o.kv_num_blocks = 400;
  o.shard_count = 1;
  o.enable_cache_defrag = true;
  LLMEngine engine(model, o);
  std::map<uint64_t, std::vector<int32_t>> got;
  std::map<uint64_t, std::pair<size_t, int>> case_of;  // case, max_tokens
  auto run = [&](const std::vector<std::pair<size_t, int>>& reqs) {
    for (const auto& [i, max_tokens] : reqs) {
      EngineRequest req;
      req.prompt = f.cases[i].prompt;
      req.stop.max_tokens = max_tokens;
      req.on_event = [&](const RequestEvent& ev) {
        auto& v = got[ev.id];
        v.insert(v.end(), ev.new_ids.begin(), ev.new_ids.end());
      };
      case_of[engine.submit(std::move(req))] = {i, max_tokens};
    }
    engine.run_until_idle();
  };
  // Wave 1: two requests prefilled in one step, one token each. The first one's partial
  // last block is freed at the end, below the second one's cached blocks: a hole that the
  // idle compaction fills by moving the second one's blocks down.
  size_t a = 0;
  while (f.cases[a].prompt.size() % 8 == 0) ++a;
  run({{a, 1}, {a + 1, 1}});
  EngineStats st = engine.stats();
  EXPECT_EQ(st.cache_defrags, 1u);
  EXPECT_GT(st.defrag_moves, 0u);
  EXPECT_EQ(engine.check_kv_invariants(), "");
  const uint64_t cached_before = st.prompt_tokens_cached;
  // Wave 2: the same prefixes again, now read from the moved blocks.
  std::vector<std::pair<size_t, int>> wave;
  for (size_t i = 0; i < 24; ++i) wave.push_back({i, f.cases[i].max_tokens});
  run(wave);
  st = engine.stats();
  EXPECT_GT(st.prompt_tokens_cached, cached_before);
  EXPECT_EQ(st.cache_defrags, 2u);
  for (const auto& [id, c] : case_of) {
    const std::vector<int32_t>& plain = f.cases[c.first].plain;
    EXPECT_EQ(got[id], std::vector<int32_t>(plain.begin(), plain.begin() + c.second)) << "request " << c.first;
  }
  expect_pool_drained(engine, "defrag");
}

// Also over a tensor-parallel target: the moves happen on every rank's storage
// (model/tensor_parallel_group.h).
TEST(PagedEngine, IdleDefragKeepsCachedPrefixesExact) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  expect_defrag_keeps_prefixes(*fixture().model, "single model");
  auto split = load_tensor_parallel(kRoot + "/target", 2);
  expect_defrag_keeps_prefixes(*split, "two tensor-parallel ranks");
}

TEST(PagedEngine, BadPoolOptionsAndOversizedRequestsAreErrors) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  auto expect_error = [&](const EngineOptions& o, const std::string& needle) {
    try {
      LLMEngine e(*f.model, o);
      ADD_FAILURE() << "accepted; expected an error containing " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EngineOptions o;
  o.kv_block_size = 0;
  expect_error(o, "kv_block_size");
  o = {};
  o.kv_num_blocks = 3;
  o.shard_count = 8;
  expect_error(o, "kv_num_blocks");
  o = {};
  o.kv_budget_bytes = 1 << 20;
  o.cache_prealloc_ratio = 1.5;
  expect_error(o, "prealloc");
  o = {};
  o.kv_num_blocks = 10;
  o.kv_block_size = 16;
  o.shard_count = 2;
  LLMEngine engine(*f.model, o);
  EngineRequest req;
  req.prompt = f.cases[0].prompt;
  req.stop.max_tokens = 200;  // > 10 blocks of 16 tokens with the prompt
  try {
    engine.submit(std::move(req));
    ADD_FAILURE() << "a request larger than the pool was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV blocks"), std::string::npos) << e.what();
  }
}

namespace {

struct PrecisionScope {
  explicit PrecisionScope(MatmulPrecision p) : saved(matmul_precision()) { set_matmul_precision(p); }
  ~PrecisionScope() { set_matmul_precision(saved); }
  MatmulPrecision saved;
};

// Runs cases [0, n) at once on `model` and compares each output with `plain`.
void expect_outputs_on(Model& model, const EngineOptions& opts, size_t n, const std::vector<std::vector<int32_t>>& plain,
                       const std::string& what) {
  Fixture& f = fixture();
  LLMEngine engine(model, opts);
  std::map<uint64_t, std::vector<int32_t>> got;
  std::map<uint64_t, size_t> case_of;
  for (size_t i = 0; i < n; ++i) {
    EngineRequest req;
    req.prompt = f.cases[i].prompt;
    req.stop.max_tokens = f.cases[i].max_tokens;
    req.on_event = [&](const RequestEvent& ev) {
      auto& v = got[ev.id];
      v.insert(v.end(), ev.new_ids.begin(), ev.new_ids.end());
    };
    case_of[engine.submit(std::move(req))] = i;
  }
  while (engine.step()) {
  }
  for (const auto& [id, i] : case_of) EXPECT_EQ(got[id], plain[i]) << what << ": request " << i;
  expect_pool_drained(engine, what);
}

// o with the shipped DSpark drafter (fixed policy) in a pool of 80 blocks of 8 positions:
// verify blocks cross block edges often, and requests are preempted.
EngineOptions dspark_small_pool(EngineOptions o) {
  Fixture& f = fixture();
  o.drafter = f.dspark.get();
  o.calibration = f.cal ? &*f.cal : nullptr;
  o = small_pool(o);
  o.kv_block_size = 8;
  o.kv_num_blocks = 80;
  return o;
}

// The same on the fixture's model (same precision as `plain`).
void expect_outputs(const EngineOptions& opts, size_t n, const std::vector<std::vector<int32_t>>& plain,
                    const std::string& what) {
  expect_outputs_on(*fixture().model, opts, n, plain, what);
}

}  // namespace

TEST(PagedEngine, Bf16KvIsLosslessAgainstSingleRequestDecoding) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  PrecisionScope prec(MatmulPrecision::Bf16Dot);
  ASSERT_EQ(f.model->kv_dtype(), DType::BF16);
  const size_t n = 24;
  std::vector<std::vector<int32_t>> plain;
  for (size_t i = 0; i < n; ++i) {
    StopConditions stop;
    stop.max_tokens = f.cases[i].max_tokens;
    plain.push_back(generate(*f.model, nullptr, f.cases[i].prompt, SamplingParams{}, stop).ids);
  }
  size_t differs = 0;  // the BF16 cache changes some greedy tokens against the F32 one
  for (size_t i = 0; i < n; ++i) differs += plain[i] != f.cases[i].plain;
  RecordProperty("outputs_differing_from_f32", static_cast<int>(differs));
  EngineOptions o;
  o.max_running = 12;
  o.max_batch_tokens = 128;
  expect_outputs(o, n, plain, "bf16 plain, roomy pool");
  expect_outputs(small_pool(o), n, plain, "bf16 plain, small pool");
  if (f.dspark) expect_outputs(dspark_small_pool(o), n, plain, "bf16 dspark fixed, small pool");
}

// The batched engine over a tensor-parallel target (model/tensor_parallel_group.h: the
// embedded target split over two CPU ranks, each with half the heads and features and its
// own paged K/V at the engine's block ids, the ranks summing their o and down outputs):
// concurrent requests, plain and with DSpark, in a pool small enough to preempt, give
// exactly the split model's single-request greedy outputs, and those are the single
// model's.
TEST(PagedEngine, TensorParallelTargetIsLossless) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  auto split = load_tensor_parallel(kRoot + "/target", 2);
  const size_t n = 24;
  std::vector<std::vector<int32_t>> plain;
  for (size_t i = 0; i < n; ++i) {
    StopConditions stop;
    stop.max_tokens = f.cases[i].max_tokens;
    plain.push_back(generate(*split, nullptr, f.cases[i].prompt, SamplingParams{}, stop).ids);
    EXPECT_EQ(plain.back(), f.cases[i].plain) << "request " << i << ": the split model's greedy output";
  }
  EngineOptions o;
  o.max_running = 12;
  o.max_batch_tokens = 128;
  expect_outputs_on(*split, small_pool(o), n, plain, "tensor-parallel plain, small pool");
  if (f.dspark) expect_outputs_on(*split, dspark_small_pool(o), n, plain, "tensor-parallel dspark fixed, small pool");
}

// The drafter's feature store keeps captured target rows in BF16 in bf16 matmul precision.
// That loses nothing: the drafter's first matmul rounds its input rows to BF16 the same way.
// So the engine's drafts equal those of single-request speculation, which hands the
// drafter the captured F32 rows directly, round for round, also for prompts whose shared
// prefix came from the prefix cache (its rows read back from the store).
TEST(PagedEngine, Bf16FeatureStoreGivesTheDraftsOfTheCapturedRows) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  if (!f.dspark) GTEST_SKIP() << "shipped DSpark drafter absent";
  PrecisionScope prec(MatmulPrecision::Bf16Dot);
  const size_t n = 8;
  EngineOptions o;
  o.max_running = 4;  // the later requests find the shared prefixes cached
  o.max_batch_tokens = 128;
  o.drafter = f.dspark.get();
  std::map<uint64_t, std::vector<std::vector<int32_t>>> engine_drafts;
  o.on_rounds = [&](const std::vector<EngineRound>& rounds) {
    for (const EngineRound& r : rounds) engine_drafts[r.request_id].push_back(r.round.draft_ids);
  };
  LLMEngine engine(*f.model, o);
  std::map<uint64_t, size_t> case_of;
  for (size_t i = 0; i < n; ++i) {
    EngineRequest req;
    req.prompt = f.cases[i].prompt;
    req.stop.max_tokens = f.cases[i].max_tokens;
    case_of[engine.submit(std::move(req))] = i;
  }
  engine.run_until_idle();
  EXPECT_GT(engine.stats().prompt_tokens_cached, 0u);
  size_t rounds = 0;
  for (const auto& [id, i] : case_of) {
    SpecOptions so;
    so.drafter = f.dspark.get();
    std::vector<std::vector<int32_t>> single;
    const Case& c = f.cases[i];
    SpecDecoder dec(*f.model, SamplingParams{}, so, static_cast<int>(c.prompt.size()) + c.max_tokens);
    dec.prefill(c.prompt);
    for (int left = c.max_tokens - 1; left > 0;) {
      const SpecRound& r = dec.round(left);
      single.push_back(r.draft_ids);
      left -= static_cast<int>(r.tokens.size());
    }
    EXPECT_EQ(engine_drafts[id], single) << "request " << i;
    rounds += single.size();
  }
  EXPECT_GT(rounds, n);
}

TEST(PagedEngine, KvBudgetFollowsTheKvElementType) {
  if (!have_models()) GTEST_SKIP() << "shipped models absent";
  Fixture& f = fixture();
  const ModelConfig& c = f.model->config();
  EngineOptions o;
  o.kv_budget_bytes = 64ull << 20;
  o.cache_prealloc_ratio = 0.5;
  o.kv_block_size = 16;
  int64_t blocks[2];
  for (int i = 0; i < 2; ++i) {
    PrecisionScope prec(i == 0 ? MatmulPrecision::F32 : MatmulPrecision::Bf16Dot);
    LLMEngine engine(*f.model, o);
    blocks[i] = engine.stats().kv_blocks_total;
    KVLayout l{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, i == 0 ? DType::F32 : DType::BF16};
    EXPECT_EQ(blocks[i], blocks_for_budget(o.kv_budget_bytes, 0.5, l));
  }
  // 2 (K, V) x 8 layers x 2 KV heads x 64 x 16 tokens: 128 KiB per F32 block, 64 KiB per
  // BF16 one; 64 MiB x 0.5 holds 256 of the first and 512 of the second.
  EXPECT_EQ(blocks[0], 256);
  EXPECT_EQ(blocks[1], 512);
}
