// The reduced draft vocabulary (spec/draft_vocab.h):
//   - ranking: counts → ids by count (ties by id), the JSON round trip, and one-line refusals
//     naming the file and field for every malformed ranking;
//   - load_drafter resolution: --draft-vocab N without a ranking is refused by name; 0 keeps
//     the whole vocabulary; a ranking's default_size applies when N is not given;
//   - per-sequence extras: committed ids outside the subset join once each, with their rows;
//   - the shipped DSpark drafter with a reduced vocabulary: at the first draft position its
//     logits are exactly the whole-vocabulary drafter's at the allowed ids (subset ∪ the
//     sequence's ids), so the greedy draft is the argmax over those; sampled drafts stay
//     inside them and their q rows are distributions that are zero elsewhere;
//   - lossless: greedy speculative decoding with the reduced vocabulary reproduces plain
//     greedy decoding on held-out prompts (DSpark and z-lab DFlash).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "error_test_util.h"
#include "engine/generator.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "spec/dflash_backbone.h"
#include "spec/draft_vocab.h"
#include "spec/drafter_loader.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer {
namespace {

const std::string kRoot = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("dsinfer_dv_" + std::to_string(::getpid()) + "_" + name)).string();
}

using test::error_of;

TEST(DraftVocab, RanksByCountThenId) {
  const DraftVocabRanking r = rank_token_counts({3, 0, 5, 3, 1});
  EXPECT_EQ(r.ranked_ids, (std::vector<int32_t>{2, 0, 3, 4, 1}));
  EXPECT_EQ(r.counts, (std::vector<uint64_t>{5, 3, 3, 1, 0}));
  EXPECT_EQ(r.total_tokens, 12u);
  EXPECT_EQ(draft_vocab_subset(r, 3), (std::vector<int32_t>{0, 2, 3}));  // ascending
  EXPECT_DOUBLE_EQ(draft_vocab_coverage(r, 2), 8.0 / 12.0);
  EXPECT_NE(error_of([&] { draft_vocab_subset(r, 0); }).find("--draft-vocab"), std::string::npos);
  EXPECT_NE(error_of([&] { draft_vocab_subset(r, 6); }).find("--draft-vocab"), std::string::npos);
}

TEST(DraftVocab, FileRoundTripAndRefusals) {
  DraftVocabRanking r = rank_token_counts({1, 7, 2, 0});
  r.default_size = 2;
  r.source = "unit test";
  const std::string path = tmp_path("ok.json");
  write_draft_vocab(path, r);
  const DraftVocabRanking back = read_draft_vocab(path, 4);
  EXPECT_EQ(back.ranked_ids, r.ranked_ids);
  EXPECT_EQ(back.counts, r.counts);
  EXPECT_EQ(back.default_size, 2);
  EXPECT_EQ(back.source, "unit test");
  EXPECT_EQ(back.total_tokens, 10u);
  // Another vocabulary size: refused, naming the file and the field.
  std::string e = error_of([&] { read_draft_vocab(path, 5); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("ranked_ids"), std::string::npos) << e;
  std::filesystem::remove(path);

  const auto bad = [&](const std::string& text, const std::string& field) {
    const std::string p = tmp_path("bad.json");
    std::ofstream(p) << text;
    const std::string err = error_of([&] { read_draft_vocab(p, 4); });
    EXPECT_NE(err.find(p), std::string::npos) << text << " -> " << err;
    EXPECT_NE(err.find(field), std::string::npos) << text << " -> " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    std::filesystem::remove(p);
  };
  bad(R"({"ranked_ids": [0, 1, 2, 2]})", "ranked_ids");      // duplicate
  bad(R"({"ranked_ids": [0, 1, 2, 4]})", "ranked_ids");      // out of range
  bad(R"({"ranked_ids": [0, 1, "x", 3]})", "ranked_ids");    // not an integer
  bad(R"({"counts": [1, 1, 1, 1]})", "ranked_ids");          // missing
  bad(R"({"ranked_ids": [0, 1, 2, 3], "counts": [1, 2, 0, 0]})", "counts");  // not descending
  bad(R"({"ranked_ids": [0, 1, 2, 3], "counts": [1, 0]})", "counts");        // wrong length
  bad(R"({"ranked_ids": [0, 1, 2, 3], "default_size": 5})", "default_size");
  bad(R"({"ranked_ids": [0, 1, 2, 3], "default_size": -1})", "default_size");
  bad(R"({"ranked_ids": [0, 1, 2, 3],)", "invalid JSON");
}

TEST(DraftVocab, ExtrasCollectCommittedIdsOutsideTheSubsetOnce) {
  // A 6 x 2 BF16 "head" whose row i holds (i, 100 + i).
  std::vector<uint16_t> rows;
  for (int i = 0; i < 6; ++i)
    for (float v : {static_cast<float>(i), 100.0f + i}) {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      rows.push_back(static_cast<uint16_t>(b >> 16));
    }
  WeightView head;
  head.data = rows.data();
  head.dtype = DType::BF16;
  head.rows = 6;
  head.cols = 2;
  const DraftVocab dv({1, 4}, 6);
  DraftVocabExtras x;
  const std::vector<int32_t> toks{4, 5, 1, 0, 5, 0, 3};
  dv.add_context(x, toks.data(), static_cast<int>(toks.size()), head, nullptr);
  EXPECT_EQ(x.ids, (std::vector<int32_t>{5, 0, 3}));
  ASSERT_EQ(x.head_rows.size(), 3u * 2 * 2);
  const uint16_t* got = reinterpret_cast<const uint16_t*>(x.head_rows.data());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 2; ++c) EXPECT_EQ(got[r * 2 + c], rows[static_cast<size_t>(x.ids[r]) * 2 + c]);
  EXPECT_EQ(dv.token(0, x), 1);
  EXPECT_EQ(dv.token(1, x), 4);
  EXPECT_EQ(dv.token(2, x), 5);
  EXPECT_EQ(dv.token(4, x), 3);
  EXPECT_NE(error_of([] { DraftVocab({3, 1}, 6); }).find("ascending"), std::string::npos);
}

