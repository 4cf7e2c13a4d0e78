// Tests of spec/verify (the lossless verification rule, drafters_spec.md §3) on hand-made
// logits rows and draft distributions over a handful of tokens:
//   - greedy: accept while the draft is the row's argmax, next token = argmax at the first
//     mismatch or after the last draft; no random numbers consumed;
//   - point-mass q (empty q) behaves exactly like an explicit one-hot q;
//   - statistical losslessness: drafts drawn from q, the first emitted token (and the first
//     two, jointly) follow the target distribution p; chi-square at the 0.999 quantile
//     (see chi_square.h for why fixed seeds and that bound);
//   - residual sampling after a forced rejection follows normalise(max(0, p - q)), with the
//     fallback to p when the residual has no mass;
//   - temperature/top-k/top-p: q built with the same transform as p keeps losslessness,
//     and q == p accepts every draft.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "chi_square.h"
#include "core/error.h"
#include "spec/verify.h"

using namespace dsinfer;
using dsinfer_test::chi_square;

namespace {

constexpr int V = 6;

// Logits whose softmax at temperature 1 is exactly `probs` (zeros become -inf-like).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p)) : -1e30f);
  return l;
}

SamplingParams temp1(uint64_t seed = 0) {
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = seed;
  return sp;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// First emitted token of one speculative round with drafts drawn from q (one row per draft).
int32_t first_emitted(const std::vector<float>& target_rows, const std::vector<float>& q, int n,
                      const SamplingParams& sp, Rng& rng, int32_t* second = nullptr) {
  std::vector<int32_t> drafts;
  for (int i = 0; i < n; ++i) {
    std::vector<float> qi(q.begin() + i * V, q.begin() + (i + 1) * V);
    drafts.push_back(sample_from(qi, rng));
  }
  VerifyResult v = verify_drafts(target_rows.data(), V, drafts, q, sp, rng);
  std::vector<int32_t> emitted(drafts.begin(), drafts.begin() + v.accepted);
  emitted.push_back(v.next_token);
  if (second) *second = emitted.size() > 1 ? emitted[1] : -1;
  return emitted[0];
}

}  // namespace

TEST(SpecVerify, GreedyAcceptsWhileArgmaxAndUsesNoRandomness) {
  // Rows' argmaxes: 2, 4, 1, 3.
  std::vector<float> rows = {0, 1, 5, 2, 0, 0,  //
                             0, 0, 1, 2, 9, 0,  //
                             0, 7, 1, 2, 3, 0,  //
                             1, 1, 1, 8, 1, 1};
  SamplingParams greedy;
  Rng rng(42), untouched(42);
  auto r = verify_drafts(rows.data(), V, {2, 4, 1}, {}, greedy, rng);
  EXPECT_EQ(r.accepted, 3);
  EXPECT_EQ(r.next_token, 3);  // bonus = argmax after the last draft
  r = verify_drafts(rows.data(), V, {2, 0, 1}, {}, greedy, rng);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_EQ(r.next_token, 4);  // argmax at the first mismatch
  r = verify_drafts(rows.data(), V, {5, 4, 1}, {}, greedy, rng);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.next_token, 2);
  r = verify_drafts(rows.data(), V, {}, {}, greedy, rng);  // no drafts: plain greedy
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.next_token, 2);
  // A q row given with greedy params does not change the rule.
  std::vector<float> q(2 * V, 1.0f / V);
  r = verify_drafts(rows.data(), V, {2, 4}, q, greedy, rng);
  EXPECT_EQ(r.accepted, 2);
  EXPECT_EQ(r.next_token, 1);
  EXPECT_EQ(rng.next_u64(), untouched.next_u64());
}

TEST(SpecVerify, NoDraftsIsPlainSampling) {
  std::vector<float> row = logits_of({0.1, 0.2, 0.3, 0.25, 0.1, 0.05});
  SamplingParams sp = temp1(9);
  Rng a(9);
  Sampler plain(sp);
  for (int t = 0; t < 200; ++t)
    EXPECT_EQ(verify_drafts(row.data(), V, {}, {}, sp, a).next_token, plain.sample(row.data(), V));
}

