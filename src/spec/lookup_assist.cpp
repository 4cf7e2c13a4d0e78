// dsinfer speculation floor: lookup assist (see lookup_assist.h).
#include "spec/lookup_assist.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsinfer {

int LookupStats::bucket(int match_len) {
  if (match_len <= 3) return std::max(match_len, 1) - 1;  // 1, 2, 3
  if (match_len <= 5) return 3;
  if (match_len <= 7) return 4;
  if (match_len <= 11) return 5;
  if (match_len <= 15) return 6;
  return 7;
}

void LookupStats::observe(int bucket, int accepted, int proposed, double decay) {
  if (bucket < 0 || bucket >= kBuckets) return;
  Bucket& b = b_[static_cast<size_t>(bucket)];
  proposed = std::min(proposed, kMaxDrafts);
  accepted = std::min(accepted, proposed);
  for (int k = 0; k < kMaxDrafts; ++k) {
    b.num[static_cast<size_t>(k)] *= decay;
    b.den[static_cast<size_t>(k)] *= decay;
    if (k < proposed) b.den[static_cast<size_t>(k)] += 1.0;
    if (k < accepted) b.num[static_cast<size_t>(k)] += 1.0;
  }
}

double LookupStats::survival(int bucket, int k) const {
  if (bucket < 0 || bucket >= kBuckets || k < 1 || k > kMaxDrafts) return 0.0;
  const Bucket& b = b_[static_cast<size_t>(bucket)];
  // One pessimistic pseudo-observation (a proposal that failed at once).
  return b.num[static_cast<size_t>(k - 1)] / (b.den[static_cast<size_t>(k - 1)] + 1.0);
}

LookupTracker::LookupTracker(const LookupAssistOptions& opts) : opts_(opts) {
  if (opts.max_match < 1) throw Error("lookup assist: max_match must be >= 1, got " + std::to_string(opts.max_match));
  if (opts.max_draft_tokens < 1)
    throw Error("lookup assist: max_draft_tokens must be >= 1, got " + std::to_string(opts.max_draft_tokens));
  if (!(opts.decay > 0.0 && opts.decay <= 1.0))
    throw Error("lookup assist: decay must be in (0, 1], got " + std::to_string(opts.decay));
}

void LookupTracker::commit(const int32_t* tokens, int n, LookupStats& stats) {
  if (n < 0) throw Error("lookup assist: commit of a negative token count");
  history_.insert(history_.end(), tokens, tokens + n);
  const int h = static_cast<int>(history_.size());
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    const int size = static_cast<int>(p.tokens.size());
    bool done = false;
    while (p.checked < size && p.first + p.checked < h) {
      if (history_[static_cast<size_t>(p.first + p.checked)] != p.tokens[static_cast<size_t>(p.checked)]) {
        done = true;
        break;
      }
      p.checked++;
    }
    if (done || p.checked == size) {
      stats.observe(p.bucket, p.checked, size, opts_.decay);
    } else {
      if (keep != i) pending_[keep] = std::move(p);
      keep++;
    }
  }
  pending_.resize(keep);
}

const LookupProposal& LookupTracker::propose(int32_t anchor, int max_tokens) {
  LookupProposal& out = last_;
  out.tokens.clear();
  out.match_len = 0;
  out.bucket = -1;
  const int budget = std::min(max_tokens, opts_.max_draft_tokens);
  const int h = static_cast<int>(history_.size());
  if (budget <= 0 || h == 0) return out;
  // The sequence is history + anchor (length h + 1); the suffix ends at the anchor. Find the
  // earlier end e with seq[e] == anchor whose backward match is longest (most recent wins
  // ties: e goes down and only a strictly longer match replaces the best).
  int best_end = -1, best_len = 0;
  for (int e = h - 1; e >= 0; --e) {
    if (history_[static_cast<size_t>(e)] != anchor) continue;
    int m = 1;
    while (m < opts_.max_match && e - m >= 0 && history_[static_cast<size_t>(e - m)] == history_[static_cast<size_t>(h - m)])
      ++m;
    if (m > best_len) {
      best_len = m;
      best_end = e;
      if (m >= opts_.max_match) break;
    }
  }
  if (best_end < 0) return out;
  // Copy what followed; past the end of history + anchor keep copying from the drafts.
  const int start = best_end + 1;
  for (int k = 0; k < budget; ++k) {
    const int pos = start + k;
    int32_t t;
    if (pos < h) t = history_[static_cast<size_t>(pos)];
    else if (pos == h) t = anchor;
    else t = out.tokens[static_cast<size_t>(pos - h - 1)];
    out.tokens.push_back(t);
  }
  out.match_len = best_len;
  out.bucket = LookupStats::bucket(best_len);
  if (pending_.size() >= 64) pending_.erase(pending_.begin());  // a caller that never commits
  pending_.push_back(Pending{h + 1, 0, out.bucket, out.tokens});
  return out;
}

