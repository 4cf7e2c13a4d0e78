// CUDA backend: the batched engine (engine/llm_engine.h) on the GPU model, over the device
// paged KV pool (backend/cuda/cuda_paged_kv_cache.h) that the model makes for it.
//  - the paged pool gives the dense device cache's bits: a prefill, decode rows and verify
//    blocks through scattered block tables with odd block sizes (every row crossing block
//    edges), batched with another sequence, with and without CUDA graphs, and after
//    copy_block moved a sequence's blocks: every logit row memcmp-equal to the dense cache's;
//  - in the batch-invariant mode, 24 concurrent greedy requests with shared prompt prefixes
//    give exactly their single-request plain greedy ids (dense cache), for plain decoding
//    and with the shipped DSpark drafter (on the CPU) under the fixed and dspark policies,
//    with a roomy pool (prefix-cache hits) and a pool small enough to preempt; the drafter
//    shares the target's LM head, which then runs on the GPU;
//  - layer capture (the drafter's rows) inside CUDA graphs gives the eager bits;
//  - bad pool sizes are one-line errors naming the flag.
// Skipped without DSINFER_CUDA or without a GPU.
#include <gtest/gtest.h>

#ifdef DSINFER_HAS_CUDA
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/llm_engine.h"
#include "model/block_kv_cache.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "spec/prefix_scheduler.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;

namespace {

#define SKIP_WITHOUT_GPU()                                       \
  do {                                                           \
    const std::string why = cuda_unavailable_reason();           \
    if (!why.empty()) GTEST_SKIP() << "CUDA build, but " << why; \
  } while (0)

const std::string kRoot = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";
const std::string kGqaDir = std::string(DSINFER_TEST_DATA) + "/qwen3/untied_gqa4_hd32";

// Logit rows of one sequence `seq` decoded after a prefill of `prefix` tokens: the rest one
// token per forward, then the same tail again as one verify block (after a rollback).
struct Rows {
  std::vector<float> prefill, decode, block;
};

}  // namespace

TEST(CudaEngine, PagedPoolGivesTheDenseCacheBits) {
  SKIP_WITHOUT_GPU();
  const std::vector<int32_t> seq = {5, 17, 99, 3, 42, 7, 250, 11, 64, 300, 12, 13, 14, 15, 16, 90, 91, 92};
  const std::vector<int32_t> other = {8, 9, 10, 11, 12, 13, 14};
  const int prefix = 7;
  for (bool graphs : {false, true}) {
    CudaModelOptions o;
    o.use_graphs = graphs;
    auto m = load_qwen3_cuda(kGqaDir, o);
    const int V = m->config().vocab_size;
    auto run = [&](KVCache& kv, const std::function<void(int len)>& bind_for) {
      Rows r;
      ForwardOutput out;
      ForwardBatch pre;
      bind_for(0);
      pre.entries.push_back({0, std::vector<int32_t>(seq.begin(), seq.begin() + prefix), {0, prefix - 1}});
      pre.entries.push_back({1, other, {static_cast<int>(other.size()) - 1}});
      m->forward(kv, pre, out);
      r.prefill = out.logits;
      for (int pass = 0; pass < 2; ++pass) {  // the second pass replays graphs
        for (size_t i = prefix; i < seq.size(); ++i) {
          bind_for(static_cast<int>(i));
          ForwardBatch d;
          d.entries.push_back({1, {static_cast<int32_t>(i)}, {0}});
          d.entries.push_back({0, {seq[i]}, {0}});
          m->forward(kv, d, out);
          if (pass == 1) r.decode.insert(r.decode.end(), out.logits.begin() + V, out.logits.end());
        }
        if (pass == 0) {
          kv.truncate(0, prefix);
          kv.truncate(1, static_cast<int>(other.size()));
        }
      }
      kv.truncate(0, prefix);
      bind_for(prefix);
      ForwardBatch blk;
      blk.entries.push_back({0, std::vector<int32_t>(seq.begin() + prefix, seq.end()), {}});
      for (size_t i = 0; i + prefix < seq.size(); ++i) blk.entries[0].logit_rows.push_back(static_cast<int>(i));
      m->forward(kv, blk, out);
      r.block = out.logits;
      return r;
    };
    auto dense = m->make_kv_cache(2, 64);
    const Rows ref = run(*dense, [](int) {});
    ASSERT_EQ(ref.decode.size(), (seq.size() - prefix) * V);
    ASSERT_EQ(ref.block, ref.decode) << "verify block == decode rows (dense)";
    for (int bs : {1, 3, 5, 16}) {
      SCOPED_TRACE("block size " + std::to_string(bs) + (graphs ? ", graphs" : ", eager"));
      auto paged = m->make_paged_kv_cache(bs, 400, 2, 64);
      // Scattered ids: slot 0 even ones descending from 198, slot 1 odd ones ascending.
      std::vector<int32_t> t0, t1;
      for (int i = 0; i < 64 / bs + 1; ++i) {
        t0.push_back(198 - 2 * i);
        t1.push_back(2 * i + 1);
      }
      paged->bind(1, t1, 0);
      auto bind0 = [&](int len) { paged->bind(0, t0, len); };
      const Rows got = run(*paged, bind0);
      EXPECT_EQ(0, std::memcmp(got.prefill.data(), ref.prefill.data(), ref.prefill.size() * 4)) << "prefill";
      EXPECT_EQ(0, std::memcmp(got.decode.data(), ref.decode.data(), ref.decode.size() * 4)) << "decode rows";
      EXPECT_EQ(0, std::memcmp(got.block.data(), ref.block.data(), ref.block.size() * 4)) << "verify block";
      // copy_block: slot 0's blocks to fresh ids, rebound; the next decode row is unchanged.
      const int len = paged->length(0);
      std::vector<int32_t> moved;
      for (size_t i = 0; i < t0.size(); ++i) {
        moved.push_back(static_cast<int32_t>(200 + i));  // above both tables
        const int in_block = std::min(bs, std::max(0, len - static_cast<int>(i) * bs));
        paged->copy_block(t0[i], moved.back(), in_block);
      }
      ForwardOutput a, b;
      ForwardBatch d;
      d.entries.push_back({0, {77}, {0}});
      m->forward(*paged, d, a);
      paged->truncate(0, len);
      paged->bind(0, moved, len);
      m->forward(*paged, d, b);
      EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), static_cast<size_t>(V) * 4)) << "after copy_block";
    }
  }
}

