// dsinfer kernels: argmax 16 lanes wide (compiled with the AVX-512 flags; see argmax.h for
// the contract). Pass 1: the maximum and whether any lane saw a NaN; pass 2: the first index
// equal to the maximum. Both passes read the row from L1 (a 8 192-float row is 32 KB).
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/argmax.h"

namespace dsinfer {

int32_t argmax_f32_avx512(const float* x, int64_t n) {
  const int64_t n16 = n / 16 * 16;
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, v);
  }
  float m = _mm512_reduce_max_ps(vmax);
  for (int64_t i = n16; i < n; ++i) {
    if (std::isnan(x[i])) nan = 1;
    m = x[i] > m ? x[i] : m;
  }
  if (nan) return argmax_f32_scalar(x, n);
  // No NaN: the scalar loop ends on the first index holding the maximum (±0 compare equal,
  // and so does this search).
  const __m512 vm = _mm512_set1_ps(m);
  for (int64_t i = 0; i < n16; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vm, _CMP_EQ_OQ);
    if (eq) return static_cast<int32_t>(i + __builtin_ctz(static_cast<unsigned>(eq)));
  }
  for (int64_t i = n16; i < n; ++i)
    if (x[i] == m) return static_cast<int32_t>(i);
  return argmax_f32_scalar(x, n);  // unreachable without NaN
}

}  // namespace dsinfer
