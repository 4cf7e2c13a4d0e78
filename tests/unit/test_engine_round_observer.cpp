// EngineOptions::on_rounds (what `serve --log-dflash-details` writes): with the shipped DSpark
// drafter under the threshold policy and with plain decoding, the rounds reported for each
// request replay its output exactly (first token + each round's committed tokens), are
// numbered in order, chain their anchors and positions, agree with the engine's drafted /
// verified / accepted counters, and carry the request's log_id.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "engine/llm_engine.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;

namespace {

const std::string kRoot = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";

struct Result {
  std::vector<int32_t> ids;
  std::vector<EngineRound> rounds;
  RequestEvent final_event;
  size_t prompt_len = 0;
  std::string log_id;
};

// Runs `prompts` through one engine with on_rounds set; checks what holds per callback.
std::map<uint64_t, Result> run(EngineOptions o, Model& model, const Tokenizer& tok,
                               const std::vector<std::string>& prompts, EngineStats* stats) {
  std::map<uint64_t, Result> res;
  uint64_t last_step = 0;
  int callbacks = 0;
  o.on_rounds = [&](const std::vector<EngineRound>& rounds) {
    ++callbacks;
    EXPECT_FALSE(rounds.empty());
    EXPECT_GT(rounds[0].step, last_step);
    last_step = rounds[0].step;
    for (const EngineRound& r : rounds) {
      EXPECT_EQ(r.step, rounds[0].step);
      EXPECT_EQ(r.batch, static_cast<int>(rounds.size()));
      EXPECT_GE(r.round.draft_ms, 0.0);
      EXPECT_GE(r.round.verify_ms, 0.0);
      EXPECT_GE(r.step_ms, r.round.draft_ms + r.round.verify_ms - 1e-6);
      res[r.request_id].rounds.push_back(r);
    }
  };
  LLMEngine engine(model, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest req;
    req.prompt = tok.encode(prompts[i], false);
    req.stop.max_tokens = 12 + 7 * static_cast<int>(i);
    req.log_id = "req-" + std::to_string(i);
    const size_t n = req.prompt.size();
    const std::string tag = req.log_id;
    req.on_event = [&res, n, tag](const RequestEvent& ev) {
      Result& r = res[ev.id];
      r.prompt_len = n;
      r.log_id = tag;
      r.ids.insert(r.ids.end(), ev.new_ids.begin(), ev.new_ids.end());
      if (ev.finished) r.final_event = ev;
    };
    engine.submit(std::move(req));
  }
  engine.run_until_idle();
  EXPECT_GT(callbacks, 0);
  *stats = engine.stats();
  return res;
}

// Checks every request's rounds against its output and the engine's counters; *cut: the
// rounds whose verify length the policy cut below what was drafted.
void check(const std::map<uint64_t, Result>& res, const EngineStats& st, size_t n_requests, bool confidence_head,
           int* cut) {
  EXPECT_EQ(res.size(), n_requests);
  uint64_t drafted = 0, verified = 0, accepted = 0;
  *cut = 0;
  for (const auto& [id, r] : res) {
    SCOPED_TRACE(r.log_id);
    ASSERT_TRUE(r.final_event.finished);
    EXPECT_EQ(r.final_event.finish_reason, "length");
    ASSERT_FALSE(r.ids.empty());
    std::vector<int32_t> replay = {r.ids[0]};  // the prefill's token
    int32_t anchor = r.ids[0];
    int start = static_cast<int>(r.prompt_len);
    for (size_t k = 0; k < r.rounds.size(); ++k) {
      const EngineRound& e = r.rounds[k];
      const SpecRound& x = e.round;
      EXPECT_EQ(e.log_id, r.log_id);
      EXPECT_EQ(x.index, static_cast<int>(k));
      EXPECT_EQ(x.anchor, anchor);
      EXPECT_EQ(x.start, start);
      EXPECT_EQ(x.verify_len, static_cast<int>(x.draft_ids.size()) + 1);
      EXPECT_EQ(x.drafted, static_cast<int>(e.drafted_ids.size()));
      ASSERT_LE(x.draft_ids.size(), e.drafted_ids.size());
      EXPECT_TRUE(std::equal(x.draft_ids.begin(), x.draft_ids.end(), e.drafted_ids.begin()));
      if (confidence_head) {
        EXPECT_EQ(e.drafted_confidences.size(), e.drafted_ids.size());
        EXPECT_EQ(x.confidences.size(), x.draft_ids.size());
      }
      ASSERT_GE(x.accepted, 0);
      ASSERT_LE(x.accepted, static_cast<int>(x.draft_ids.size()));
      ASSERT_EQ(x.tokens.size(), static_cast<size_t>(x.accepted) + 1);
      EXPECT_TRUE(std::equal(x.draft_ids.begin(), x.draft_ids.begin() + x.accepted, x.tokens.begin()));
      EXPECT_EQ(x.tokens.back(), x.next_token);
      EXPECT_GE(x.committed, 1);
      EXPECT_LE(x.committed, x.accepted + 1);
      replay.insert(replay.end(), x.tokens.begin(), x.tokens.begin() + x.committed);
      anchor = x.next_token;
      start += x.accepted + 1;
      drafted += e.drafted_ids.size();
      verified += x.draft_ids.size();
      accepted += static_cast<uint64_t>(x.accepted);
      if (x.draft_ids.size() < e.drafted_ids.size()) ++*cut;
    }
    EXPECT_EQ(replay, r.ids) << "the rounds replay the output";
    // The final event's statistics hold every round, the last one (which finished the
    // request) included.
    EXPECT_EQ(r.final_event.spec.rounds, static_cast<int>(r.rounds.size()));
    int64_t committed = 0;
    for (const EngineRound& e : r.rounds) committed += e.round.committed;
    EXPECT_EQ(r.final_event.spec.committed, committed);
  }
  EXPECT_EQ(drafted, st.drafted_tokens);
  EXPECT_EQ(verified, st.verified_draft_tokens);
  EXPECT_EQ(accepted, st.accepted_draft_tokens);
}

const std::vector<std::string> kPrompts = {"#include <stdio.h>\n", "def fib(n):\n", "The kernel module",
                                           "int add(int a, int b)", "static void"};

}  // namespace

