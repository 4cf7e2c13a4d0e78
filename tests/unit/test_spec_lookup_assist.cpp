// The lookup assist (spec/lookup_assist.h): the tracker proposes the continuation of the
// longest (then most recent) earlier occurrence of the current suffix, keeps a loop going
// past the end of the history, scores every proposal against what gets committed (whether
// or not it was verified), and choose_lookup weighs the learned survival against measured
// costs. The end-to-end property (output unchanged, lookup rounds taken where text repeats)
// is tested on the shipped models in test_engine_shipped_drafters.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "spec/lookup_assist.h"

using namespace dsinfer;

namespace {
void commit(LookupTracker& t, LookupStats& s, std::vector<int32_t> ids) {
  t.commit(ids.data(), static_cast<int>(ids.size()), s);
}
}  // namespace

TEST(LookupAssist, ProposesAfterTheLongestMatchMostRecentOnTies) {
  LookupTracker t;
  LookupStats s;
  // "7 1 2 3 | 9 2 3 | 5 2 3": anchor 3 after history ending "... 1 2": the suffix "1 2 3"
  // occurred once (followed by 9), "2 3" three times; the longest match wins.
  commit(t, s, {7, 1, 2, 3, 9, 2, 3, 5, 1, 2});
  const LookupProposal& p = t.propose(3, 4);
  EXPECT_EQ(p.match_len, 3);
  EXPECT_EQ(p.bucket, LookupStats::bucket(3));
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{9, 2, 3, 5}));

  // Ties: "4" occurs twice with a match of one token; the most recent one is followed by 8.
  LookupTracker u;
  commit(u, s, {4, 6, 1, 4, 8, 0});
  EXPECT_EQ(u.propose(4, 1).tokens, (std::vector<int32_t>{8}));
  // Never seen: no proposal.
  EXPECT_TRUE(u.propose(42, 4).tokens.empty());
}

TEST(LookupAssist, ContinuesALoopPastTheEndOfTheHistory) {
  LookupTracker t;
  LookupStats s;
  commit(t, s, {1, 2, 3, 1, 2});
  // history + anchor = 1 2 3 1 2 3: period 3 continues from its own drafts.
  EXPECT_EQ(t.propose(3, 7).tokens, (std::vector<int32_t>{1, 2, 3, 1, 2, 3, 1}));
}

TEST(LookupAssist, ScoresEveryProposalAgainstWhatIsCommitted) {
  LookupTracker t;
  LookupStats s;
  commit(t, s, {1, 2, 3, 4, 5, 6, 1, 2});
  const LookupProposal p = t.propose(3, 4);  // "1 2 3" matched: proposes 4 5 6 1
  ASSERT_EQ(p.tokens, (std::vector<int32_t>{4, 5, 6, 1}));
  EXPECT_EQ(s.evidence(p.bucket), 0.0);
  // The round commits the anchor and two tokens that agree, then one that does not: the
  // proposal scores 2 accepted of 4, spread over two commits.
  commit(t, s, {3, 4});
  EXPECT_EQ(s.evidence(p.bucket), 0.0);  // not decided yet: everything so far matched
  commit(t, s, {5, 7});
  EXPECT_DOUBLE_EQ(s.evidence(p.bucket), 1.0);
  // One pessimistic pseudo-observation: survival(k) = accepted>=k / (proposed>=k + 1).
  EXPECT_DOUBLE_EQ(s.survival(p.bucket, 1), 0.5);
  EXPECT_DOUBLE_EQ(s.survival(p.bucket, 2), 0.5);
  EXPECT_DOUBLE_EQ(s.survival(p.bucket, 3), 0.0);
  EXPECT_DOUBLE_EQ(s.survival(p.bucket, 4), 0.0);
}

TEST(LookupAssist, AFullyRightProposalIsScoredWhenItsLastTokenIsCommitted) {
  LookupTracker t;
  LookupStats s;
  commit(t, s, {1, 2, 3, 4, 1, 2});
  const LookupProposal p = t.propose(3, 2);  // 4 1
  ASSERT_EQ(p.tokens, (std::vector<int32_t>{4, 1}));
  commit(t, s, {3, 4, 1});
  EXPECT_DOUBLE_EQ(s.evidence(p.bucket), 1.0);
  EXPECT_DOUBLE_EQ(s.survival(p.bucket, 2), 0.5);
  // Decay: older evidence weighs less, so a bucket follows a sequence that changes regime.
  LookupStats d;
  for (int i = 0; i < 50; ++i) d.observe(2, 4, 4, 0.9);
  for (int i = 0; i < 50; ++i) d.observe(2, 0, 4, 0.9);
  EXPECT_LT(d.survival(2, 1), 0.01);
}