void RoundCosts::observe_draft(double ms) {
  if (fixed_) return;
  if (draft_n_ > 0) ms = std::min(ms, kClip * draft_);
  draft_ = draft_n_ == 0 ? ms : draft_ + kSmoothing * (ms - draft_);
  draft_n_++;
}

void RoundCosts::set_fixed(double draft, double verify_one, double per_token) {
  fixed_ = true;
  draft_ = draft;
  draft_n_ = 1;
  fixed_a_ = verify_one;
  fixed_b_ = per_token;
  verify_n_ = 1;
}

void RoundCosts::observe_verify(int tokens, double ms) {
  if (fixed_ || tokens < 1) return;
  if (verify_n_ > 0) ms = std::min(ms, kClip * verify_ms(tokens));
  const double x = tokens - 1;
  s0_ = kForget * s0_ + 1.0;
  s1_ = kForget * s1_ + x;
  s2_ = kForget * s2_ + x * x;
  t0_ = kForget * t0_ + ms;
  t1_ = kForget * t1_ + x * ms;
  verify_n_++;
}

double RoundCosts::verify_ms(int tokens) const {
  const double x = std::max(tokens, 1) - 1;
  if (fixed_) return fixed_a_ + fixed_b_ * x;
  if (verify_n_ == 0) return 1.0 + 0.25 * x;
  const double mean_x = s1_ / s0_, mean_y = t0_ / s0_;
  const double var = s2_ / s0_ - mean_x * mean_x;
  // Too little spread in B to fit a slope: a row costs a quarter of a one-token verify.
  double b;
  if (var > 0.25) {
    b = std::max(0.0, (t1_ / s0_ - mean_x * mean_y) / var);
  } else {
    b = 0.25 * mean_y / (1.0 + 0.25 * mean_x);
  }
  const double a = std::max(mean_y - b * mean_x, 0.05 * mean_y);
  return a + b * x;
}

void DrafterYield::observe(int committed_tokens, int verify_len_tokens) {
  constexpr double kSmoothing = 0.2;
  if (rounds == 0) {
    tokens = committed_tokens;
    verify_len = verify_len_tokens;
  } else {
    tokens += kSmoothing * (committed_tokens - tokens);
    verify_len += kSmoothing * (verify_len_tokens - verify_len);
  }
  rounds++;
}

LookupChoice choose_lookup(const LookupStats& stats, const LookupProposal& p, const RoundCosts& costs,
                           const DrafterYield& yield) {
  LookupChoice c;
  if (p.tokens.empty() || p.bucket < 0) return c;
  double expected = 1.0, best_expected = 1.0;
  for (int l = 1; l <= static_cast<int>(p.tokens.size()); ++l) {
    expected += stats.survival(p.bucket, l);
    const double rate = expected / costs.verify_ms(1 + l);
    if (rate > c.lookup_rate) {
      c.lookup_rate = rate;
      c.verify_drafts = l;
      best_expected = expected;
    }
  }
  if (!costs.has_draft()) {
    c.use = best_expected >= yield.tokens;
    return c;
  }
  const int vlen = std::max(1, static_cast<int>(yield.verify_len + 0.5));
  c.drafter_rate = yield.tokens / (costs.draft_ms() + costs.verify_ms(vlen));
  c.use = c.lookup_rate >= c.drafter_rate;
  return c;
}

}  // namespace dsinfer
