// dsinfer sampling: greedy, temperature, top-k, top-p with a deterministic RNG.
#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.h"
#include "kernels/cpu/argmax.h"

namespace dsinfer {

void validate_sampling_params(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    throw Error("temperature: must be a finite number >= 0, got " + std::to_string(p.temperature));
  if (p.top_k < 0) throw Error("top_k: must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) throw Error("top_p: must be in (0, 1], got " + std::to_string(p.top_p));
}

int32_t argmax(const float* logits, int n) { return argmax_f32(logits, n); }

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

void sampling_distribution(const float* logits, int n, const SamplingParams& p, std::vector<float>& probs) {
  probs.assign(static_cast<size_t>(n), 0.0f);
  if (n <= 0) return;
  if (p.greedy()) {
    probs[static_cast<size_t>(argmax(logits, n))] = 1.0f;
    return;
  }
  // Candidate set: all ids, or the top-k by logit (ties broken by lower id).
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t k = (p.top_k > 0 && p.top_k < n) ? static_cast<size_t>(p.top_k) : static_cast<size_t>(n);
  if (k < idx.size()) {
    std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), by_logit);
    idx.resize(k);
  } else if (p.top_p < 1.0f) {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  // Softmax over the candidates at the given temperature, in double for stability.
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  double mx = -INFINITY;
  for (int32_t i : idx) mx = std::max(mx, static_cast<double>(logits[i]) * inv_t);
  std::vector<double> e(idx.size());
  double sum = 0.0;
  for (size_t j = 0; j < idx.size(); ++j) {
    e[j] = std::exp(static_cast<double>(logits[idx[j]]) * inv_t - mx);
    sum += e[j];
  }
  size_t keep = idx.size();
  if (p.top_p < 1.0f) {
    // Smallest prefix (sorted by probability) whose mass reaches top_p; always >= 1 token.
    double cum = 0.0;
    for (size_t j = 0; j < idx.size(); ++j) {
      cum += e[j] / sum;
      if (cum >= static_cast<double>(p.top_p)) {
        keep = j + 1;
        break;
      }
    }
    double kept = 0.0;
    for (size_t j = 0; j < keep; ++j) kept += e[j];
    sum = kept;
  }
  for (size_t j = 0; j < keep; ++j) probs[static_cast<size_t>(idx[j])] = static_cast<float>(e[j] / sum);
}

int32_t sample_from(const std::vector<float>& probs, Rng& rng) {
  double u = rng.uniform();
  double total = 0.0;
  for (float x : probs) total += x;
  double target = u * total, cum = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    last_nonzero = static_cast<int32_t>(i);
    cum += probs[i];
    if (target < cum) return static_cast<int32_t>(i);
  }
  return last_nonzero;  // rounding left u*total at the very top
}

int32_t Sampler::sample(const float* logits, int n) {
  if (params_.greedy()) return argmax(logits, n);
  sampling_distribution(logits, n, params_, probs_);
  return sample_from(probs_, rng_);
}

}  // namespace dsinfer
