// dsinfer sampling: turns one row of logits into a token.
// Greedy (temperature 0) is argmax with the lowest id winning ties. Otherwise logits are
// divided by the temperature, restricted by top-k then top-p (nucleus), normalised, and
// one token is drawn with a seeded 64-bit generator, so a (seed, logits) sequence always
// gives the same tokens. `distribution` exposes the exact filtered probabilities, which
// speculative rejection sampling needs for both target and draft.
#pragma once
#include <cstdint>
#include <vector>

namespace dsinfer {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0f; }
};

// Throws Error naming the parameter when a value is out of range.
void validate_sampling_params(const SamplingParams& p);

int32_t argmax(const float* logits, int n);

// Deterministic RNG (splitmix64 seeding + xoshiro256**): identical streams on every
// platform, unlike std:: distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next_u64();
  double uniform();  // [0, 1) with 53 random bits
 private:
  uint64_t s_[4];
};

// Filtered, normalised distribution over the vocabulary (zeros outside top-k / top-p).
// For greedy params it is one-hot on the argmax.
void sampling_distribution(const float* logits, int n, const SamplingParams& p, std::vector<float>& probs);

// Draws from a normalised distribution with one uniform number.
int32_t sample_from(const std::vector<float>& probs, Rng& rng);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  int32_t sample(const float* logits, int n);
  const SamplingParams& params() const { return params_; }
  Rng& rng() { return rng_; }

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<float> probs_;
};

}  // namespace dsinfer