// A drafter's layer capture runs inside CUDA graphs too: decode steps of two sequences with
// capture_layers give the same logits and captured rows (bits) eager and from replayed graphs.
TEST(CudaEngine, LayerCaptureInsideGraphsEqualsEager) {
  SKIP_WITHOUT_GPU();
  CudaModelOptions eager_opts;
  eager_opts.use_graphs = false;
  auto mg = load_qwen3_cuda(kGqaDir);
  auto me = load_qwen3_cuda(kGqaDir, eager_opts);
  auto run = [](Model& m) {
    auto kv = m.make_paged_kv_cache(4, 64, 2, 64);
    std::vector<int32_t> t0, t1;
    for (int i = 0; i < 16; ++i) t0.push_back(i), t1.push_back(63 - i);
    kv->bind(0, t0, 0);
    kv->bind(1, t1, 0);
    ForwardOutput out;
    ForwardBatch pre;
    pre.capture_layers = {-1, 0, 2};
    pre.entries.push_back({0, {5, 6, 7, 8, 9}, {4}});
    pre.entries.push_back({1, {11, 12, 13}, {2}});
    m.forward(*kv, pre, out);
    std::vector<float> logits = out.logits, captured = out.captured;
    for (int step = 0; step < 5; ++step) {  // the second step of this shape captures, later ones replay
      ForwardBatch d;
      d.capture_layers = {-1, 0, 2};
      d.entries.push_back({0, {static_cast<int32_t>(20 + step)}, {0}});
      d.entries.push_back({1, {static_cast<int32_t>(40 + step)}, {0}});
      m.forward(*kv, d, out);
      logits.insert(logits.end(), out.logits.begin(), out.logits.end());
      captured.insert(captured.end(), out.captured.begin(), out.captured.end());
    }
    return std::make_pair(logits, captured);
  };
  const auto g = run(*mg), e = run(*me);
  ASSERT_EQ(g.first.size(), e.first.size());
  ASSERT_EQ(g.second.size(), e.second.size());
  ASSERT_FALSE(e.second.empty());
  EXPECT_EQ(0, std::memcmp(g.first.data(), e.first.data(), e.first.size() * 4)) << "logits";
  EXPECT_EQ(0, std::memcmp(g.second.data(), e.second.data(), e.second.size() * 4)) << "captured rows";
}

TEST(CudaEngine, BadPoolSizesAreOneLineErrors) {
  SKIP_WITHOUT_GPU();
  auto m = load_qwen3_cuda(kGqaDir);
  try {
    m->make_paged_kv_cache(16, int64_t{1} << 40, 4, 64);
    FAIL() << "a pool larger than the device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-blocks"), std::string::npos) << e.what();
  }
  EXPECT_GT(m->device_kv_blocks(16, 0.01), 0);
  EXPECT_THROW(m->device_kv_blocks(16, 1.5), Error);
  auto paged = m->make_paged_kv_cache(4, 8, 2, 32);
  EXPECT_THROW(paged->bind(0, std::vector<int32_t>{8}, 0), Error);      // id outside the pool
  EXPECT_THROW(paged->bind(0, std::vector<int32_t>{1, 2}, 9), Error);   // more than the blocks hold
  EXPECT_THROW(paged->copy_block(0, 9, 4), Error);
  paged->bind(0, std::vector<int32_t>{1}, 0);
  ForwardBatch b;
  b.entries.push_back({0, {1, 2, 3, 4, 5}, {}});  // 5 tokens into one block of 4
  ForwardOutput out;
  EXPECT_THROW(m->forward(*paged, b, out), Error);
}

