// dsinfer speculation floor: lookup assist — suffix-lookup proposals that stand in for a
// model drafter's proposal (DFlash, DSpark) in the rounds where they are expected to pay
// more, the way SuffixDecoding pairs a suffix index with a model speculator.
//
// Why: a model drafter costs a forward pass every round; copying the continuation of an
// earlier occurrence of the current suffix costs nothing and, where the text repeats (code,
// lists, a small model's loops, quoting the prompt), is accepted further than any drafter.
// Verification stays the same rule, so output is unchanged (lossless): only which proposal
// gets verified is chosen here.
//
// Data flow for one sequence (driven by engine/):
//   LookupTracker::commit(committed tokens) — prompt, then each round's anchor + accepted
//     drafts — appends to the sequence's history and scores earlier proposals against it;
//   LookupTracker::propose(anchor) finds the longest suffix of history + anchor (up to
//     max_match tokens) that occurred before, most recent occurrence on ties, and proposes
//     the tokens that followed it (continuing from its own drafts past the end, so a loop of
//     period p runs on). The proposal is remembered and, as the tokens it guessed get
//     committed, scored: accepted = length of its prefix that matches what was committed.
//     That is the acceptance it has (or would have had) under verification — exactly for
//     greedy, in distribution for sampling, since a point-mass draft d is accepted with
//     probability p(d) — so every round teaches LookupStats, whichever proposal ran.
//   LookupStats keeps, per match-length bucket, decayed counts of how far proposals
//     survived: survival(b, k) = P(drafts 1..k all accepted | match in bucket b).
//   choose_lookup() weighs the lookup's expected tokens per millisecond (best verify length,
//     no drafter pass) against the drafter's recent tokens per millisecond (RoundCosts:
//     measured drafter and verify times), and says whether to verify the lookup instead.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsinfer {

struct LookupAssistOptions {
  int max_match = 16;        // longest suffix compared (longer matches share the last bucket)
  int max_draft_tokens = 8;  // drafts a lookup proposal holds at most
  double decay = 0.98;       // weight kept by old evidence per new scored proposal (per bucket)
};

// Acceptance evidence per match-length bucket: 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16+.
class LookupStats {
 public:
  static constexpr int kBuckets = 8;
  static constexpr int kMaxDrafts = 16;
  static int bucket(int match_len);

  // A scored proposal: `proposed` drafts, the first `accepted` of them right.
  void observe(int bucket, int accepted, int proposed, double decay);
  // P(drafts 1..k all accepted) for a proposal in `bucket` that holds >= k drafts. Starts at
  // 0 (one pessimistic pseudo-observation): the lookup earns its rounds with evidence.
  double survival(int bucket, int k) const;
  // Scored proposals (decayed) in the bucket.
  double evidence(int bucket) const { return b_[static_cast<size_t>(bucket)].den[0]; }

 private:
  struct Bucket {
    std::array<double, kMaxDrafts> num{};  // num[k-1]: proposals with accepted >= k
    std::array<double, kMaxDrafts> den{};  // den[k-1]: proposals with proposed >= k
  };
  std::array<Bucket, kBuckets> b_{};
};

struct LookupProposal {
  std::vector<int32_t> tokens;  // d_1..d_n (n = 0: the suffix never occurred before)
  int match_len = 0;            // tokens of history + anchor matched
  int bucket = -1;
};

// One sequence's history and its proposals awaiting scoring.
class LookupTracker {
 public:
  explicit LookupTracker(const LookupAssistOptions& opts = {});
  // Appends committed tokens and scores pending proposals against them into `stats`.
  void commit(const int32_t* tokens, int n, LookupStats& stats);
  // The proposal following `anchor` (not yet committed: it sits at position history size).
  // Remembered for scoring when it holds drafts.
  const LookupProposal& propose(int32_t anchor, int max_tokens);
  int history_size() const { return static_cast<int>(history_.size()); }
  const LookupAssistOptions& options() const { return opts_; }

 private:
  struct Pending {
    int first = 0;  // history index d_1 will take
    int checked = 0;
    int bucket = 0;
    std::vector<int32_t> tokens;
  };
  LookupAssistOptions opts_;
  std::vector<int32_t> history_;
  std::vector<Pending> pending_;
  LookupProposal last_;
};

// Measured costs of a round's two parts (ms): a drafter pass (commit + propose) and a
// verify forward of B tokens. Verify time is fitted as a + b * (B - 1) by least squares with
// exponential forgetting over every measured round, so lengths measured rarely (or never)
// borrow from the others; a drafter pass is an exponential moving average. A measurement
// more than 3x the current estimate (a first round's page faults, a preempted thread) is
// clipped to 3x, so one outlier cannot swing the choice for many rounds.
class RoundCosts {
 public:
  void observe_draft(double ms);
  void observe_verify(int tokens, double ms);
  // Fixed costs instead of measurements (reproducible decisions): a drafter pass, a
  // one-token verify, and each further verified token.
  void set_fixed(double draft, double verify_one, double per_token);
  bool has_draft() const { return draft_n_ > 0; }
  double draft_ms() const { return draft_; }
  // Before any verify was measured: relative units (1 + 0.25 (B - 1)).
  double verify_ms(int tokens) const;

 private:
  static constexpr double kSmoothing = 0.2;  // drafter EMA weight of a new pass
  static constexpr double kForget = 0.95;    // verify fit: weight kept by old rounds per new one
  static constexpr double kClip = 3.0;
  double draft_ = 0.0;
  int draft_n_ = 0;
  bool fixed_ = false;
  double fixed_a_ = 0.0, fixed_b_ = 0.0;
  // Weighted sums over rounds of x = B - 1 and y = ms: w, w x, w x^2, w y, w x y.
  double s0_ = 0.0, s1_ = 0.0, s2_ = 0.0, t0_ = 0.0, t1_ = 0.0;
  int verify_n_ = 0;
};

// The drafter's recent yield: tokens committed per drafter round and drafts verified per
// drafter round (EMAs; priors until the first drafter rounds are measured).
struct DrafterYield {
  double tokens = 3.0;
  double verify_len = 5.0;
  int rounds = 0;
  void observe(int committed_tokens, int verify_len_tokens);
};

struct LookupChoice {
  bool use = false;
  int verify_drafts = 0;        // lookup drafts to verify when used
  double lookup_rate = 0.0;     // expected tokens per ms of the lookup round
  double drafter_rate = 0.0;    // tokens per ms of a drafter round, from DrafterYield
};

// Whether to verify the lookup proposal this round instead of running the drafter: the best
// prefix length l >= 1 maximises (1 + sum_{k<=l} survival(b, k)) / verify_ms(1 + l); the
// lookup is used when that rate is at least the drafter's (yield.tokens / (draft_ms +
// verify_ms(yield.verify_len))). Before the drafter has been timed, the lookup is used only
// when its expected tokens reach the drafter's prior yield.
LookupChoice choose_lookup(const LookupStats& stats, const LookupProposal& p, const RoundCosts& costs,
                           const DrafterYield& yield);

}  // namespace dsinfer