bool have(const std::string& sub) { return std::filesystem::exists(kRoot + "/" + sub + "/model.safetensors"); }

// A ranking file over the shipped tokenizer: ids by descending id (an arbitrary but fixed
// order, so the subset is certain to miss ids the prompts use).
std::string write_test_ranking(int V, int default_size) {
  std::vector<uint64_t> counts(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) counts[static_cast<size_t>(i)] = static_cast<uint64_t>(i) + 1;
  DraftVocabRanking r = rank_token_counts(counts);
  r.default_size = default_size;
  const std::string p = tmp_path("rank.json");
  write_draft_vocab(p, r);
  return p;
}

TEST(DraftVocab, LoaderResolvesSizeAndRefusesByName) {
  if (!have("target") || !have("dspark")) GTEST_SKIP() << "shipped DSpark absent";
  auto target = load_model(kRoot + "/target");
  const int V = target->config().vocab_size;
  const std::string rank = write_test_ranking(V, 300);
  DrafterOptions o;
  o.draft_vocab_size = 0;
  EXPECT_EQ(load_drafter(kRoot + "/dspark", *target, o)->info().draft_vocab, 0);
  o.draft_vocab_file = rank;
  o.draft_vocab_size = -1;  // the file's default
  EXPECT_EQ(load_drafter(kRoot + "/dspark", *target, o)->info().draft_vocab, 300);
  o.draft_vocab_size = 100;
  EXPECT_EQ(load_drafter(kRoot + "/dspark", *target, o)->info().draft_vocab, 100);
  o.draft_vocab_size = V;  // all of it: the whole-vocabulary path
  EXPECT_EQ(load_drafter(kRoot + "/dspark", *target, o)->info().draft_vocab, 0);
  o.draft_vocab_size = V + 1;
  EXPECT_NE(error_of([&] { load_drafter(kRoot + "/dspark", *target, o); }).find("--draft-vocab"), std::string::npos);
  o.draft_vocab_file = tmp_path("missing.json");
  o.draft_vocab_size = 10;
  std::string e = error_of([&] { load_drafter(kRoot + "/dspark", *target, o); });
  EXPECT_NE(e.find("--draft-vocab-file"), std::string::npos) << e;
  EXPECT_NE(e.find("missing.json"), std::string::npos) << e;
  std::filesystem::remove(rank);
}

// Commits a prompt's positions (tokens + captured target rows) to a fresh draft sequence.
std::unique_ptr<DraftSequence> committed(Model& target, const Drafter& d, const std::vector<int32_t>& prompt) {
  auto kv = target.make_kv_cache(1, 1024);
  ForwardBatch b;
  b.capture_layers = d.info().target_layer_ids;
  b.entries.push_back(ForwardEntry{0, prompt, {static_cast<int>(prompt.size()) - 1}});
  ForwardOutput out;
  target.forward(*kv, b, out);
  auto seq = d.start();
  d.commit_context(*seq, prompt.data(), out.captured.data(), static_cast<int>(prompt.size()));
  return seq;
}

std::vector<int32_t> heldout_prompt(const Tokenizer& tok, int line) {
  std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/models/eval/heldout_code.jsonl");
  std::string s;
  for (int i = 0; i <= line; ++i) std::getline(in, s);
  auto ids = tok.encode(nlohmann::json::parse(s).at("prompt").get<std::string>(), false);
  ids.resize(std::min<size_t>(ids.size(), 200));
  return ids;
}

