// Tests of speculative generation (engine/speculative + engine/generator) on the tiny
// random Qwen3 checkpoints committed with the transformers goldens (tests/data/qwen3/*,
// vocabularies of 256-512 tokens, so greedy output falls into loops that the n-gram
// drafter can predict), plus the demo model with a real tokenizer for stop strings.
//   - lossless greedy: ngram speculation gives exactly the plain greedy ids on 60 prompts,
//     and some drafts were accepted (the test is not vacuous);
//   - lossless sampling: a test-only drafter drawing from a distorted copy of the target
//     (q != p, top-k 3 so the joint space is small) gives the same joint distribution of
//     the first four tokens as plain sampling, whose exact probabilities are enumerated
//     from the model; chi-square at the 0.999 quantile (tests/unit/chi_square.h);
//   - rollback: after a round with a rejected draft the target KV cache and the next
//     token's logits are bit-identical to a fresh prefill of the committed text;
//   - a stop id (and a stop string) inside accepted drafts ends generation there;
//   - max_tokens is respected exactly whatever the drafter proposes;
//   - the per-round records (--log-dflash-details) agree with the statistics;
//   - --spec kind and --block-size checks.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "chi_square.h"
#include "cli_helpers.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/speculative.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "spec/ngram_drafter.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;
using json = nlohmann::json;

namespace {

const std::string kData = std::string(DSINFER_TEST_DATA) + "/qwen3";

// Proposes from the target model itself with distorted logits: z = scale * logits + bias,
// then the request's temperature/top-k/top-p, exactly like a real drafter would. q is the
// distribution each draft was drawn from. Keeps its own KV cache of committed positions.
class ModelDrafter : public Drafter {
 public:
  ModelDrafter(Model& m, int max_drafts, float scale, float bias_std, uint64_t seed) : m_(&m) {
    info_.kind = "test-model";
    info_.max_draft_tokens = max_drafts;
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.0f, bias_std);
    bias_.resize(static_cast<size_t>(m.config().vocab_size));
    for (auto& b : bias_) b = nd(g);
    scale_ = scale;
  }
  const DrafterInfo& info() const override { return info_; }
  struct Seq : DraftSequence {
    std::unique_ptr<KVCache> kv;
    int len = 0;
    int context_length() const override { return len; }
  };
  std::unique_ptr<DraftSequence> start() const override {
    auto s = std::make_unique<Seq>();
    s->kv = m_->make_kv_cache(1, 512);
    return s;
  }
  void commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const override {
    auto& s = static_cast<Seq&>(seq);
    EXPECT_EQ(hidden, nullptr);
    ForwardBatch b;
    b.entries.resize(1);
    b.entries[0].tokens.assign(tokens, tokens + c);
    ForwardOutput out;
    m_->forward(*s.kv, b, out);
    s.len += c;
  }
  DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                        Rng& rng) const override {
    auto& s = static_cast<Seq&>(seq);
    EXPECT_EQ(s.kv->length(0), s.len);
    DraftProposal p;
    const int V = m_->config().vocab_size;
    int32_t cur = anchor;
    std::vector<float> z(static_cast<size_t>(V)), q;
    for (int k = 0; k < max_tokens; ++k) {
      ForwardBatch b;
      b.entries.resize(1);
      b.entries[0].tokens = {cur};
      b.entries[0].logit_rows = {0};
      ForwardOutput out;
      m_->forward(*s.kv, b, out);
      for (int i = 0; i < V; ++i) z[i] = scale_ * out.logits[i] + bias_[i];
      sampling_distribution(z.data(), V, params, q);
      cur = sample_from(q, rng);
      p.tokens.push_back(cur);
      p.q.insert(p.q.end(), q.begin(), q.end());
    }
    s.kv->truncate(0, s.len);
    return p;
  }

 private:
  Model* m_;
  DrafterInfo info_;
  std::vector<float> bias_;
  float scale_ = 1.0f;
};

