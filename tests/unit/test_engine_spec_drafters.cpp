// Losslessness of speculative decoding with the real DFlash/DSpark drafters (the tiny
// checkpoints of tests/data/drafters, made by tools/reference/gen_drafter_goldens.py):
//  - greedy: for every drafter case, speculative output ids equal plain greedy ids on 50
//    prompts each, and drafts do get accepted (the test is not vacuous);
//  - sampling: the joint distribution of the first three generated tokens under
//    speculative sampling with the DSpark (Markov head) and z-lab drafters matches the
//    exact plain-sampling distribution enumerated from the target (chi-square);
//  - rollback: after rounds with rejected drafts, the drafter's context equals one built
//    from a fresh prefill of the committed text (identical next proposal, bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "engine/generator.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "spec/drafter_loader.h"
#include "spec/verify.h"

using namespace dsinfer;
namespace fs = std::filesystem;

namespace {

const std::string kRoot = std::string(DSINFER_TEST_DATA) + "/drafters";

std::vector<std::string> cases() {
  std::vector<std::string> out;
  if (!fs::exists(kRoot)) return out;
  for (const auto& e : fs::directory_iterator(kRoot))
    if (fs::exists(e.path() / "draft" / "config.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> random_prompt(Rng& rng, int vocab, int32_t mask) {
  int len = 1 + static_cast<int>(rng.next_u64() % 14);
  std::vector<int32_t> p;
  while (static_cast<int>(p.size()) < len) {
    int32_t t = 3 + static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab - 3));
    if (t != mask) p.push_back(t);
  }
  return p;
}

}  // namespace

TEST(SpecDraftersLossless, GreedyEqualsPlainOn50PromptsPerDrafter) {
  auto dirs = cases();
  if (dirs.empty()) GTEST_SKIP() << kRoot << " absent";
  int64_t accepted_total = 0;
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    auto target = load_model(dir + "/target");
    auto drafter = load_drafter(dir + "/draft", *target);
    SpecOptions so;
    so.drafter = drafter.get();
    Rng rng(2024);
    int64_t accepted = 0;
    for (int i = 0; i < 50; ++i) {
      auto prompt = random_prompt(rng, target->config().vocab_size, drafter->info().mask_token_id);
      StopConditions stop;
      stop.max_tokens = 20;
      SamplingParams greedy;
      auto plain = generate(*target, nullptr, prompt, greedy, stop);
      auto spec = generate(*target, nullptr, prompt, greedy, stop, {}, so);
      ASSERT_EQ(spec.ids, plain.ids) << "prompt " << i;
      for (auto a : spec.spec.accepted) accepted += a;
    }
    accepted_total += accepted;
    std::printf("[ lossless ] %s: 50 prompts, %lld accepted drafts\n", fs::path(dir).filename().c_str(),
                static_cast<long long>(accepted));
  }
  EXPECT_GT(accepted_total, 100);
}

namespace {

// Exact probability of each (t1, t2, t3) under plain sampling with `sp` (top-k keeps the
// space small): p(t1) p(t2 | t1) p(t3 | t1 t2), from target forwards.
std::map<std::vector<int32_t>, double> exact_joint(Model& target, const std::vector<int32_t>& prompt,
                                                   const SamplingParams& sp) {
  std::map<std::vector<int32_t>, double> out;
  std::function<void(std::vector<int32_t>, double)> rec = [&](std::vector<int32_t> gen, double p) {
    if (gen.size() == 3) {
      out[gen] = p;
      return;
    }
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), gen.begin(), gen.end());
    auto kv = target.make_kv_cache(1, static_cast<int>(seq.size()) + 1);
    ForwardBatch b;
    b.entries.push_back({0, seq, {static_cast<int>(seq.size()) - 1}});
    ForwardOutput o;
    target.forward(*kv, b, o);
    std::vector<float> probs;
    sampling_distribution(o.logits.data(), o.vocab_size, sp, probs);
    for (int t = 0; t < o.vocab_size; ++t)
      if (probs[t] > 0) {
        auto g = gen;
        g.push_back(t);
        rec(g, p * probs[t]);
      }
  };
  rec({}, 1.0);
  return out;
}

}  // namespace

