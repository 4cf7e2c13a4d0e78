// dsinfer model floor: RoPE inverse frequencies and attention factor from a RopeConfig,
// following transformers' rope initialisation functions (default, linear, YaRN with its
// correction range and mscale-derived attention_factor). The kernels then only see
// inv_freq[head_dim/2] and one scalar.
#pragma once
#include <vector>

#include "model/config.h"

namespace dsinfer {

struct RopeParams {
  std::vector<float> inv_freq;  // head_dim / 2 entries, F32 as transformers stores them
  float attention_factor = 1.0f;
};

// max_position_embeddings: config.json's value (YaRN's fallback for the original length).
RopeParams compute_rope_params(const RopeConfig& rope, int head_dim, int max_position_embeddings);

}  // namespace dsinfer