namespace {

struct EngineCase {
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  std::vector<int32_t> plain;
};

struct EngineFixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Drafter> dspark;
  std::optional<Calibration> cal;
  std::vector<EngineCase> cases;
};

EngineFixture& engine_fixture() {
  static EngineFixture f = [] {
    EngineFixture r;
    r.model = load_qwen3_cuda(kRoot + "/target");
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
    std::mt19937 rng(7);
    for (int i = 0; i < 24; ++i) {
      EngineCase c;
      const std::vector<int32_t>& head = texts[static_cast<size_t>(i % 3) * 5 % texts.size()];
      c.prompt.assign(head.begin(), head.begin() + std::min<size_t>(head.size(), 48));  // 3 shared prefixes
      const std::vector<int32_t>& tail = texts[(static_cast<size_t>(i) * 7 + 2) % texts.size()];
      c.prompt.insert(c.prompt.end(), tail.begin(), tail.begin() + std::min<size_t>(tail.size(), 1 + rng() % 40));
      c.max_tokens = 8 + static_cast<int>(rng() % 40);
      StopConditions stop;
      stop.max_tokens = c.max_tokens;
      c.plain = generate(*r.model, nullptr, c.prompt, SamplingParams{}, stop).ids;  // dense device cache
      r.cases.push_back(std::move(c));
    }
    return r;
  }();
  return f;
}

EngineStats expect_engine_lossless(const EngineOptions& opts, const std::string& what) {
  EngineFixture& f = engine_fixture();
  LLMEngine engine(*f.model, opts);
  std::map<uint64_t, std::vector<int32_t>> got;
  std::map<uint64_t, size_t> case_of;
  for (size_t i = 0; i < f.cases.size(); ++i) {
    EngineRequest req;
    req.prompt = f.cases[i].prompt;
    req.stop.max_tokens = f.cases[i].max_tokens;
    req.on_event = [&](const RequestEvent& ev) {
      auto& v = got[ev.id];
      v.insert(v.end(), ev.new_ids.begin(), ev.new_ids.end());
      EXPECT_TRUE(ev.error.empty()) << what << ": " << ev.error;
    };
    case_of[engine.submit(std::move(req))] = i;
  }
  while (engine.step()) {
  }
  for (const auto& [id, i] : case_of) EXPECT_EQ(got[id], f.cases[i].plain) << what << ": request " << i;
  EXPECT_EQ(engine.check_kv_invariants(), "") << what;
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.requests_finished, f.cases.size()) << what;
  EXPECT_GT(st.prompt_tokens_cached, 0u) << what;  // the shared prefixes were served from the device pool
  if (opts.drafter) {
    EXPECT_GT(st.accepted_draft_tokens, 0u) << what;
  }
  return st;
}

}  // namespace

TEST(CudaEngine, GreedyEngineOnGpuEqualsPlainGreedy) {
  SKIP_WITHOUT_GPU();
  if (!std::filesystem::exists(kRoot + "/target/model.safetensors")) GTEST_SKIP() << "shipped target absent";
  EngineOptions o;
  o.max_running = 8;
  o.max_batch_tokens = 96;  // prompts are prefilled in chunks alongside decode rows
  o.max_model_len = 160;
  o.kv_block_size = 16;
  EXPECT_EQ(expect_engine_lossless(o, "plain, roomy pool").preemptions, 0u);
  o.kv_block_size = 8;
  o.kv_num_blocks = 30;  // 8 running requests of up to ~140 tokens need far more: preemption
  o.shard_count = 2;
  EXPECT_GT(expect_engine_lossless(o, "plain, small pool").preemptions, 0u);
  EngineFixture& f = engine_fixture();
  if (!f.dspark) GTEST_SKIP() << "shipped DSpark absent (plain decoding checked)";
  // Its frozen embedding / LM head copies are the target's: shared through the GPU model's
  // host views, so the drafter's head runs on the GPU (Model::lm_head).
  const auto& shared = f.dspark->info().shared_with_target;
  EXPECT_NE(std::find(shared.begin(), shared.end(), "lm_head.weight"), shared.end());
  o.drafter = f.dspark.get();
  o.calibration = f.cal ? &*f.cal : nullptr;
  o.kv_num_blocks = 60;  // verify blocks cross block edges; rollback inside shared blocks copies on write
  expect_engine_lossless(o, "dspark fixed, small pool");
  std::vector<SpsPoint> pts;
  for (int b : {1, 16, 64, 256}) pts.push_back({b, 1000.0 / (2.0 + 0.3 * b)});
  const SpsTable sps(pts);
  o.policy = VerifyPolicy::DSpark;
  o.sps = &sps;
  o.kv_num_blocks = 0;
  expect_engine_lossless(o, "dspark scheduler, roomy pool");
}

#else
TEST(CudaEngine, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without DSINFER_CUDA"; }
#endif