TEST(SpecDraftersLossless, SamplingJointOfFirstThreeTokensMatchesTarget) {
  int tested = 0;
  for (const char* name : {"dspark_vanilla", "dspark_rnn", "zlab_dflash_default_layers"}) {
    const std::string dir = kRoot + "/" + name;
    if (!fs::exists(dir + "/draft/config.json")) continue;
    SCOPED_TRACE(dir);
    auto target = load_model(dir + "/target");
    auto drafter = load_drafter(dir + "/draft", *target);
    const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
    SamplingParams sp;
    // The fixture models are sharply peaked (clear greedy margins); a high temperature
    // spreads the mass so that drafts are both accepted and rejected.
    sp.temperature = 4.0f;
    sp.top_k = 3;  // 27 joint outcomes; top-k is applied identically to target and draft
    auto exact = exact_joint(*target, prompt, sp);
    ASSERT_EQ(exact.size(), 27u);
    SpecOptions so;
    so.drafter = drafter.get();
    const int runs = 6000;
    std::map<std::vector<int32_t>, int> counts;
    int64_t accepted = 0, proposed = 0;
    for (int r = 0; r < runs; ++r) {
      sp.seed = 1000003ull * static_cast<uint64_t>(r) + 17;
      StopConditions stop;
      stop.max_tokens = 3;
      auto res = generate(*target, nullptr, prompt, sp, stop, {}, so);
      ASSERT_EQ(res.ids.size(), 3u);
      counts[res.ids]++;
      for (auto a : res.spec.accepted) accepted += a;
      for (auto p : res.spec.proposed) proposed += p;
    }
    // Pearson chi-square against the exact distribution; outcomes with expected count < 5
    // are pooled into one cell. The seeds are fixed, so the statistic is a fixed number;
    // the bound is the chi-square 0.999 quantile for the resulting degrees of freedom
    // (Wilson-Hilferty approximation), which a correct sampler meets.
    double chi2 = 0, pooled_e = 0;
    int pooled_o = 0, cells = 0;
    for (const auto& [k, p] : exact) {
      double e = p * runs;
      int o = counts.count(k) ? counts[k] : 0;
      if (e < 5) {
        pooled_e += e;
        pooled_o += o;
        continue;
      }
      chi2 += (o - e) * (o - e) / e;
      cells++;
    }
    if (pooled_e > 0) {
      chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
      cells++;
    }
    const double df = cells - 1, z = 3.0902;  // z of the 0.999 quantile
    const double bound = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
    std::printf("[ lossless ] %s sampling: chi2 %.2f (df %.0f, bound %.2f), %lld/%lld drafts accepted\n", name, chi2,
                df, bound, static_cast<long long>(accepted), static_cast<long long>(proposed));
    EXPECT_LT(chi2, bound);
    EXPECT_GT(accepted, 0) << "no draft accepted: the test would not exercise verification";
    EXPECT_LT(accepted, proposed) << "no draft rejected: the residual path would not be exercised";
    tested++;
  }
  if (!tested) GTEST_SKIP() << "drafter fixtures absent";
}

