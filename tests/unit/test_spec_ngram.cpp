// Tests of spec/ngram_drafter: longest suffix first, most recent earlier occurrence,
// continuation copied past the end of the history (repeating patterns), budget caps,
// min n-gram length, no match -> no drafts, point-mass proposals, option validation.
#include <gtest/gtest.h>

#include "core/error.h"
#include "spec/ngram_drafter.h"

using namespace dsinfer;

namespace {
std::vector<int32_t> propose(const NgramDrafter& d, const std::vector<int32_t>& history, int32_t anchor, int max) {
  auto seq = d.start();
  d.commit_context(*seq, history.data(), nullptr, static_cast<int>(history.size()));
  EXPECT_EQ(seq->context_length(), static_cast<int>(history.size()));
  Rng rng(0);
  DraftProposal p = d.propose(*seq, anchor, max, SamplingParams{}, rng);
  EXPECT_TRUE(p.q.empty());
  EXPECT_TRUE(p.confidence.empty());
  return p.tokens;
}
}  // namespace

TEST(SpecNgram, InfoAndDefaults) {
  NgramDrafter d;
  EXPECT_EQ(d.info().kind, "ngram");
  EXPECT_TRUE(d.info().target_layer_ids.empty());
  EXPECT_EQ(d.info().max_draft_tokens, 8);
  EXPECT_EQ(d.options().max_ngram, 3);
  EXPECT_EQ(d.options().min_ngram, 1);
}

TEST(SpecNgram, LongestSuffixWinsOverMoreRecentShorterOne) {
  NgramDrafter d;
  // history + anchor = 3 9 7 1 8 9 7 2 3 9 [7]: "3 9 7" occurs at 0 (then 1 8 ...), while
  // the shorter "9 7" occurs more recently at 5 (then 2).
  EXPECT_EQ(propose(d, {3, 9, 7, 1, 8, 9, 7, 2, 3, 9}, 7, 3), (std::vector<int32_t>{1, 8, 9}));
}

TEST(SpecNgram, MostRecentOccurrenceAndPeriodicContinuation) {
  NgramOptions o;
  o.max_ngram = 1;
  NgramDrafter d(o);
  // Suffix "1": most recent earlier occurrence at index 2 -> 6, then the anchor 1, then
  // the drafts themselves (6 1 6 ...).
  EXPECT_EQ(propose(d, {1, 5, 1, 6}, 1, 5), (std::vector<int32_t>{6, 1, 6, 1, 6}));
  NgramDrafter d3;
  EXPECT_EQ(propose(d3, {1, 2, 3, 4, 1, 2}, 3, 6), (std::vector<int32_t>{4, 1, 2, 3, 4, 1}));
}

TEST(SpecNgram, BudgetsMinLengthAndNoMatch) {
  NgramOptions o;
  o.max_draft_tokens = 2;
  NgramDrafter d(o);
  EXPECT_EQ(propose(d, {1, 2, 3, 4, 1, 2}, 3, 6).size(), 2u);  // option cap
  EXPECT_EQ(propose(d, {1, 2, 3, 4, 1, 2}, 3, 1).size(), 1u);  // call cap
  EXPECT_TRUE(propose(d, {1, 2, 3, 4, 1, 2}, 3, 0).empty());
  EXPECT_TRUE(propose(d, {1, 2, 3}, 4, 4).empty());  // anchor never seen
  EXPECT_TRUE(propose(d, {}, 4, 4).empty());
  NgramOptions o2;
  o2.min_ngram = 2;
  NgramDrafter d2(o2);
  EXPECT_TRUE(propose(d2, {5, 1, 6}, 1, 4).empty());  // only a 1-gram match
  EXPECT_EQ(propose(d2, {5, 1, 6, 5}, 1, 2), (std::vector<int32_t>{6, 5}));
}

TEST(SpecNgram, CommitsAccumulateAndProposalsAreDeterministic) {
  NgramDrafter d;
  auto seq = d.start();
  std::vector<int32_t> a = {4, 5, 6}, b = {7, 4, 5};
  d.commit_context(*seq, a.data(), nullptr, 3);
  d.commit_context(*seq, b.data(), nullptr, 3);
  EXPECT_EQ(seq->context_length(), 6);
  Rng r1(1), r2(2);
  auto p1 = d.propose(*seq, 6, 4, SamplingParams{}, r1);
  auto p2 = d.propose(*seq, 6, 4, SamplingParams{}, r2);
  EXPECT_EQ(p1.tokens, (std::vector<int32_t>{7, 4, 5, 6}));
  EXPECT_EQ(p1.tokens, p2.tokens);
  EXPECT_EQ(seq->context_length(), 6);  // propose commits nothing
}

TEST(SpecNgram, RejectsBadOptions) {
  NgramOptions o;
  o.min_ngram = 0;
  EXPECT_THROW(NgramDrafter{o}, Error);
  o.min_ngram = 3;
  o.max_ngram = 2;
  EXPECT_THROW(NgramDrafter{o}, Error);
  o = NgramOptions{};
  o.max_draft_tokens = 0;
  EXPECT_THROW(NgramDrafter{o}, Error);
}
