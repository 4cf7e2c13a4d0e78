// dsinfer kernels: AVX2/FMA/F16C rows kernels for matmul (compiled with -mavx2 -mfma
// -mf16c; only called when isa_level() says the CPU has them): F32, the emulation of the
// Bf16Dot kernel, and x -> BF16 rounding for it.
//
// The 16 canonical partial sums of one y[i][j] (matmul_internal.h) live in two __m256:
// lo = lanes 0..7, hi = lanes 8..15, so the first tree step (lane l + lane l+8) is lo + hi
// and the bits match the AVX-512 and scalar kernels. With only 16 ymm registers the tiles
// are smaller than in the AVX-512 kernel: 1 x 8 for m == 1 (decode) and 2 x 2 otherwise;
// each W vector is still converted once and reused for every x row of the tile.
// Bf16Dot: a 32-element chunk is two 256-bit halves, the first feeding lanes 0..7 (lo),
// the second lanes 8..15 (hi); each is split into odd and even elements as F32 and
// multiplied in with two fmas under FTZ/DAZ, which is what vdpbf16ps computes.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/matmul_internal.h"

namespace dsinfer::matmul_detail {
namespace {

// W element access per dtype: 8 elements at once as F32 (exact conversion), and one
// element for the scalar tail. Pointers may be unaligned (mmapped safetensors).
template <DType DT>
struct WLoad;

template <>
struct WLoad<DType::F32> {
  static constexpr int kSize = 4;
  static __m256 load8(const char* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static float at(const char* row, int64_t k) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  }
};

template <>
struct WLoad<DType::BF16> {
  static constexpr int kSize = 2;
  // BF16 is the top half of an F32: zero-extend each 16-bit value and shift it up.
  static __m256 load8(const char* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float at(const char* row, int64_t k) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return bf16_to_f32(h);
  }
};

template <>
struct WLoad<DType::F16> {
  static constexpr int kSize = 2;
  static __m256 load8(const char* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float at(const char* row, int64_t k) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return _cvtsh_ss(h);  // hardware conversion: exact, same value as f16_to_f32
  }
};

// Canonical tree on lanes lo = 0..7, hi = 8..15: (l + l+8), then +4, +2, +1.
inline float hsum16(__m256 lo, __m256 hi) {
  __m256 q = _mm256_add_ps(lo, hi);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
  __m128 s = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// y[r * ldy + c] for r < R, c < C. With PF, also prefetches the next C rows of W (the
// next panel, contiguous) as this one is consumed; see matmul_avx512.cpp for why.
template <DType DT, int R, int C, bool PF = false>
inline void tile(const float* x, int64_t K, const char* w, int64_t wstride, float* y, int64_t ldy) {
  using L = WLoad<DT>;
  __m256 lo[R][C], hi[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  const int64_t K16 = K / kLanes * kLanes;
  const char* pf = w + C * wstride;
  for (int64_t k = 0; k < K16; k += kLanes) {
    if constexpr (PF) {
      constexpr int kStepBytes = C * kLanes * L::kSize;
#pragma GCC unroll 16
      for (int off = 0; off < kStepBytes; off += 64) _mm_prefetch(pf + k * C * L::kSize + off, _MM_HINT_T0);
    }
    __m256 wl[C], wh[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      wl[c] = L::load8(w + c * wstride + k * L::kSize);
      wh[c] = L::load8(w + c * wstride + (k + 8) * L::kSize);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 xl = _mm256_loadu_ps(x + r * K + k);
      const __m256 xh = _mm256_loadu_ps(x + r * K + k + 8);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        lo[r][c] = _mm256_fmadd_ps(xl, wl[c], lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(xh, wh[c], hi[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = hsum16(lo[r][c], hi[r][c]);
      const char* wr = w + c * wstride;
      for (int64_t k = K16; k < K; ++k) s = std::fma(x[r * K + k], L::at(wr, k), s);
      y[r * ldy + c] = s;
    }
}

// Tile shapes, chosen by measurement (Zen 5 running this path via DSINFER_ISA=avx2, BF16
// W from DRAM): m == 1 uses 8 W rows with prefetch of the next panel: 4 rows without
// prefetch reached ~55% of the bandwidth, 8 rows with prefetch ~90%, although 16
// accumulators + x + W do not all fit in 16 registers (the spills hit L1, W hits DRAM).
constexpr int kDecodeC = 8;
constexpr int kR = 2;
constexpr int kC = 2;

template <DType DT, int R, bool PF>
inline void tile_rc(int c, const float* x, int64_t K, const char* w, int64_t wstride, float* y,
                    int64_t ldy) {
  if (c == kC) {
    tile<DT, R, kC, PF>(x, K, w, wstride, y, ldy);
  } else {
    for (int cc = 0; cc < c; ++cc) tile<DT, R, 1>(x, K, w + cc * wstride, wstride, y + cc, ldy);
  }
}

template <DType DT>
void rows_impl(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
               int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t wstride = K * WLoad<DT>::kSize;
  const char* base = static_cast<const char*>(w.data);
  if (m == 1) {
    int64_t j = j0;
    for (; j + kDecodeC <= j1; j += kDecodeC) tile<DT, 1, kDecodeC, true>(x, K, base + j * wstride, wstride, y + j, ldy);
    for (; j + 4 <= j1; j += 4) tile<DT, 1, 4, true>(x, K, base + j * wstride, wstride, y + j, ldy);
    for (; j < j1; ++j) tile<DT, 1, 1>(x, K, base + j * wstride, wstride, y + j, ldy);
    return;
  }
  for (int64_t j = j0; j < j1; j += kC) {
    const int c = static_cast<int>(j1 - j < kC ? j1 - j : kC);
    const char* wp = base + j * wstride;
    // m >= 2 here, so the first block is always a full kR = 2 block: it reads the panel
    // from memory and prefetches the next one; later blocks find the panel in L1.
    tile_rc<DT, kR, true>(c, x, K, wp, wstride, y + j, ldy);
    int64_t i = kR;
    for (; i + kR <= m; i += kR) tile_rc<DT, kR, false>(c, x + i * K, K, wp, wstride, y + i * ldy + j, ldy);
    if (i < m) tile_rc<DT, 1, false>(c, x + i * K, K, wp, wstride, y + i * ldy + j, ldy);
  }
}

// ---- Bf16Dot --------------------------------------------------------------------------

struct Split {
  __m256 odd, even;
};
inline Split split(__m256i v) {
  return {_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))),
          _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))};
}

// y[r * ldy + c] for r < R, c < C (as tile() above; x is BF16, 32-byte aligned rows of
// ldx elements, zero padded). AVX2 has no 16-bit masked load, so W's last partial chunk is
// copied into a zeroed buffer: nothing past a row's K elements is read.
template <int R, int C>
inline void bf16_tile(const uint16_t* x, int64_t ldx, int64_t K, const char* w, int64_t wstride, float* y,
                      int64_t ldy) {
  __m256 acc[2][R][C];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[h][r][c] = _mm256_setzero_ps();
  // w_at(c) points at the chunk's 32 W elements of row c.
  const auto chunk = [&](int64_t k, auto w_at) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      Split wv[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) wv[c] = split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w_at(c) + 32 * h)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const Split xv = split(_mm256_load_si256(reinterpret_cast<const __m256i*>(x + r * ldx + k + 16 * h)));
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c)
          acc[h][r][c] = _mm256_fmadd_ps(xv.even, wv[c].even, _mm256_fmadd_ps(xv.odd, wv[c].odd, acc[h][r][c]));
      }
    }
  };
  const int64_t K32 = K / kBf16Chunk * kBf16Chunk;
  for (int64_t k = 0; k < K32; k += kBf16Chunk) chunk(k, [&](int c) { return w + c * wstride + 2 * k; });
  if (K32 < K) {
    alignas(32) uint16_t tail[C][kBf16Chunk] = {};
    for (int c = 0; c < C; ++c) std::memcpy(tail[c], w + c * wstride + 2 * K32, static_cast<size_t>(2 * (K - K32)));
    chunk(K32, [&](int c) { return reinterpret_cast<const char*>(tail[c]); });
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = hsum16(acc[0][r][c], acc[1][r][c]);
}

