// dsinfer kernels: the SwiGLU gate, out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x).
// Element-wise, so the result of an element never depends on its neighbours.
#pragma once
#include <cstdint>

namespace dsinfer {

// out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

}  // namespace dsinfer
