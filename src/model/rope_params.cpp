// dsinfer model floor: RoPE parameters (see rope_params.h). Mirrors
// transformers.modeling_rope_utils: _compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters and _compute_yarn_parameters. transformers builds
// these tensors in F32; we evaluate in double and round once, which agrees to ~1 ulp.
#include "model/rope_params.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsinfer {

namespace {

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// Dimension index at which a frequency completes `num_rotations` turns over max_pos.
double find_correction_dim(double num_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

}  // namespace

RopeParams compute_rope_params(const RopeConfig& rope, int head_dim, int max_position_embeddings) {
  const int dim = head_dim;
  const int half = dim / 2;
  const double base = rope.theta;
  RopeParams p;
  p.inv_freq.resize(half);
  std::vector<double> pos_freqs(half);
  for (int i = 0; i < half; ++i) pos_freqs[i] = std::pow(base, static_cast<double>(2 * i) / dim);

  if (rope.type == "default") {
    for (int i = 0; i < half; ++i) p.inv_freq[i] = static_cast<float>(1.0 / pos_freqs[i]);
  } else if (rope.type == "linear") {
    for (int i = 0; i < half; ++i) p.inv_freq[i] = static_cast<float>(1.0 / pos_freqs[i] / rope.factor);
  } else if (rope.type == "yarn") {
    const double factor = rope.factor;
    const double orig = rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings
                                                                  : max_position_embeddings;
    double attention_factor = rope.attention_factor;
    if (!(attention_factor > 0)) {
      // transformers: if mscale and mscale_all_dim: get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)
      // else get_mscale(f). config.h stores an absent mscale_all_dim as 0 (falsy).
      if (rope.mscale != 0 && rope.mscale_all_dim != 0)
        attention_factor = yarn_get_mscale(factor, rope.mscale) / yarn_get_mscale(factor, rope.mscale_all_dim);
      else
        attention_factor = yarn_get_mscale(factor, 1.0);
    }
    double low = std::floor(find_correction_dim(rope.beta_fast, dim, base, orig));
    double high = std::ceil(find_correction_dim(rope.beta_slow, dim, base, orig));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // avoid a division by zero in the ramp
    for (int i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extrap_factor = 1.0 - ramp;  // 1 = keep the original frequency
      const double inv_extrap = 1.0 / pos_freqs[i];
      const double inv_interp = 1.0 / (factor * pos_freqs[i]);
      p.inv_freq[i] = static_cast<float>(inv_interp * (1.0 - extrap_factor) + inv_extrap * extrap_factor);
    }
    p.attention_factor = static_cast<float>(attention_factor);
  } else {
    throw Error("rope_type '" + rope.type + "' is not supported (supported: default, linear, yarn)");
  }
  return p;
}

}  // namespace dsinfer