TEST(SpecDraftersRollback, DraftContextEqualsFreshPrefillOfCommittedText) {
  for (const char* name : {"dspark_vanilla", "deepspec_dflash", "zlab_dflash_default_layers"}) {
    const std::string dir = kRoot + "/" + name;
    if (!fs::exists(dir + "/draft/config.json")) continue;
    SCOPED_TRACE(dir);
    auto target = load_model(dir + "/target");
    auto drafter = load_drafter(dir + "/draft", *target);
    const auto& info = drafter->info();
    const int H = target->config().hidden_size, m = static_cast<int>(info.target_layer_ids.size());
    SamplingParams greedy;
    Rng rng(1);
    // Live sequence: prefill, then three rounds of propose / verify / commit.
    std::vector<int32_t> text = {5, 6, 7, 8, 9, 10, 11};
    auto kv = target->make_kv_cache(1, 256);
    auto seq = drafter->start();
    ForwardBatch b;
    b.capture_layers = info.target_layer_ids;
    b.entries.push_back({0, text, {static_cast<int>(text.size()) - 1}});
    ForwardOutput o;
    target->forward(*kv, b, o);
    drafter->commit_context(*seq, text.data(), o.captured.data(), static_cast<int>(text.size()));
    int32_t anchor = argmax(o.logits.data(), o.vocab_size);
    int rejected_rounds = 0;
    for (int round = 0; round < 3; ++round) {
      DraftProposal p = drafter->propose(*seq, anchor, info.max_draft_tokens, greedy, rng);
      std::vector<int32_t> verify = {anchor};
      verify.insert(verify.end(), p.tokens.begin(), p.tokens.end());
      const int start = kv->length(0);
      b.entries[0].tokens = verify;
      b.entries[0].logit_rows.clear();
      for (int i = 0; i < static_cast<int>(verify.size()); ++i) b.entries[0].logit_rows.push_back(i);
      target->forward(*kv, b, o);
      int acc = 0;
      while (acc < static_cast<int>(p.tokens.size()) &&
             argmax(o.logits.data() + static_cast<size_t>(acc) * o.vocab_size, o.vocab_size) == p.tokens[acc])
        acc++;
      if (acc < static_cast<int>(p.tokens.size())) rejected_rounds++;
      int32_t next = argmax(o.logits.data() + static_cast<size_t>(acc) * o.vocab_size, o.vocab_size);
      kv->truncate(0, start + acc + 1);
      drafter->commit_context(*seq, verify.data(), o.captured.data(), acc + 1);
      text.insert(text.end(), verify.begin(), verify.begin() + acc + 1);
      anchor = next;
    }
    // Fresh: one prefill of everything committed, one commit of all its rows.
    auto kv2 = target->make_kv_cache(1, 256);
    auto fresh = drafter->start();
    ForwardBatch b2;
    b2.capture_layers = info.target_layer_ids;
    b2.entries.push_back({0, text, {static_cast<int>(text.size()) - 1}});
    ForwardOutput o2;
    target->forward(*kv2, b2, o2);
    ASSERT_EQ(o2.captured.size(), text.size() * static_cast<size_t>(m) * H);
    drafter->commit_context(*fresh, text.data(), o2.captured.data(), static_cast<int>(text.size()));
    EXPECT_EQ(argmax(o2.logits.data(), o2.vocab_size), anchor);
    EXPECT_EQ(fresh->context_length(), seq->context_length());
    Rng r1(9), r2(9);
    DraftProposal live = drafter->propose(*seq, anchor, info.max_draft_tokens, greedy, r1);
    DraftProposal again = drafter->propose(*fresh, anchor, info.max_draft_tokens, greedy, r2);
    EXPECT_EQ(live.tokens, again.tokens);
    EXPECT_EQ(live.confidence, again.confidence);  // bit-identical floats
    EXPECT_EQ(live.confidence_logits, again.confidence_logits);
    // Sampled proposals (q rows) from both states are identical too.
    SamplingParams sp;
    sp.temperature = 0.9f;
    Rng r3(5), r4(5);
    DraftProposal ls = drafter->propose(*seq, anchor, info.max_draft_tokens, sp, r3);
    DraftProposal fs2 = drafter->propose(*fresh, anchor, info.max_draft_tokens, sp, r4);
    EXPECT_EQ(ls.tokens, fs2.tokens);
    EXPECT_EQ(ls.q, fs2.q);
    std::printf("[ rollback ] %s: %d of 3 rounds had rejected drafts\n", name, rejected_rounds);
  }
}