// Knows the reference continuation `ref` (prompt + plain greedy ids): proposes its next
// `good` tokens correctly and the rest wrong (point masses).
class OracleDrafter : public Drafter {
 public:
  OracleDrafter(std::vector<int32_t> ref, int max_drafts, int good, int vocab)
      : ref_(std::move(ref)), good_(good), vocab_(vocab) {
    info_.kind = "test-oracle";
    info_.max_draft_tokens = max_drafts;
  }
  const DrafterInfo& info() const override { return info_; }
  struct Seq : DraftSequence {
    std::vector<int32_t> toks;
    int context_length() const override { return static_cast<int>(toks.size()); }
  };
  std::unique_ptr<DraftSequence> start() const override { return std::make_unique<Seq>(); }
  void commit_context(DraftSequence& seq, const int32_t* tokens, const float*, int c) const override {
    auto& s = static_cast<Seq&>(seq);
    s.toks.insert(s.toks.end(), tokens, tokens + c);
  }
  DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams&,
                        Rng&) const override {
    auto& s = static_cast<Seq&>(seq);
    size_t pos = s.toks.size();  // the anchor's position
    EXPECT_EQ(ref_.at(pos), anchor);
    DraftProposal p;
    for (int k = 0; k < max_tokens && pos + 1 + k < ref_.size(); ++k) {
      int32_t t = ref_[pos + 1 + k];
      p.tokens.push_back(k < good_ ? t : (t + 1) % vocab_);
    }
    return p;
  }

 private:
  std::vector<int32_t> ref_;
  int good_, vocab_;
  DrafterInfo info_;
};

std::vector<std::vector<int32_t>> repetitive_prompts(int count, int vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    int period = 1 + static_cast<int>(g() % 5), reps = 2 + static_cast<int>(g() % 3);
    std::vector<int32_t> pat;
    for (int k = 0; k < period; ++k) pat.push_back(static_cast<int32_t>(3 + g() % (vocab - 3)));
    std::vector<int32_t> p;
    for (int r = 0; r < reps; ++r) p.insert(p.end(), pat.begin(), pat.end());
    if (g() % 2) p.push_back(static_cast<int32_t>(3 + g() % (vocab - 3)));
    out.push_back(p);
  }
  return out;
}

std::vector<float> last_logits(Model& m, const std::vector<int32_t>& ids) {
  auto kv = m.make_kv_cache(1, static_cast<int>(ids.size()) + 1);
  ForwardBatch b;
  b.entries.resize(1);
  b.entries[0].tokens = ids;
  b.entries[0].logit_rows = {static_cast<int>(ids.size()) - 1};
  ForwardOutput out;
  m.forward(*kv, b, out);
  return out.logits;
}

StopConditions budget(int n) {
  StopConditions s;
  s.max_tokens = n;
  return s;
}

}  // namespace

TEST(EngineSpeculative, NgramGreedyIsBitIdenticalToPlainGreedy) {
  int64_t accepted = 0, proposed = 0, prompts = 0;
  for (const char* name : {"yarn_gqa3", "tied_gqa2", "mha_bias_hd24"}) {
    auto model = load_model(kData + "/" + name);
    const int V = model->config().vocab_size;
    for (const auto& prompt : repetitive_prompts(20, V, 17 + prompts)) {
      NgramOptions no;
      no.max_draft_tokens = 1 + static_cast<int>(prompts % 8);
      NgramDrafter ngram(no);
      SpecOptions so;
      so.drafter = &ngram;
      SamplingParams greedy;
      auto plain = generate(*model, nullptr, prompt, greedy, budget(40));
      int rounds = 0;
      so.on_round = [&](const SpecRound& r) {
        EXPECT_EQ(r.index, rounds++);
        EXPECT_EQ(r.verify_len, static_cast<int>(r.draft_ids.size()) + 1);
        EXPECT_LE(static_cast<int>(r.draft_ids.size()), no.max_draft_tokens);
      };
      auto spec = generate(*model, nullptr, prompt, greedy, budget(40), {}, so);
      ASSERT_EQ(spec.ids, plain.ids) << name << " prompt " << prompts;
      EXPECT_EQ(spec.finish_reason, plain.finish_reason);
      EXPECT_EQ(spec.spec.rounds, rounds);
      EXPECT_EQ(spec.spec.committed + 1, static_cast<int64_t>(spec.ids.size()));
      for (size_t k = 0; k < spec.spec.proposed.size(); ++k) {
        EXPECT_LE(spec.spec.accepted[k], spec.spec.proposed[k]);
        if (k) {
          EXPECT_LE(spec.spec.proposed[k], spec.spec.proposed[k - 1]);
        }
        accepted += spec.spec.accepted[k];
        proposed += spec.spec.proposed[k];
      }
      EXPECT_EQ(plain.spec.rounds, static_cast<int>(plain.ids.size()) - 1);  // plain: one token per round
      EXPECT_DOUBLE_EQ(plain.spec.tau(), 1.0);
      prompts++;
    }
  }
  EXPECT_GE(prompts, 50);
  EXPECT_GT(accepted, 20) << "no draft was ever accepted: the test would be vacuous";
  EXPECT_LT(accepted, proposed) << "some drafts must also be rejected";
}

