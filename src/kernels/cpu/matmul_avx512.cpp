// dsinfer kernels: AVX-512 rows kernels for matmul (compiled with -mavx512f/bw/vl/dq; only
// called when isa_level() says the CPU has them): the F32 kernel, the AVX-512F emulation
// of the Bf16Dot kernel (for CPUs without AVX512_BF16, and as a second implementation the
// tests compare the native one against), and x -> BF16 rounding for both Bf16Dot kernels.
//
// One __m512 holds the 16 canonical partial sums of one y[i][j] (matmul_internal.h).
// A tile computes R x rows times C W rows: per 16-wide k step it converts C W vectors to
// F32 once and reuses each for R x rows, so W (the big operand, streamed from memory) is
// read once per call whatever m is, and the m > 1 path does R*C fmas per R+C loads.
// m == 1 (decode) uses a 1 x 12 tile: twelve independent fma chains hide fma latency and
// twelve W rows stream in parallel. The order inside each reduction is the canonical one,
// so tiles of any shape give the same bits. A tile ends with reduce_lanes (all its sums
// through the canonical tree at once, transposed) before the in-order scalar tail.
#include <immintrin.h>

#include "kernels/cpu/bf16_avx512.h"

// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*() (`__Y = __Y`),
// which -Wuninitialized reports at every inlined use; the values are fully defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cmath>
#include <cstring>

#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/matmul_internal.h"

namespace dsinfer::matmul_detail {
namespace {

// W element access per dtype: 16 elements at once as F32 (exact conversion), and one
// element for the scalar tail. Pointers may be unaligned (mmapped safetensors).
template <DType DT>
struct WLoad;

template <>
struct WLoad<DType::F32> {
  static constexpr int kSize = 4;
  static __m512 load16(const char* p) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p)); }
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
  static __m512 load16(const char* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
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
  static __m512 load16(const char* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static float at(const char* row, int64_t k) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return _cvtsh_ss(h);  // hardware conversion: exact, same value as f16_to_f32
  }
};

// y[r * ldy + c] for r < R, c < C: x rows start at x (stride K), W rows at w (stride
// wstride bytes). With PF, the loop also prefetches the next C rows of W (the next panel,
// contiguous in memory) at the rate this panel is consumed, so DRAM streams one sequential
// region instead of relying on the hardware prefetcher to track C short 2-6 KB streams.
template <DType DT, int R, int C, bool PF = false>
inline void tile(const float* x, int64_t K, const char* w, int64_t wstride, float* y, int64_t ldy) {
  using L = WLoad<DT>;
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t K16 = K / kLanes * kLanes;
  const char* pf = w + C * wstride;
  for (int64_t k = 0; k < K16; k += kLanes) {
    if constexpr (PF) {
      constexpr int kStepBytes = C * kLanes * L::kSize;
#pragma GCC unroll 16
      for (int off = 0; off < kStepBytes; off += 64) _mm_prefetch(pf + k * C * L::kSize + off, _MM_HINT_T0);
    }
    __m512 wv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) wv[c] = L::load16(w + c * wstride + k * L::kSize);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * K + k);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  float sums[(R * C + 15) / 16 * 16];
  reduce_lanes<R * C>(&acc[0][0], sums);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = sums[r * C + c];
      const char* wr = w + c * wstride;
      for (int64_t k = K16; k < K; ++k) s = std::fma(x[r * K + k], L::at(wr, k), s);
      y[r * ldy + c] = s;
    }
}