TEST(LookupAssist, ChoosesTheLookupOnlyWhereItOutYieldsTheDrafter) {
  LookupStats s;
  for (int i = 0; i < 20; ++i) s.observe(5, 6, 8, 1.0);  // long matches: 6 of 8 accepted
  for (int i = 0; i < 20; ++i) s.observe(0, 0, 8, 1.0);  // one-token matches: never right
  RoundCosts c;
  c.observe_draft(1.0);
  for (int b = 1; b <= 9; ++b) c.observe_verify(b, 1.0 + 0.3 * (b - 1));
  DrafterYield y;
  y.observe(4, 6);  // the drafter commits 4 tokens per round verifying 6

  LookupProposal strong;
  strong.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  strong.match_len = 9;
  strong.bucket = LookupStats::bucket(9);
  ASSERT_EQ(strong.bucket, 5);
  const LookupChoice a = choose_lookup(s, strong, c, y);
  EXPECT_TRUE(a.use);
  // Verifying past the 6 drafts that always survive only adds cost: the best prefix is 6.
  EXPECT_EQ(a.verify_drafts, 6);
  EXPECT_GT(a.lookup_rate, a.drafter_rate);

  LookupProposal weak = strong;
  weak.match_len = 1;
  weak.bucket = 0;
  EXPECT_FALSE(choose_lookup(s, weak, c, y).use);
  LookupProposal none;
  EXPECT_FALSE(choose_lookup(s, none, c, y).use);

  // A drafter that yields as much at no extra cost keeps its rounds.
  RoundCosts free_draft = c;
  free_draft.observe_draft(0.0);
  for (int i = 0; i < 40; ++i) free_draft.observe_draft(0.0);
  DrafterYield great;
  great.observe(9, 9);
  EXPECT_FALSE(choose_lookup(s, strong, free_draft, great).use);
}

TEST(LookupAssist, VerifyCostsAreALinearFitOverEveryRound) {
  RoundCosts c;
  EXPECT_DOUBLE_EQ(c.verify_ms(1), 1.0);  // nothing measured: relative units
  c.observe_verify(2, 2.0);
  c.observe_verify(6, 4.0);
  // Through both points: 1.5 ms + 0.5 ms per token beyond the first.
  EXPECT_NEAR(c.verify_ms(4), 3.0, 1e-9);
  EXPECT_NEAR(c.verify_ms(6), 4.0, 1e-9);
  EXPECT_NEAR(c.verify_ms(9), 5.5, 1e-9);
  EXPECT_NEAR(c.verify_ms(1), 1.5, 1e-9);
  c.observe_verify(6, 5.0);  // newer rounds weigh more
  EXPECT_GT(c.verify_ms(6), 4.0);
  EXPECT_LT(c.verify_ms(6), 5.0);

  // One length only: no slope to fit, a row costs a quarter of a one-token verify.
  RoundCosts one;
  one.observe_verify(1, 2.0);
  EXPECT_NEAR(one.verify_ms(5), 4.0, 1e-9);

  // An outlier (a first round's page faults) is clipped to 3x the estimate.
  RoundCosts o;
  for (int i = 0; i < 20; ++i)
    for (int b = 2; b <= 6; ++b) o.observe_verify(b, 1.0 + 0.2 * (b - 1));
  const double before = o.verify_ms(3);
  o.observe_verify(3, 1000.0);
  EXPECT_LT(o.verify_ms(3), 1.2 * before);
  o.observe_draft(1.0);
  o.observe_draft(1000.0);
  EXPECT_LE(o.draft_ms(), 1.0 + 0.2 * 2.0 + 1e-9);

  // Fixed costs ignore measurements.
  RoundCosts f;
  f.set_fixed(1.0, 1.0, 0.25);
  f.observe_verify(3, 100.0);
  f.observe_draft(100.0);
  EXPECT_DOUBLE_EQ(f.verify_ms(5), 2.0);
  EXPECT_DOUBLE_EQ(f.draft_ms(), 1.0);
}

TEST(LookupAssist, RefusesBadOptionsByName) {
  LookupAssistOptions o;
  o.max_match = 0;
  EXPECT_THROW({ LookupTracker t(o); }, Error);
  o = {};
  o.max_draft_tokens = 0;
  EXPECT_THROW({ LookupTracker t(o); }, Error);
  o = {};
  o.decay = 0.0;
  EXPECT_THROW({ LookupTracker t(o); }, Error);
}