TEST(EngineSpeculative, SampledJointDistributionMatchesPlainSampling) {
  const int threads = ThreadPool::global().size();
  ThreadPool::set_global_threads(1);  // tiny matrices: threading would only add overhead
  auto model = load_model(kData + "/yarn_gqa3");
  const std::vector<int32_t> prompt = {17, 42, 99, 17, 42};
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 3;  // 3^4 = 81 joint outcomes for four tokens
  constexpr int kTokens = 4;

  // Exact distribution of plain sampling: product of the target's filtered conditionals.
  std::map<std::vector<int32_t>, double> exact;
  std::vector<float> p;
  std::function<void(std::vector<int32_t>, double)> walk = [&](std::vector<int32_t> prefix, double prob) {
    if (static_cast<int>(prefix.size()) == kTokens) {
      exact[prefix] = prob;
      return;
    }
    std::vector<int32_t> ctx = prompt;
    ctx.insert(ctx.end(), prefix.begin(), prefix.end());
    auto logits = last_logits(*model, ctx);
    sampling_distribution(logits.data(), static_cast<int>(logits.size()), sp, p);
    std::vector<float> probs = p;
    for (size_t t = 0; t < probs.size(); ++t)
      if (probs[t] > 0) {
        auto next = prefix;
        next.push_back(static_cast<int32_t>(t));
        walk(next, prob * probs[t]);
      }
  };
  walk({}, 1.0);
  ASSERT_EQ(exact.size(), 81u);

  auto fit = [&](const std::map<std::vector<int32_t>, int64_t>& counts) {
    std::vector<int64_t> c;
    std::vector<double> e;
    bool unknown = false;
    for (auto& [k, v] : counts) unknown |= !exact.count(k);
    for (auto& [k, pr] : exact) {
      e.push_back(pr);
      auto it = counts.find(k);
      c.push_back(it == counts.end() ? 0 : it->second);
    }
    auto cs = dsinfer_test::chi_square(c, e);
    cs.impossible |= unknown;
    return cs;
  };

  constexpr int kRuns = 12000;
  // A drafter from a distorted copy of the target: its top-3 overlaps the target's only in
  // part, so drafts are accepted, rejected by the ratio test, and rejected outright.
  ModelDrafter drafter(*model, 3, 0.5f, 0.15f, 99);
  std::map<std::vector<int32_t>, int64_t> spec_counts, plain_counts;
  int64_t accepted = 0, proposed = 0;
  for (int run = 0; run < kRuns; ++run) {
    sp.seed = 1000003ull * run + 7;
    SpecOptions so;
    so.drafter = &drafter;
    auto r = generate(*model, nullptr, prompt, sp, budget(kTokens), {}, so);
    ASSERT_EQ(static_cast<int>(r.ids.size()), kTokens);
    spec_counts[r.ids]++;
    for (size_t k = 0; k < r.spec.proposed.size(); ++k) accepted += r.spec.accepted[k], proposed += r.spec.proposed[k];
    auto plain = generate(*model, nullptr, prompt, sp, budget(kTokens));
    plain_counts[plain.ids]++;
  }
  const double rate = static_cast<double>(accepted) / static_cast<double>(proposed);
  EXPECT_GT(rate, 0.15) << "drafts must be accepted often enough to matter";
  EXPECT_LT(rate, 0.85) << "drafts must be rejected often enough to matter";
  auto cs = fit(spec_counts);
  EXPECT_TRUE(cs.pass()) << "speculative: " << cs.str() << " (acceptance " << rate << ")";
  auto cp = fit(plain_counts);
  EXPECT_TRUE(cp.pass()) << "plain (sanity check of the enumeration): " << cp.str();
  ThreadPool::set_global_threads(threads);
}

