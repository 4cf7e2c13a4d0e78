// dsinfer kernels: exp_shifted_sum with AVX-512 (see softmax.h). Compiled with
// -mavx512f/bw/vl/dq and called only after the run-time CPU check.
//
// Bit-identical to exp_shifted_sum_avx2, which attention's contract is written against:
// the max pass is the same code; the exponentials run 16 lanes at a time through the same
// operations as avx2::exp_ps (lane-wise, so the width cannot change a bit); and the sum
// still adds 8-lane vectors in index order (the low then the high half of each 16), then
// reduces with avx2::hsum_ps and adds the tail in order. Only the exp work is halved.
#include <immintrin.h>

// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*() (`__Y = __Y`),
// which -Wuninitialized reports at every inlined use; the values are fully defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vec_exp_avx2.h"

namespace dsinfer {

namespace {

// avx2::exp_ps on 16 lanes, operation for operation.
inline __m512 exp16(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.3762626647949f);
  const __m512 lo = _mm512_set1_ps(-87.3365478515625f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  // Underflowing lanes are +0, as andnot(mask, res) makes them in exp_ps.
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~underflow), p, _mm512_castsi512_ps(e));
}

}  // namespace

float exp_shifted_sum_avx512(const float* x, float* e, int64_t n) {
  if (n <= 0) return 0.0f;
  const int64_t n8 = n & ~int64_t(7);
  float m = x[0];
  if (n8) {
    __m256 vm = _mm256_loadu_ps(x);
    for (int64_t i = 8; i < n8; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    m = avx2::hmax_ps(vm);
  }
  for (int64_t i = n8; i < n; ++i) m = x[i] > m ? x[i] : m;
  const __m512 vmax16 = _mm512_set1_ps(m);
  const __m256 vmax = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n8; i += 16) {
    const __m512 v = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax16));
    _mm512_storeu_ps(e + i, v);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(v));
    acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(v, 1));
  }
  if (i < n8) {
    const __m256 v = avx2::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    _mm256_storeu_ps(e + i, v);
    acc = _mm256_add_ps(acc, v);
  }
  float s = avx2::hsum_ps(acc);
  if (n8 < n) {
    alignas(32) float buf[8];
    for (int k = 0; k < 8; ++k) buf[k] = n8 + k < n ? x[n8 + k] : m;
    const __m256 v = avx2::exp_ps(_mm256_sub_ps(_mm256_load_ps(buf), vmax));
    _mm256_store_ps(buf, v);
    for (int64_t k = n8; k < n; ++k) {
      e[k] = buf[k - n8];
      s += e[k];
    }
  }
  return s;
}

}  // namespace dsinfer
