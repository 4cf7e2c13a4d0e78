// dsinfer kernels: SwiGLU gate (see silu_mul.h). Scalar expf: a tiny share of the time next
// to the three MLP matmuls, and bit-stable across builds of the same libm.
#include "kernels/cpu/silu_mul.h"

#include <cmath>

namespace dsinfer {

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace dsinfer