TEST(SpecVerify, PointMassEqualsExplicitOneHot) {
  std::vector<double> p0 = {0.1, 0.2, 0.3, 0.25, 0.1, 0.05}, p1 = {0.3, 0.1, 0.1, 0.1, 0.2, 0.2};
  std::vector<float> rows = logits_of(p0), r1 = logits_of(p1), r2 = logits_of(p0);
  rows.insert(rows.end(), r1.begin(), r1.end());
  rows.insert(rows.end(), r2.begin(), r2.end());
  std::vector<int32_t> drafts = {2, 0};
  std::vector<float> onehot(2 * V, 0.0f);
  onehot[2] = 1.0f;
  onehot[V + 0] = 1.0f;
  SamplingParams sp = temp1();
  int accepted_any = 0, rejected_any = 0;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    Rng a(seed), b(seed);
    auto x = verify_drafts(rows.data(), V, drafts, {}, sp, a);
    auto y = verify_drafts(rows.data(), V, drafts, onehot, sp, b);
    ASSERT_EQ(x.accepted, y.accepted);
    ASSERT_EQ(x.next_token, y.next_token);
    if (x.accepted == 0) {
      EXPECT_NE(x.next_token, 2) << "the residual excludes the rejected point mass";
    }
    accepted_any += x.accepted > 0;
    rejected_any += x.accepted < 2;
  }
  EXPECT_GT(accepted_any, 0);
  EXPECT_GT(rejected_any, 0);
}

TEST(SpecVerify, FirstTokenFollowsTargetForAnyDraftDistribution) {
  const std::vector<double> p = {0.05, 0.30, 0.10, 0.25, 0.0, 0.30};
  const std::vector<std::vector<double>> qs = {
      {0.40, 0.05, 0.30, 0.05, 0.15, 0.05},   // mostly disagrees, mass where p is 0
      {0.05, 0.30, 0.10, 0.25, 0.0, 0.30},    // q == p
      {0.0, 0.0, 0.0, 0.0, 1.0, 0.0},         // a point mass where p is 0: always rejected
      {1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6}};
  std::vector<float> target = logits_of(p);
  target.resize(2 * V);  // row 1 (after the draft) also p
  std::copy(target.begin(), target.begin() + V, target.begin() + V);
  const int trials = 40000;
  for (size_t c = 0; c < qs.size(); ++c) {
    std::vector<float> q(qs[c].begin(), qs[c].end());
    Rng rng(1000 + c);
    std::vector<int64_t> counts(V, 0);
    for (int t = 0; t < trials; ++t) counts[first_emitted(target, q, 1, temp1(), rng)]++;
    auto cs = chi_square(counts, p);
    EXPECT_TRUE(cs.pass()) << "q case " << c << ": " << cs.str();
  }
  // Point mass on a token p gives 0.30: accepted with probability 0.30 exactly.
  Rng rng(77);
  int acc = 0;
  for (int t = 0; t < trials; ++t) acc += verify_drafts(target.data(), V, {5}, {}, temp1(), rng).accepted;
  EXPECT_NEAR(static_cast<double>(acc) / trials, 0.30, 4 * std::sqrt(0.3 * 0.7 / trials));
}

TEST(SpecVerify, FirstTwoTokensJointlyFollowTarget) {
  // Context-free rows: token 1 ~ p0, token 2 ~ p1, so the joint must be p0 x p1. Two drafts
  // per round; when fewer than two tokens come out of the round, the second is drawn from
  // p1 by a plain (no-draft) verification, as the next round would.
  const std::vector<double> p0 = {0.25, 0.05, 0.30, 0.20, 0.10, 0.10}, p1 = {0.10, 0.40, 0.05, 0.05, 0.20, 0.20};
  const std::vector<double> q0 = {0.10, 0.30, 0.10, 0.30, 0.10, 0.10}, q1 = {0.30, 0.20, 0.20, 0.0, 0.10, 0.20};
  std::vector<float> rows = logits_of(p0), l1 = logits_of(p1);
  rows.insert(rows.end(), l1.begin(), l1.end());
  rows.insert(rows.end(), l1.begin(), l1.end());  // row 2 unused for the first two tokens
  std::vector<float> q(q0.begin(), q0.end());
  q.insert(q.end(), q1.begin(), q1.end());
  std::vector<int64_t> counts(V * V, 0);
  std::vector<double> joint(V * V);
  for (int a = 0; a < V; ++a)
    for (int b = 0; b < V; ++b) joint[a * V + b] = p0[a] * p1[b];
  Rng rng(5);
  for (int t = 0; t < 60000; ++t) {
    int32_t second = -1;
    int32_t first = first_emitted(rows, q, 2, temp1(), rng, &second);
    if (second < 0) second = verify_drafts(l1.data(), V, {}, {}, temp1(), rng).next_token;
    counts[first * V + second]++;
  }
  auto cs = chi_square(counts, joint);
  EXPECT_TRUE(cs.pass()) << cs.str();
}

