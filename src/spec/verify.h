// dsinfer speculation floor: the lossless verification rule (drafters_spec.md §3).
//
// Data flow: the engine runs one target forward over [anchor, d_1..d_n] and hands the n+1
// logits rows here together with the drafter's proposal. Each target row is turned into
// the request's distribution p_i = sampling_distribution(row_i, params) (temperature,
// top-k, top-p applied exactly as the drafter applied them to its own rows), and the
// drafts are checked left to right:
//   greedy:   accept d_i while d_i == argmax(row_{i-1}); the next token is the argmax of
//             the first mismatching row (or of row n when everything was accepted).
//   sampling: accept d_i iff u_i < min(1, p_{i-1}(d_i) / max(q_i(d_i), 1e-8)) with u_i from
//             the request's Rng; at the first rejection the next token is drawn from the
//             normalised residual max(0, p_{i-1} - q_i) (p_{i-1} itself when the residual
//             mass is <= 1e-8); when all n are accepted it is drawn from p_n.
// An empty q means point masses on the drafts (q_i = one-hot(d_i)), handled exactly.
// With n == 0 this is plain sampling from row 0 with one uniform draw, so speculation with
// no drafter consumes the Rng exactly as the plain sampler does.
#pragma once
#include <cstdint>
#include <vector>

#include "sampling/sampler.h"

namespace dsinfer {

struct VerifyResult {
  int accepted = 0;        // length of the accepted draft prefix, 0..n
  int32_t next_token = 0;  // correction (after a rejection) or bonus token
};

// target_logits: row-major [n + 1, vocab]. drafts: d_1..d_n. q: empty (point masses) or
// row-major [n, vocab], q row i-1 being the distribution d_i was drawn from. Throws Error
// on inconsistent sizes or draft ids outside the vocabulary.
VerifyResult verify_drafts(const float* target_logits, int vocab, const std::vector<int32_t>& drafts,
                           const std::vector<float>& q, const SamplingParams& params, Rng& rng);

}  // namespace dsinfer