// Tile shapes, chosen by measurement on Zen 5 (BF16, W from DRAM):
//  - m == 1: 12 W rows per tile (12 accumulators). 12 concurrent row streams kept DRAM
//    busiest: 8 rows gave ~7% less, 4 rows ~30% less, 16 spills registers. No software
//    prefetch here: the hardware prefetchers already track these streams, and prefetching
//    the next tile measured ~5-10% slower.
//  - m > 1: 4 x rows by 6 W rows = 24 accumulators + 6 W + 1 x = 31 of 32 registers
//    (~7% faster than 4 x 4). The first x block prefetches the next W panel: without it the
//    W reads of the m > 1 path ran at ~half the bandwidth (m = 8 took 3x an m = 1 call).
constexpr int kDecodeC = 12;
constexpr int kR = 4;
constexpr int kC = 6;

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
    for (; j + kDecodeC <= j1; j += kDecodeC) tile<DT, 1, kDecodeC>(x, K, base + j * wstride, wstride, y + j, ldy);
    for (; j + 4 <= j1; j += 4) tile<DT, 1, 4>(x, K, base + j * wstride, wstride, y + j, ldy);
    for (; j < j1; ++j) tile<DT, 1, 1>(x, K, base + j * wstride, wstride, y + j, ldy);
    return;
  }
  // W panel of kC rows (stays in L1) against every x row in blocks of kR.
  for (int64_t j = j0; j < j1; j += kC) {
    const int c = static_cast<int>(j1 - j < kC ? j1 - j : kC);
    const char* wp = base + j * wstride;
    // The first x block reads the panel from memory and prefetches the next one; later
    // blocks find the panel in L1.
    int64_t i = 0;
    if (m >= kR) {
      tile_rc<DT, kR, true>(c, x, K, wp, wstride, y + j, ldy);
      i = kR;
    }
    for (; i + kR <= m; i += kR) tile_rc<DT, kR, false>(c, x + i * K, K, wp, wstride, y + i * ldy + j, ldy);
    switch (m - i) {
      case 3: tile_rc<DT, 3, true>(c, x + i * K, K, wp, wstride, y + i * ldy + j, ldy); break;
      case 2: tile_rc<DT, 2, true>(c, x + i * K, K, wp, wstride, y + i * ldy + j, ldy); break;
      case 1: tile_rc<DT, 1, true>(c, x + i * K, K, wp, wstride, y + i * ldy + j, ldy); break;
      default: break;
    }
  }
}

// Bf16Dot step 1 with AVX-512F only: a 32-bit lane of a BF16 chunk holds the pair
// (even element in the low half, odd in the high half); as F32, the odd one is the lane
// with its low half cleared and the even one the lane shifted up. Two fmas, odd first,
// under FTZ/DAZ are vdpbf16ps.
struct EmulatedDot {
  struct V {
    __m512 odd, even;
  };
  static V prep(__m512i v) {
    return {_mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))),
            _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))};
  }
  static __m512 madd(__m512 p, const V& x, const V& w) {
    return _mm512_fmadd_ps(x.even, w.even, _mm512_fmadd_ps(x.odd, w.odd, p));
  }
};

using kernels_avx512::to_bf16;  // bf16_avx512.h

// Tile shapes of the emulation: a split W chunk takes two registers, so m > 1 uses 4 x 4
// (16 accumulators + 8 W + 2 x).
constexpr int kEmuDecodeC = 12;
constexpr int kEmuR = 4;
constexpr int kEmuC = 4;

}  // namespace

void x_to_bf16_avx512(const float* x, int64_t m, int64_t K, uint16_t* xb, int64_t ldx) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * K;
    uint16_t* out = xb + i * ldx;
    // Masked loads: the last partial group reads only the row's own elements, and the
    // padding (mask 0) converts zeros.
    for (int64_t k = 0; k < ldx; k += 16) {
      const int64_t n = K - k;
      const __mmask16 mask = n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : __mmask16(0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + k), to_bf16(_mm512_maskz_loadu_ps(mask, xi + k)));
    }
  }
}

void bf16_rows_avx512(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0, int64_t j1,
                      float* y, int64_t ldy) {
  FlushSubnormalsScope ftz;
  bf16_rows_impl<EmulatedDot, kEmuDecodeC, kEmuR, kEmuC>(xb, ldx, m, w, j0, j1, y, ldy);
}

void rows_avx512(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
                 int64_t ldy) {
  switch (w.dtype) {
    case DType::F32: rows_impl<DType::F32>(x, m, w, j0, j1, y, ldy); break;
    case DType::BF16: rows_impl<DType::BF16>(x, m, w, j0, j1, y, ldy); break;
    case DType::F16: rows_impl<DType::F16>(x, m, w, j0, j1, y, ldy); break;
    default: break;  // rejected by matmul_isa
  }
}

}  // namespace dsinfer::matmul_detail
