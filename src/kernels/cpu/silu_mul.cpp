// dsinfer kernels: SwiGLU gate (see silu_mul.h), scalar reference and ISA dispatch. The
// vector path (silu_mul_avx2.cpp) uses the polynomial exp of vec_exp_avx2.h, which differs
// from libm's expf by ~2 ulp; it runs on every CPU with AVX2, AVX-512 ones included, so one
// machine always gets the same bits. The scalar path (CPUs without AVX2) keeps std::exp.
#include "kernels/cpu/silu_mul.h"

#include <cmath>

#include "kernels/cpu/cpu_features.h"

namespace dsinfer {

void silu_mul_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (isa_level() >= IsaLevel::Avx2) silu_mul_avx2(gate, up, out, n);
  else silu_mul_scalar(gate, up, out, n);
}

}  // namespace dsinfer