// Tile shapes: 1 x 4 for m == 1, 2 x 2 otherwise (the split W halves take two registers).
constexpr int kBf16DecodeC = 4;

template <int R>
inline void bf16_tile_rc(int c, const uint16_t* x, int64_t ldx, int64_t K, const char* w, int64_t wstride,
                         float* y, int64_t ldy) {
  if (c == kC) {
    bf16_tile<R, kC>(x, ldx, K, w, wstride, y, ldy);
  } else {
    for (int cc = 0; cc < c; ++cc) bf16_tile<R, 1>(x, ldx, K, w + cc * wstride, wstride, y + cc, ldy);
  }
}

// Not inlined: the caller sets MXCSR around it.
__attribute__((noinline)) void bf16_rows_impl(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w,
                                              int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t wstride = K * 2;
  const char* base = static_cast<const char*>(w.data);
  if (m == 1) {
    int64_t j = j0;
    for (; j + kBf16DecodeC <= j1; j += kBf16DecodeC)
      bf16_tile<1, kBf16DecodeC>(xb, ldx, K, base + j * wstride, wstride, y + j, ldy);
    for (; j < j1; ++j) bf16_tile<1, 1>(xb, ldx, K, base + j * wstride, wstride, y + j, ldy);
    return;
  }
  for (int64_t j = j0; j < j1; j += kC) {
    const int c = static_cast<int>(j1 - j < kC ? j1 - j : kC);
    const char* wp = base + j * wstride;
    int64_t i = 0;
    for (; i + kR <= m; i += kR) bf16_tile_rc<kR>(c, xb + i * ldx, ldx, K, wp, wstride, y + i * ldy + j, ldy);
    if (i < m) bf16_tile_rc<1>(c, xb + i * ldx, ldx, K, wp, wstride, y + i * ldy + j, ldy);
  }
}

