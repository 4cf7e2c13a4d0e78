// dsinfer kernels: 8-wide F32 exp and fixed-order horizontal reductions for AVX2/FMA
// translation units (*_avx2.cpp and *_avx512.cpp only: the intrinsics need -mavx2 -mfma;
// everything here is static inline, so each of those files gets its own copy compiled
// with its own flags). Range reduction x = n·ln2 + r with ln2 split in two
// parts, a degree-6 polynomial for e^r on |r| <= ln2/2, and 2^n built in the exponent
// bits. Max relative error about 2 ulp; inputs below -87.3 flush to 0 (softmax feeds it
// only values <= 0, so overflow cannot occur there; it is clamped anyway).
#pragma once
#include <immintrin.h>

namespace dsinfer::avx2 {

static inline __m256 exp_ps(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 lo = _mm256_set1_ps(-87.3365478515625f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n*ln2 in two steps (Cody-Waite) so r stays accurate for large |n|.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, res);
}

// Horizontal sum in a fixed lane order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
static inline float hsum_ps(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  __m128 c = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(c);
}

static inline float hmax_ps(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 b = _mm_max_ps(a, _mm_movehl_ps(a, a));
  __m128 c = _mm_max_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(c);
}

}  // namespace dsinfer::avx2
