// dsinfer kernels: AVX-512 building blocks of matmul shared by matmul_avx512.cpp (the F32
// kernels and the AVX-512F emulation of Bf16Dot) and matmul_avx512bf16.cpp (the native
// Bf16Dot kernel): the reduction of a tile's partial sums, and the Bf16Dot tile and rows
// loop, written once over an "Ops" policy that says how one 32-element chunk is multiplied
// in (vdpbf16ps, or its emulation with two fmas).
//
// Everything here has internal linkage: the including files are compiled with different
// -m flags, and an inline function shared through the linker could be taken from the file
// whose flags the CPU lacks.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "kernels/cpu/matmul_internal.h"

namespace dsinfer::matmul_detail {
namespace {

// ---- the canonical tree, for many partial-sum vectors at once ---------------------------
//
// reduce16 per vector costs ~8 shuffles/adds for one result; transposing as we go does the
// same additions (same operands, same order, so the same bits) for 16 vectors with 15 adds
// and 30 shuffles. Each fold adds two shuffled views of a and b:
//   fold8: [a.lo256 | b.lo256] + [a.hi256 | b.hi256]        -> q = p[l] + p[l + 8]
//   fold4: 128-bit blocks (0, 2) of a and b + blocks (1, 3)  -> r = q[l] + q[l + 4]
//   fold2: per block, elements (0, 1) + elements (2, 3)      -> s = r[l] + r[l + 2]
//   fold1: per block, element 0 + element 1                  -> s[0] + s[1]
inline __m512 fold8(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
inline __m512 fold4(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}
inline __m512 fold2(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}
inline __m512 fold1(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

// out[i] = the canonical tree of v[i], for i < N; out has room for N rounded up to 16.
// After the four folds, lane 4k + j holds input slot 4j + k; feeding slot t with
// v[4 (t % 4) + t / 4] (the same transpose) puts v[i]'s sum in lane i. Missing vectors of
// a last partial group are zeros, which never meet a real lane.
template <int N>
inline void reduce_lanes(const __m512* v, float* out) {
#pragma GCC unroll 4
  for (int g = 0; g < N; g += 16) {
    __m512 s[16], l1[8], l2[4], l3[2];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      const int i = g + 4 * (t % 4) + t / 4;
      s[t] = i < N ? v[i] : _mm512_setzero_ps();
    }
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) l1[t] = fold8(s[2 * t], s[2 * t + 1]);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) l2[t] = fold4(l1[2 * t], l1[2 * t + 1]);
    l3[0] = fold2(l2[0], l2[1]);
    l3[1] = fold2(l2[2], l2[3]);
    _mm512_storeu_ps(out + g, fold1(l3[0], l3[1]));
  }
}

// ---- Bf16Dot tiles ----------------------------------------------------------------------
//
// Ops provides:  V prep(__m512i raw)           a 32-element BF16 chunk ready to multiply
//                __m512 madd(__m512 p, V x, V w)   canonical step 1 for one chunk

// The PF tiles prefetch W at least this many bytes ahead of the panel being read.
constexpr int64_t kPrefetchAheadBytes = 8192;

// y[r * ldy + c] for r < R, c < C: x rows start at x (stride ldx, 64-byte aligned, zero
// padded), W rows at w (stride wstride bytes). W's last partial chunk is loaded masked, so
// nothing past a row's K elements is read. With PF, also prefetches a panel of W at least
// kPrefetchAheadBytes ahead (panels are contiguous) as this one is consumed.
// Not inlined: with every tile shape inlined into one rows function, GCC spilled W vectors
// and row pointers inside the m == 1 loop (measured 896x320 decode: 10 us -> 6 us).
template <class Ops, int R, int C, bool PF = false>
__attribute__((noinline)) void bf16_tile(const uint16_t* x, int64_t ldx, int64_t K, const char* w,
                                         int64_t wstride, float* y, int64_t ldy) {
  __m512 acc[R * C];
#pragma GCC unroll 32
  for (int i = 0; i < R * C; ++i) acc[i] = _mm512_setzero_ps();
  const auto chunk = [&](int64_t k, auto load_w) {
    typename Ops::V wv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) wv[c] = Ops::prep(load_w(w + c * wstride + 2 * k));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const typename Ops::V xv = Ops::prep(_mm512_load_si512(x + r * ldx + k));
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r * C + c] = Ops::madd(acc[r * C + c], xv, wv[c]);
    }
  };
  const int64_t K32 = K / kBf16Chunk * kBf16Chunk;
  // Prefetch about kPrefetchAheadBytes ahead, in whole panels: one panel of 5 rows of K = 320
  // is only 3.2 KB, less than DRAM latency times bandwidth, and a stream that far behind
  // stalls (bench_matmul, cold 8192x320, m = 6: 310 us one panel ahead, ~270 us three).
  const int64_t panel = C * wstride;
  const char* pf = w + (kPrefetchAheadBytes + panel - 1) / panel * panel;
  for (int64_t k = 0; k < K32; k += kBf16Chunk) {
    if constexpr (PF) {
#pragma GCC unroll 16
      for (int off = 0; off < C * 64; off += 64) _mm_prefetch(pf + k * C * 2 + off, _MM_HINT_T0);
    }
    chunk(k, [](const char* p) { return _mm512_loadu_si512(p); });
  }
  if (K32 < K) {
    const __mmask32 tail = _cvtu32_mask32((1u << (K - K32)) - 1);
    chunk(K32, [tail](const char* p) { return _mm512_maskz_loadu_epi16(tail, p); });
  }
  float sums[(R * C + 15) / 16 * 16];
  reduce_lanes<R * C>(acc, sums);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) y[r * ldy + c] = sums[r * C + c];
}

