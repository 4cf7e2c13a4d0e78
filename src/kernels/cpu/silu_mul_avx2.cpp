// dsinfer kernels: SwiGLU gate with AVX2/FMA, 8 elements at a time (see silu_mul.h).
// silu(g) * u = g / (1 + e^-g) * u with avx2::exp_ps; the tail goes through the same vector
// code on a zero-padded copy, so an element's bits never depend on where it sits in the
// array or on n. Before this, the scalar libm expf loop was ~8 % of a verify step.
#include <immintrin.h>

#include "kernels/cpu/silu_mul.h"
#include "kernels/cpu/vec_exp_avx2.h"

namespace dsinfer {

namespace {

inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = avx2::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

}  // namespace

void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    for (int t = 0; t < rest; ++t) g[t] = gate[i + t], u[t] = up[i + t];
    _mm256_store_ps(o, silu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    for (int t = 0; t < rest; ++t) out[i + t] = o[t];
  }
}

}  // namespace dsinfer