TEST(EngineSpeculative, RollbackLeavesTheCacheOfAFreshPrefill) {
  auto model = load_model(kData + "/tied_gqa2");
  const int V = model->config().vocab_size;
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 11, 12};
  SamplingParams greedy;
  auto plain = generate(*model, nullptr, prompt, greedy, budget(20));
  std::vector<int32_t> ref = prompt;
  ref.insert(ref.end(), plain.ids.begin(), plain.ids.end());
  for (int good : {0, 2, 4}) {
    OracleDrafter oracle(ref, 5, good, V);
    SpecOptions so;
    so.drafter = &oracle;
    SpecDecoder dec(*model, greedy, so, static_cast<int>(ref.size()));
    int32_t first = dec.prefill(prompt);
    ASSERT_EQ(first, plain.ids[0]);
    SpecRound& r = dec.round(10);
    ASSERT_EQ(r.draft_ids.size(), 5u);
    ASSERT_EQ(r.accepted, good);
    ASSERT_EQ(r.next_token, plain.ids[static_cast<size_t>(good) + 1]);  // the correction
    // Committed: prompt + first + accepted drafts; the correction is the next anchor.
    std::vector<int32_t> committed(ref.begin(), ref.begin() + static_cast<long>(prompt.size()) + 1 + good);
    ASSERT_EQ(dec.kv().length(0), static_cast<int>(committed.size()));
    auto fresh = model->make_kv_cache(1, 64);
    ForwardBatch b;
    b.entries.resize(1);
    b.entries[0].tokens = committed;
    ForwardOutput out;
    model->forward(*fresh, b, out);
    auto& a = dynamic_cast<DenseKVCache&>(dec.kv());
    auto& f = dynamic_cast<DenseKVCache&>(*fresh);
    for (int l = 0; l < a.n_layers(); ++l)
      for (int h = 0; h < a.n_kv_heads(); ++h) {
        size_t n = committed.size() * static_cast<size_t>(a.head_dim()) * sizeof(float);
        EXPECT_EQ(std::memcmp(a.k(l, 0) + h * a.head_stride(), f.k(l, 0) + h * f.head_stride(), n), 0)
            << "K layer " << l << " head " << h;
        EXPECT_EQ(std::memcmp(a.v(l, 0) + h * a.head_stride(), f.v(l, 0) + h * f.head_stride(), n), 0)
            << "V layer " << l << " head " << h;
      }
    // The next token's logits on the rolled-back cache equal those of a fresh prefill.
    b.entries[0].tokens = {r.next_token};
    b.entries[0].logit_rows = {0};
    model->forward(dec.kv(), b, out);
    auto full = committed;
    full.push_back(r.next_token);
    auto expect = last_logits(*model, full);
    ASSERT_EQ(out.logits.size(), expect.size());
    EXPECT_EQ(std::memcmp(out.logits.data(), expect.data(), expect.size() * sizeof(float)), 0);
  }
}

