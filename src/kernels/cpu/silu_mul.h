// dsinfer kernels: the SwiGLU gate, out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x).
// Element-wise, so the result of an element never depends on its neighbours.
#pragma once
#include <cstdint>

namespace dsinfer {

// out may alias gate or up. Dispatches on isa_level(): the AVX2 path (also taken on AVX-512
// CPUs) or the scalar reference.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void silu_mul_scalar(const float* gate, const float* up, float* out, int64_t n);
void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n);  // needs AVX2+FMA

}  // namespace dsinfer
