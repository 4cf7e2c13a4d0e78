// dsinfer kernels: rotary position embedding, "rotate half" layout (GPT-NeoX / Llama /
// Qwen): for i < d/2, (x[i], x[i + d/2]) is rotated by angle pos · inv_freq[i].
//
// Data flow: rope_tables() turns the inverse frequencies (computed by the model from its
// RoPE scaling config) and each token's position into cos/sin rows once per forward;
// apply_rope() then rotates every head of every token in place, for q and k of all layers.
// Angles are formed as in transformers (F32 product of position and F32 inverse
// frequency), and cos/sin are evaluated in double then rounded, so they do not depend on
// the libm's float precision.
#pragma once
#include <cstdint>

namespace dsinfer {

// cos/sin: [n_tokens, half] each, half = head_dim / 2; both scaled by attention_factor
// (YaRN's mscale; 1 otherwise).
void rope_tables(const float* inv_freq, int half, const int32_t* positions, int64_t n_tokens, float attention_factor,
                 float* cos_out, float* sin_out);

// x: [n_tokens, n_heads, head_dim] with row (token) stride x_stride floats; in place.
void apply_rope(float* x, int64_t x_stride, int64_t n_tokens, int n_heads, int head_dim, const float* cos_t,
                const float* sin_t);

}  // namespace dsinfer
