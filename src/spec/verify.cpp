// dsinfer speculation floor: lossless verification of a draft proposal (see verify.h).
#include "spec/verify.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsinfer {

VerifyResult verify_drafts(const float* target_logits, int vocab, const std::vector<int32_t>& drafts,
                           const std::vector<float>& q, const SamplingParams& params, Rng& rng) {
  const int n = static_cast<int>(drafts.size());
  if (vocab <= 0) throw Error("verify: vocabulary size must be > 0");
  if (!q.empty() && q.size() != static_cast<size_t>(n) * static_cast<size_t>(vocab))
    throw Error("verify: draft distributions have " + std::to_string(q.size()) + " values, expected " +
                std::to_string(n) + " x " + std::to_string(vocab) + " (or none for point masses)");
  for (int i = 0; i < n; ++i)
    if (drafts[i] < 0 || drafts[i] >= vocab)
      throw Error("verify: draft " + std::to_string(i + 1) + " token id " + std::to_string(drafts[i]) +
                  " outside the vocabulary [0, " + std::to_string(vocab) + ")");
  auto row = [&](int i) { return target_logits + static_cast<size_t>(i) * static_cast<size_t>(vocab); };

  VerifyResult res;
  if (params.greedy()) {
    // p and q are one-hot: alpha is 1 iff the draft is the target argmax, and the residual
    // is one-hot on that argmax. No random numbers are used.
    for (int i = 0; i < n; ++i) {
      int32_t best = argmax(row(i), vocab);
      if (drafts[i] != best) {
        res.accepted = i;
        res.next_token = best;
        return res;
      }
    }
    res.accepted = n;
    res.next_token = argmax(row(n), vocab);
    return res;
  }

  std::vector<float> p;
  for (int i = 0; i < n; ++i) {
    sampling_distribution(row(i), vocab, params, p);
    const int32_t d = drafts[i];
    const float* qi = q.empty() ? nullptr : q.data() + static_cast<size_t>(i) * static_cast<size_t>(vocab);
    const double qd = qi ? static_cast<double>(qi[d]) : 1.0;
    const double alpha = std::min(1.0, static_cast<double>(p[d]) / std::max(qd, 1e-8));
    const double u = rng.uniform();
    if (u < alpha) continue;
    // Rejected: draw from the normalised residual max(0, p - q).
    res.accepted = i;
    std::vector<float> r(p.size());
    double mass = 0.0;
    for (int j = 0; j < vocab; ++j) {
      const double qj = qi ? static_cast<double>(qi[j]) : (j == d ? 1.0 : 0.0);
      const double v = std::max(0.0, static_cast<double>(p[j]) - qj);
      r[j] = static_cast<float>(v);
      mass += v;
    }
    res.next_token = mass <= 1e-8 ? sample_from(p, rng) : sample_from(r, rng);
    return res;
  }
  sampling_distribution(row(n), vocab, params, p);
  res.accepted = n;
  res.next_token = sample_from(p, rng);
  return res;
}

}  // namespace dsinfer