TEST(DraftVocab, ReducedDSparkDraftsAreTheWholeDrafterRestricted) {
  if (!have("target") || !have("dspark")) GTEST_SKIP() << "shipped DSpark absent";
  auto target = load_model(kRoot + "/target");
  auto tok = Tokenizer::load(kRoot + "/target");
  const int V = target->config().vocab_size;
  const std::string rank = write_test_ranking(V, 0);
  DrafterOptions full_o, red_o;
  full_o.draft_vocab_size = 0;
  red_o.draft_vocab_file = rank;
  red_o.draft_vocab_size = 512;
  auto full = load_drafter(kRoot + "/dspark", *target, full_o);
  auto red = load_drafter(kRoot + "/dspark", *target, red_o);
  ASSERT_EQ(red->info().draft_vocab, 512);
  const auto* full_b = dynamic_cast<const BlockDrafter*>(full.get());
  const auto* red_b = dynamic_cast<const BlockDrafter*>(red.get());
  ASSERT_TRUE(full_b && red_b);
  const std::vector<int32_t> prompt = heldout_prompt(*tok, 1);
  // Allowed ids: the subset (the 512 highest ids) and the prompt's ids.
  std::set<int32_t> allowed(prompt.begin(), prompt.end());
  for (int i = V - 512; i < V; ++i) allowed.insert(i);
  auto fs = committed(*target, *full, prompt);
  auto rs = committed(*target, *red, prompt);
  const int32_t anchor = prompt.back();
  Rng r1(1), r2(1);
  DraftDebug fd, rd;
  full_b->propose_debug(*fs, anchor, SamplingParams{}, r1, fd);
  const DraftProposal rp = red_b->propose_debug(*rs, anchor, SamplingParams{}, r2, rd);
  ASSERT_EQ(rd.vocab, static_cast<int>(allowed.size()));
  // Position 0 (previous token = the anchor on both sides): the same logits at every allowed
  // id, bit for bit, and the draft is their argmax (lowest id on ties).
  const auto& xs = dynamic_cast<const DraftContext&>(*rs).vocab_extras;
  const DraftVocab dv(draft_vocab_subset(read_draft_vocab(rank, V), 512), V);
  int32_t best = -1;
  for (int c = 0; c < rd.vocab; ++c) {
    const int32_t id = dv.token(c, xs);
    ASSERT_TRUE(allowed.count(id)) << id;
    const float a = fd.draft_logits[static_cast<size_t>(id)], b = rd.draft_logits[static_cast<size_t>(c)];
    EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << "id " << id << ": " << a << " vs " << b;
    if (best < 0 || a > fd.draft_logits[static_cast<size_t>(best)] ||
        (a == fd.draft_logits[static_cast<size_t>(best)] && id < best))
      best = id;
  }
  EXPECT_EQ(rp.tokens[0], best);
  for (int32_t t : rp.tokens) EXPECT_TRUE(allowed.count(t)) << t;
  // The confidences do not depend on the vocabulary at position 0.
  EXPECT_EQ(rd.confidence_logits[0], fd.confidence_logits[0]);

  // Sampled: drafts stay inside the allowed ids; each q row is a distribution over them.
  SamplingParams sp;
  sp.temperature = 1.0f;
  Rng r3(5);
  const DraftProposal sp_p = red->propose(*rs, anchor, 8, sp, r3);
  ASSERT_EQ(sp_p.q.size(), sp_p.tokens.size() * static_cast<size_t>(V));
  for (size_t k = 0; k < sp_p.tokens.size(); ++k) {
    EXPECT_TRUE(allowed.count(sp_p.tokens[k]));
    double sum = 0;
    for (int j = 0; j < V; ++j) {
      const float q = sp_p.q[k * V + j];
      if (!allowed.count(j)) {
        EXPECT_EQ(q, 0.0f) << "id " << j;
      }
      sum += q;
    }
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_GT(sp_p.q[k * V + sp_p.tokens[k]], 0.0f);
  }
  std::filesystem::remove(rank);
}

TEST(DraftVocab, GreedySpeculationWithAReducedVocabularyIsLossless) {
  if (!have("target") || !have("dspark") || !have("dflash-zlab")) GTEST_SKIP() << "shipped drafters absent";
  auto target = load_model(kRoot + "/target");
  auto tok = Tokenizer::load(kRoot + "/target");
  const std::string rank = write_test_ranking(target->config().vocab_size, 0);
  StopConditions stop;
  stop.max_tokens = 64;
  for (const char* name : {"dspark", "dflash-zlab"}) {
    DrafterOptions o;
    o.draft_vocab_file = rank;
    o.draft_vocab_size = 256;
    auto d = load_drafter(kRoot + "/" + name, *target, o);
    ASSERT_EQ(d->info().draft_vocab, 256);
    SpecOptions so;
    so.drafter = d.get();
    for (int p = 0; p < 4; ++p) {
      const std::vector<int32_t> prompt = heldout_prompt(*tok, p);
      const auto plain = generate(*target, tok.get(), prompt, SamplingParams{}, stop);
      const auto spec = generate(*target, tok.get(), prompt, SamplingParams{}, stop, {}, so);
      EXPECT_EQ(spec.ids, plain.ids) << name << " prompt " << p;
      EXPECT_GT(spec.spec.rounds, 0);
    }
  }
  std::filesystem::remove(rank);
}

}  // namespace
}  // namespace dsinfer