// A tile of R x rows against c <= kC W rows: the full kC tile, or one W row at a time
// for the last, partial panel of a thread's range.
template <class Ops, int R, int kC, bool PF>
inline void bf16_tile_rc(int c, const uint16_t* x, int64_t ldx, int64_t K, const char* w, int64_t wstride,
                         float* y, int64_t ldy) {
  if (c == kC) {
    bf16_tile<Ops, R, kC, PF>(x, ldx, K, w, wstride, y, ldy);
  } else {
    for (int cc = 0; cc < c; ++cc) bf16_tile<Ops, R, 1>(x, ldx, K, w + cc * wstride, wstride, y + cc, ldy);
  }
}

// The rows kernel: m == 1 runs 1 x kDecodeC tiles (then 4 and 1 W rows); m > 1 takes W
// panels of kC rows and runs every block of kR x rows against each panel while it sits in
// L1, the first block prefetching the next panel. Not inlined: the caller sets MXCSR
// around it (FlushSubnormalsScope).
template <class Ops, int kDecodeC, int kR, int kC>
__attribute__((noinline)) void bf16_rows_impl(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w,
                                              int64_t j0, int64_t j1, float* y, int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t wstride = K * 2;
  const char* base = static_cast<const char*>(w.data);
  if (m == 1) {
    int64_t j = j0;
    for (; j + kDecodeC <= j1; j += kDecodeC) bf16_tile<Ops, 1, kDecodeC>(xb, ldx, K, base + j * wstride, wstride, y + j, ldy);
    for (; j + 4 <= j1; j += 4) bf16_tile<Ops, 1, 4>(xb, ldx, K, base + j * wstride, wstride, y + j, ldy);
    for (; j < j1; ++j) bf16_tile<Ops, 1, 1>(xb, ldx, K, base + j * wstride, wstride, y + j, ldy);
    return;
  }
  // m == 6 (a 5-draft verify block, the most common one) runs 6 x 4 tiles: 24 accumulators,
  // every W load shared by six rows. bench_matmul (1 thread, hot), 8192x320: 103 us against
  // 136 us as 5 + 1 (m = 5: 91 us); m = 7 as 4 + 3 and m = 8 as 4 + 4 timed no better than
  // 5 + 2 and 5 + 3 in a standalone loop, so those stay.
  // Both shapes below were measured with the native vdpbf16ps kernel (kR = kC = 5) only.
  constexpr bool kNativeShape = kR == 5 && kC == 5;
  if (kNativeShape && m == 6) {
    for (int64_t j = j0; j < j1; j += 4) {
      const int c = static_cast<int>(j1 - j < 4 ? j1 - j : 4);
      bf16_tile_rc<Ops, 6, 4, true>(c, xb, ldx, K, base + j * wstride, wstride, y + j, ldy);
    }
    return;
  }
  // A lone remainder row shares no W load with another row and runs at about a third of a
  // full tile's rate (m = 6 as 5 + 1 cost 35 % more than m = 5 on Zen 5, the verify rows of a
  // typical speculative round): with at least one full tile before it, the last kR + 1 rows
  // run as two tiles of about half instead (11 = 5 + 3 + 3; timed on 6 = 3 + 3 before the
  // 6 x 4 tile: about 5 % faster than 5 + 1). Per-row bits do not depend on the tile a row
  // sits in.
  constexpr int kSplitA = (kR + 1) / 2, kSplitB = kR + 1 - kSplitA;
  const bool split = kNativeShape && m > kR && m % kR == 1;
  const int64_t full_end = split ? m - kR - 1 : m - m % kR;
  for (int64_t j = j0; j < j1; j += kC) {
    const int c = static_cast<int>(j1 - j < kC ? j1 - j : kC);
    const char* wp = base + j * wstride;
    int64_t i = 0;
    if (full_end >= kR) {
      bf16_tile_rc<Ops, kR, kC, true>(c, xb, ldx, K, wp, wstride, y + j, ldy);
      i = kR;
    }
    for (; i < full_end; i += kR)
      bf16_tile_rc<Ops, kR, kC, false>(c, xb + i * ldx, ldx, K, wp, wstride, y + i * ldy + j, ldy);
    if (split) {
      // PF: the panel's first block when there was no full tile.
      if (i == 0)
        bf16_tile_rc<Ops, kSplitA, kC, true>(c, xb, ldx, K, wp, wstride, y + j, ldy);
      else
        bf16_tile_rc<Ops, kSplitA, kC, false>(c, xb + i * ldx, ldx, K, wp, wstride, y + i * ldy + j, ldy);
      i += kSplitA;
      bf16_tile_rc<Ops, kSplitB, kC, false>(c, xb + i * ldx, ldx, K, wp, wstride, y + i * ldy + j, ldy);
      continue;
    }
    // The remaining m - i < kR rows, as one tile (PF: this may be the panel's first block).
    [&]<int... Rs>(std::integer_sequence<int, Rs...>) {
      ((m - i == Rs + 1 ? bf16_tile_rc<Ops, Rs + 1, kC, true>(c, xb + i * ldx, ldx, K, wp, wstride, y + i * ldy + j, ldy)
                        : void()),
       ...);
    }(std::make_integer_sequence<int, kR - 1>{});
  }
}

}  // namespace
}  // namespace dsinfer::matmul_detail