// x -> BF16 for 8 floats (matmul_internal.h step 0; see to_bf16 in matmul_avx512.cpp).
inline __m128i to_bf16(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), abs);  // abs >= 0 as int32
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  u = _mm256_andnot_si256(_mm256_and_si256(sub, _mm256_set1_epi32(0x7fffffff)), u);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  // Values fit 16 bits, so the saturating pack is a plain narrowing (per 128-bit lane).
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

}  // namespace

void x_to_bf16_avx2(const float* x, int64_t m, int64_t K, uint16_t* xb, int64_t ldx) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * K;
    uint16_t* out = xb + i * ldx;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) _mm_store_si128(reinterpret_cast<__m128i*>(out + k), to_bf16(_mm256_loadu_ps(xi + k)));
    for (; k < K; ++k) out[k] = x_to_bf16(xi[k]);
    for (; k < ldx; ++k) out[k] = 0;
  }
}

void bf16_rows_avx2(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0, int64_t j1,
                    float* y, int64_t ldy) {
  FlushSubnormalsScope ftz;
  bf16_rows_impl(xb, ldx, m, w, j0, j1, y, ldy);
}

void rows_avx2(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
               int64_t ldy) {
  switch (w.dtype) {
    case DType::F32: rows_impl<DType::F32>(x, m, w, j0, j1, y, ldy); break;
    case DType::BF16: rows_impl<DType::BF16>(x, m, w, j0, j1, y, ldy); break;
    case DType::F16: rows_impl<DType::F16>(x, m, w, j0, j1, y, ldy); break;
    default: break;  // rejected by matmul_isa
  }
}

}  // namespace dsinfer::matmul_detail