TEST(EngineSpeculative, StopIdInsideAcceptedDraftsEndsThere) {
  auto model = load_model(kData + "/yarn_gqa3");
  const int V = model->config().vocab_size;
  const std::vector<int32_t> prompt = {30, 31, 32, 33};
  SamplingParams greedy;
  auto plain = generate(*model, nullptr, prompt, greedy, budget(30));
  std::vector<int32_t> ref = prompt;
  ref.insert(ref.end(), plain.ids.begin(), plain.ids.end());
  // A token whose first occurrence is at output index k in 2..6: with an oracle proposing
  // 8 correct drafts, round 0 covers outputs 1..8, so index k is an accepted draft with
  // accepted drafts after it.
  int k = -1;
  for (int i = 2; i <= 6 && k < 0; ++i)
    if (std::find(plain.ids.begin(), plain.ids.begin() + i, plain.ids[i]) == plain.ids.begin() + i) k = i;
  ASSERT_GE(k, 0) << "greedy output repeats too early for this prompt";
  StopConditions stop = budget(30);
  stop.stop_ids = {plain.ids[k]};
  auto plain_stop = generate(*model, nullptr, prompt, greedy, stop);
  OracleDrafter oracle(ref, 8, 8, V);
  SpecOptions so;
  so.drafter = &oracle;
  std::vector<SpecRound> rounds;
  so.on_round = [&](const SpecRound& r) { rounds.push_back(r); };
  auto spec = generate(*model, nullptr, prompt, greedy, stop, {}, so);
  EXPECT_EQ(spec.ids, plain_stop.ids);
  EXPECT_EQ(spec.ids.size(), static_cast<size_t>(k) + 1);
  EXPECT_EQ(spec.finish_reason, "stop");
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].accepted, 8);
  EXPECT_EQ(rounds[0].committed, k);  // outputs 1..k; the later accepted drafts and the bonus are dropped
  EXPECT_EQ(spec.spec.committed, k);
}

TEST(EngineSpeculative, StopStringInsideAcceptedDraftsMatchesPlain) {
  std::string dir = dsinfer_test::make_temp_dir("spec_demo");
  auto mk = dsinfer_test::run_dsinfer({"make-random-model", "--like", "tiny", "--dtype", "f32", "--seed", "3",
                                       "--tokenizer", std::string(DSINFER_SOURCE_DIR) + "/models/demo-random", "--out",
                                       dir});
  ASSERT_EQ(mk.exit_code, 0) << mk.err;
  auto model = load_model(dir);
  auto tok = Tokenizer::load(dir);
  auto prompt = tok->encode("int main(void) {", false);
  SamplingParams greedy;
  auto full = generate(*model, tok.get(), prompt, greedy, budget(24));
  ASSERT_GE(full.text.size(), 8u);
  std::vector<int32_t> ref = prompt;
  ref.insert(ref.end(), full.ids.begin(), full.ids.end());
  StopConditions stop = budget(24);
  stop.stop_strings = {full.text.substr(full.text.size() / 2, 3)};
  auto plain = generate(*model, tok.get(), prompt, greedy, stop);
  OracleDrafter oracle(ref, 6, 6, model->config().vocab_size);
  SpecOptions so;
  so.drafter = &oracle;
  std::string streamed;
  auto spec = generate(*model, tok.get(), prompt, greedy, stop, [&](std::string_view s) { streamed += s; }, so);
  EXPECT_EQ(spec.ids, plain.ids);
  EXPECT_EQ(spec.text, plain.text);
  EXPECT_EQ(streamed, spec.text);
  EXPECT_EQ(spec.finish_reason, "stop");
  EXPECT_GT(spec.spec.accepted.at(0), 0);
}

