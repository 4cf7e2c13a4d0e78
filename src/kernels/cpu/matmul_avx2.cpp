// dsinfer kernels: AVX2/FMA/F16C rows kernel for matmul (compiled with -mavx2 -mfma
// -mf16c; only called when isa_level() says the CPU has them).
//
// The 16 canonical partial sums of one y[i][j] (matmul_internal.h) live in two __m256:
// lo = lanes 0..7, hi = lanes 8..15, so the first tree step (lane l + lane l+8) is lo + hi
// and the bits match the AVX-512 and scalar kernels. With only 16 ymm registers the tiles
// are smaller than in the AVX-512 kernel: 1 x 8 for m == 1 (decode) and 2 x 2 otherwise;
// each W vector is still converted once and reused for every x row of the tile.
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

}  // namespace

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
