// dsinfer kernels: helpers shared by the AVX-512 attention files (attention_avx512.cpp,
// attention_avx512bf16.cpp): the register pin that keeps one load per key chunk and
// reduce8(), the score reduction of eight keys at once (K/V prefetch: attention_internal.h). Included
// only by translation units compiled for AVX-512.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/attention_internal.h"

namespace dsinfer::attention_detail::avx512 {

// Left to itself GCC folds a load used by several fmas into each of them as a memory
// operand, which makes the loop load-bound (one load per fma); this keeps one load.
inline __m512 in_register(__m512 x) {
  __asm__("" : "+v"(x));
  return x;
}


// The eight scores (before scale) of acc[0..7], one key each, in key order. Same additions
// as hsum8() in attention_avx2.cpp on s_k = low half + high half of acc[k].
inline __m256 reduce8(const __m512 acc[8]) {
  // z_k = [s_k | s_{k+4}] (256-bit halves).
  __m512 z[4];
  for (int k = 0; k < 4; ++k)
    z[k] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[k], acc[k + 4], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(acc[k], acc[k + 4], _MM_SHUFFLE(3, 2, 3, 2)));
  // a_k = lo128(s_k) + hi128(s_k), keys k and k+4 side by side (hsum8's a_k): [a0 | a2], [a1 | a3].
  const __m512 a02 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[2], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(z[0], z[2], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 a13 = _mm512_add_ps(_mm512_shuffle_f32x4(z[1], z[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(z[1], z[3], _MM_SHUFFLE(3, 1, 3, 1)));
  // [g01 | g23], then hsum8's last step.
  const __m512 g = _mm512_add_ps(_mm512_shuffle_ps(a02, a13, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(a02, a13, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 g01 = _mm512_castps512_ps256(g), g23 = _mm512_extractf32x8_ps(g, 1);
  return _mm256_add_ps(_mm256_shuffle_ps(g01, g23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(g01, g23, _MM_SHUFFLE(3, 1, 3, 1)));
}


// Scores of BF16 query vectors qb[r] (r < Q) against BF16 keys [j0, j1) (head_dim D % 32
// == 0), attend_row_bf16_reference's step 2: one 16-lane chain per key over the 32-element
// chunks of head_dim, Dot::step being vdpbf16ps (or its emulation), then reduce8 (the
// reference's tree: low half + high half, then hsum_ps's order) and the scale. MXCSR has
// FTZ and DAZ set by the caller, so every addition and the scale flush as the reference.
// Dot provides: Q (a query chunk in registers), load_q(const uint16_t*), and
// step(__m512 acc, const Q& q, const uint16_t* k) -> acc after one 32-element chunk.
template <class Dot, int Q>
void scores_bf16_tile(const uint16_t* const* qb, const uint16_t* k, int j0, int j1, int D, float scale,
                      float* const* s, bool prefetch) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = j0;
  for (; j + 8 <= j1; j += 8) {
    const uint16_t* kj = k + static_cast<int64_t>(j) * D;
    if (prefetch) prefetch_rows(kj + kPrefetchKeys * D, 8 * D);
    __m512 acc[Q][8];
    for (int r = 0; r < Q; ++r)
      for (int kk = 0; kk < 8; ++kk) acc[r][kk] = _mm512_setzero_ps();
    for (int t = 0; t < D; t += 32) {
      typename Dot::Q qv[Q];
      for (int r = 0; r < Q; ++r) qv[r] = Dot::load_q(qb[r] + t);
      for (int kk = 0; kk < 8; ++kk) {
        const __m512i kv = Dot::load_k(kj + kk * D + t);
        for (int r = 0; r < Q; ++r) acc[r][kk] = Dot::step(acc[r][kk], qv[r], kv);
      }
    }
    for (int r = 0; r < Q; ++r) _mm256_storeu_ps(s[r] + j, _mm256_mul_ps(reduce8(acc[r]), vscale));
  }
  for (; j < j1; ++j) {
    const uint16_t* kj = k + static_cast<int64_t>(j) * D;
    __m512 acc[Q];
    for (int r = 0; r < Q; ++r) acc[r] = _mm512_setzero_ps();
    for (int t = 0; t < D; t += 32) {
      const __m512i kv = Dot::load_k(kj + t);
      for (int r = 0; r < Q; ++r) acc[r] = Dot::step(acc[r], Dot::load_q(qb[r] + t), kv);
    }
    for (int r = 0; r < Q; ++r) {
      const __m256 part = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
      const __m128 a = _mm_add_ps(_mm256_castps256_ps128(part), _mm256_extractf128_ps(part, 1));
      const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
      const __m128 c = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
      s[r][j] = _mm_cvtss_f32(_mm_mul_ss(c, _mm_set_ss(scale)));  // hsum_ps, then the scale
    }
  }
}

}  // namespace dsinfer::attention_detail::avx512
