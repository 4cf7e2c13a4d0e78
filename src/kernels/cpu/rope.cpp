// dsinfer kernels: rotary position embedding (see rope.h). Element-wise, so no reduction
// order question arises; scalar code that the compiler vectorises.
#include "kernels/cpu/rope.h"

#include <cmath>

namespace dsinfer {

void rope_tables(const float* inv_freq, int half, const int32_t* positions, int64_t n_tokens, float attention_factor,
                 float* cos_out, float* sin_out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float p = static_cast<float>(positions[t]);
    for (int i = 0; i < half; ++i) {
      const float ang = p * inv_freq[i];
      cos_out[t * half + i] = static_cast<float>(std::cos(static_cast<double>(ang))) * attention_factor;
      sin_out[t * half + i] = static_cast<float>(std::sin(static_cast<double>(ang))) * attention_factor;
    }
  }
}

void apply_rope(float* x, int64_t x_stride, int64_t n_tokens, int n_heads, int head_dim, const float* cos_t,
                const float* sin_t) {
  const int half = head_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int h = 0; h < n_heads; ++h) {
      float* a = x + t * x_stride + static_cast<int64_t>(h) * head_dim;
      float* b = a + half;
      for (int i = 0; i < half; ++i) {
        const float x1 = a[i], x2 = b[i];
        a[i] = x1 * c[i] - x2 * s[i];
        b[i] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

}  // namespace dsinfer
