// dsinfer kernels: F32 -> BF16 rounding on 16 AVX-512 lanes, the one rule every BF16 path
// uses (matmul's x_to_bf16 / f32_to_bf16): a subnormal becomes a zero of its sign, NaN is
// quieted, everything else rounds to nearest even on the bit pattern. Shared by the matmul
// activation rounding and the BF16 K/V cache writes of attention, so the cache holds exactly
// what the matmuls would see. Included only by translation units compiled for AVX-512.
#pragma once
#include <immintrin.h>

namespace dsinfer::kernels_avx512 {

inline __m256i to_bf16(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 sub = _mm512_cmplt_epu32_mask(abs, _mm512_set1_epi32(0x00800000));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  u = _mm512_mask_and_epi32(u, sub, u, _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_mask_mov_epi32(rounded, nan, quiet), 16));
}

}  // namespace dsinfer::kernels_avx512