TEST(EngineSpeculative, MaxTokensIsExact) {
  auto model = load_model(kData + "/tied_gqa2");
  const int V = model->config().vocab_size;
  const std::vector<int32_t> prompt = {7, 8, 9, 7, 8, 9, 7};
  SamplingParams greedy;
  auto plain = generate(*model, nullptr, prompt, greedy, budget(40));
  std::vector<int32_t> ref = prompt;
  ref.insert(ref.end(), plain.ids.begin(), plain.ids.end());
  OracleDrafter oracle(ref, 7, 7, V);  // always right: the budget is the only limit
  NgramDrafter ngram;
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  sampled.seed = 5;
  for (int n = 1; n <= 25; ++n) {
    for (const Drafter* d : {static_cast<const Drafter*>(&oracle), static_cast<const Drafter*>(&ngram)}) {
      SpecOptions so;
      so.drafter = d;
      auto r = generate(*model, nullptr, prompt, greedy, budget(n), {}, so);
      ASSERT_EQ(static_cast<int>(r.ids.size()), n) << d->info().kind;
      EXPECT_TRUE(std::equal(r.ids.begin(), r.ids.end(), plain.ids.begin())) << d->info().kind << " n=" << n;
      EXPECT_EQ(r.finish_reason, "length");
    }
    SpecOptions so;
    so.drafter = &ngram;
    auto s = generate(*model, nullptr, prompt, sampled, budget(n), {}, so);
    EXPECT_EQ(static_cast<int>(s.ids.size()), n);
  }
  // The reuse-depth cap limits drafts per round.
  SpecOptions so;
  so.drafter = &oracle;
  so.max_reuse_depth = 2;
  auto r = generate(*model, nullptr, prompt, greedy, budget(20), {}, so);
  EXPECT_EQ(r.ids, std::vector<int32_t>(plain.ids.begin(), plain.ids.begin() + 20));
  EXPECT_EQ(r.spec.proposed.size(), 2u);
  // 19 tokens after the first: six rounds of 2 drafts + bonus, then one round of 1.
  EXPECT_EQ(r.spec.rounds, 7);
  EXPECT_DOUBLE_EQ(r.spec.tau(), 19.0 / 7.0);
}

TEST(EngineSpeculative, RoundRecordsAsJsonLines) {
  auto model = load_model(kData + "/yarn_gqa3");
  NgramDrafter ngram;
  SpecOptions so;
  so.drafter = &ngram;
  std::vector<std::string> lines;
  so.on_round = [&](const SpecRound& r) { lines.push_back(spec_round_json(r)); };
  auto r = generate(*model, nullptr, {10, 11, 12, 10, 11, 12}, SamplingParams{}, budget(40), {}, so);
  ASSERT_EQ(static_cast<int>(lines.size()), r.spec.rounds);
  int64_t committed = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    json j = json::parse(lines[i]);
    EXPECT_EQ(j["round"], i);
    EXPECT_EQ(j["verify_len"].get<size_t>(), j["draft_ids"].size() + 1);
    EXPECT_LE(j["accepted"].get<size_t>(), j["draft_ids"].size());
    EXPECT_TRUE(j["confidences"].is_array());
    EXPECT_GE(j["draft_ms"].get<double>(), 0.0);
    EXPECT_GE(j["verify_ms"].get<double>(), 0.0);
    committed += j["committed"].get<int64_t>();
  }
  EXPECT_EQ(committed + 1, static_cast<int64_t>(r.ids.size()));
}

TEST(EngineSpeculative, DrafterKindAndBlockSizeChecks) {
  DrafterInfo zlab{"dflash", 16, 15, {1, 2}, 5, "", false};
  DrafterInfo deepspec{"dflash-deepspec", 7, 7, {1}, 5, "", false};
  DrafterInfo dspark{"dspark", 7, 7, {1}, 5, "vanilla", true};
  EXPECT_NO_THROW(check_drafter_kind("dflash", zlab));
  EXPECT_NO_THROW(check_drafter_kind("dflash", deepspec));
  EXPECT_NO_THROW(check_drafter_kind("dspark", dspark));
  EXPECT_THROW(check_drafter_kind("dspark", zlab), Error);
  EXPECT_THROW(check_drafter_kind("dflash", dspark), Error);
  try {
    check_drafter_kind("dflash", dspark);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dspark"), std::string::npos) << e.what();
  }
  EXPECT_EQ(drafts_for_block_size(zlab, 16), 15);
  EXPECT_EQ(drafts_for_block_size(zlab, 8), 7);
  EXPECT_EQ(drafts_for_block_size(deepspec, 4), 4);
  EXPECT_THROW(drafts_for_block_size(deepspec, 8), Error);
  EXPECT_THROW(drafts_for_block_size(zlab, 0), Error);
}