TEST(SpecVerify, ResidualSamplingAfterRejection) {
  // Draft 4 has p = 0, so it is always rejected and the next token follows
  // normalise(max(0, p - q)).
  const std::vector<double> p = {0.10, 0.35, 0.15, 0.30, 0.0, 0.10}, qd = {0.20, 0.10, 0.05, 0.10, 0.50, 0.05};
  std::vector<double> res(V);
  double mass = 0;
  for (int i = 0; i < V; ++i) mass += res[i] = std::max(0.0, p[i] - qd[i]);
  for (double& r : res) r /= mass;
  std::vector<float> rows = logits_of(p), q(qd.begin(), qd.end());
  rows.resize(2 * V, 0.0f);
  Rng rng(3);
  std::vector<int64_t> counts(V, 0);
  for (int t = 0; t < 30000; ++t) {
    auto v = verify_drafts(rows.data(), V, {4}, q, temp1(), rng);
    ASSERT_EQ(v.accepted, 0);
    counts[v.next_token]++;
  }
  auto cs = chi_square(counts, res);
  EXPECT_TRUE(cs.pass()) << cs.str();
  EXPECT_EQ(counts[0], 0);  // p - q < 0 there
  EXPECT_EQ(counts[4], 0);

  // No residual mass (q >= p everywhere, here q = 2p, so alpha = 1/2): rejections fall back
  // to p itself.
  std::vector<float> q2;
  for (double x : p) q2.push_back(static_cast<float>(2 * x));
  std::vector<int64_t> after_reject(V, 0);
  int64_t rejections = 0;
  for (int t = 0; t < 40000; ++t) {
    auto v = verify_drafts(rows.data(), V, {1}, q2, temp1(), rng);
    if (v.accepted == 0) {
      after_reject[v.next_token]++;
      rejections++;
    }
  }
  EXPECT_NEAR(static_cast<double>(rejections) / 40000, 0.5, 0.02);
  auto cs2 = chi_square(after_reject, p);
  EXPECT_TRUE(cs2.pass()) << cs2.str();
}

TEST(SpecVerify, TemperatureTopKTopPAppliedIdentically) {
  const std::vector<float> target = {1.0f, 2.5f, 0.3f, 2.0f, 1.8f, -1.0f};
  const std::vector<float> draft_logits = {2.0f, 1.0f, 1.5f, 2.2f, 0.1f, 0.0f};
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_k = 4;
  sp.top_p = 0.9f;
  std::vector<float> p, q;
  sampling_distribution(target.data(), V, sp, p);
  sampling_distribution(draft_logits.data(), V, sp, q);
  std::vector<float> rows = target;
  rows.insert(rows.end(), target.begin(), target.end());
  Rng rng(8);
  std::vector<int64_t> counts(V, 0);
  for (int t = 0; t < 40000; ++t) counts[first_emitted(rows, q, 1, sp, rng)]++;
  auto cs = chi_square(counts, to_double(p));
  EXPECT_TRUE(cs.pass()) << cs.str();
  for (int i = 0; i < V; ++i) {
    if (p[i] == 0.0f) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside top-k/top-p";
    }
  }

  // The drafter applying the very same transform to the target's own logits: q == p, so
  // min(1, p/q) = 1 and every draft is accepted.
  Rng rng2(9);
  for (int t = 0; t < 2000; ++t) {
    int32_t d = sample_from(p, rng2);
    ASSERT_EQ(verify_drafts(rows.data(), V, {d}, p, sp, rng2).accepted, 1);
  }
}

TEST(SpecVerify, RejectsInconsistentInput) {
  std::vector<float> rows(3 * V, 0.0f);
  Rng rng(1);
  EXPECT_THROW(verify_drafts(rows.data(), V, {1, 2}, std::vector<float>(V, 0.1f), temp1(), rng), Error);
  EXPECT_THROW(verify_drafts(rows.data(), V, {1, V}, {}, temp1(), rng), Error);
  EXPECT_THROW(verify_drafts(rows.data(), V, {-1}, {}, SamplingParams{}, rng), Error);
}