TEST(EngineRoundObserver, DSparkThresholdRoundsReplayEachRequest) {
  if (!std::filesystem::exists(kRoot + "/dspark/model.safetensors")) GTEST_SKIP() << "shipped DSpark absent";
  auto model = load_model(kRoot + "/target");
  auto tok = Tokenizer::load(kRoot + "/target");
  auto drafter = load_drafter(kRoot + "/dspark", *model);
  ASSERT_TRUE(drafter->info().confidence_head);
  auto cal = load_calibration(kRoot + "/dspark");
  EngineOptions o;
  o.max_running = 4;  // 5 requests: one waits, so batches change size
  o.drafter = drafter.get();
  o.calibration = cal ? &*cal : nullptr;
  o.policy = VerifyPolicy::Threshold;
  o.validation_threshold = 0.5f;
  EngineStats st;
  const auto res = run(o, *model, *tok, kPrompts, &st);
  int cut = 0;
  check(res, st, kPrompts.size(), true, &cut);
  EXPECT_GT(cut, 0) << "the threshold policy verified fewer drafts than drafted in some round";
  EXPECT_GT(st.accepted_draft_tokens, 0u);
}

TEST(EngineRoundObserver, PlainDecodingRoundsCommitOneTokenEach) {
  if (!std::filesystem::exists(kRoot + "/target/model.safetensors")) GTEST_SKIP() << "shipped models absent";
  auto model = load_model(kRoot + "/target");
  auto tok = Tokenizer::load(kRoot + "/target");
  EngineOptions o;
  o.max_running = 3;
  EngineStats st;
  const auto res = run(o, *model, *tok, {kPrompts[0], kPrompts[1], kPrompts[2]}, &st);
  int cut = 0;
  check(res, st, 3, false, &cut);
  EXPECT_EQ(cut, 0);
  for (const auto& [id, r] : res) {
    EXPECT_EQ(r.rounds.size() + 1, r.ids.size());
    for (const EngineRound& e : r.rounds) {
      EXPECT_EQ(e.round.verify_len, 1);
      EXPECT_EQ(e.round.drafted, 0);
      EXPECT_EQ(e.round.committed, 1);
    }
  }
}
