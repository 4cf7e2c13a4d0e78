// dsinfer kernels: AVX-512 grouped attention micro-kernels (head_dim % 16 == 0), driven by
// attend_group() (attention_internal.h). Compiled with -mavx512f/bw/vl/dq; only called
// when isa_level() says the CPU has them.
//
// They give the bits of attend_row_avx2 (attention_avx2.cpp), only wider:
//  - a score's fma chain runs over 16-float steps of head_dim in one zmm, whose low half
//    is attend_row_avx2's first 8-lane partial sum (chunks 0, 2, 4, ...) and whose high
//    half is its second (chunks 1, 3, 5, ...). reduce8() adds the halves and reduces eight
//    keys with the additions of avx2::hsum_ps, in its order, 16 lanes at a time;
//  - value accumulation is lane-wise, so a zmm of 16 output lanes runs the same fma
//    chains as two ymm.
// The softmax is exp_shifted_sum_avx512, bit-identical to the AVX2 one.
// A scores tile keeps 3 query vectors x 8 keys of accumulators (24 zmm) so every key
// chunk is loaded once for three queries (the three heads of a GQA group at decode); a
// values tile keeps 4 vectors x 64 output lanes (16 zmm) so every value row is loaded
// once for four. The first tile over a key block prefetches rows ahead (DRAM-resident
// K/V at decode, see attention_internal.h).
#include <immintrin.h>

// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*() (`__Y = __Y`),
// which -Wuninitialized reports at every inlined use; the values are fully defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vec_exp_avx2.h"

namespace dsinfer::attention_detail {
namespace {

constexpr int kScoreTile = 3;
constexpr int kValueTile = 4;
constexpr int kValueU = 4;  // zmm of head_dim per values pass

// Left to itself GCC folds a load used by several fmas into each of them as a memory
// operand, which makes the loop load-bound (one load per fma); this keeps one load.
inline __m512 in_register(__m512 x) {
  __asm__("" : "+v"(x));
  return x;
}

// Software prefetch distance, in keys (4 KB of K or V rows at head_dim 64): measured
// best against DRAM-resident K/V (bench_attention cold = 1).
constexpr int kPrefetchKeys = 16;

// Prefetches n floats from p, one cache line per 16.
inline void prefetch_floats(const float* p, int n) {
  for (int i = 0; i < n; i += 16) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
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

template <int Q>
void scores_tile(const float* const* q, const float* k, int j0, int j1, int D, float scale, float* const* s,
                 bool prefetch) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = j0;
  for (; j + 8 <= j1; j += 8) {
    const float* kj = k + static_cast<int64_t>(j) * D;
    if (prefetch) prefetch_floats(kj + kPrefetchKeys * D, 8 * D);
    __m512 acc[Q][8];
    for (int r = 0; r < Q; ++r)
      for (int kk = 0; kk < 8; ++kk) acc[r][kk] = _mm512_setzero_ps();
    for (int t = 0; t < D; t += 16) {
      __m512 qv[Q];
      for (int r = 0; r < Q; ++r) qv[r] = _mm512_loadu_ps(q[r] + t);
      for (int kk = 0; kk < 8; ++kk) {
        const __m512 kv = in_register(_mm512_loadu_ps(kj + kk * D + t));
        for (int r = 0; r < Q; ++r) acc[r][kk] = _mm512_fmadd_ps(qv[r], kv, acc[r][kk]);
      }
    }
    for (int r = 0; r < Q; ++r) _mm256_storeu_ps(s[r] + j, _mm256_mul_ps(reduce8(acc[r]), vscale));
  }
  for (; j < j1; ++j) {
    const float* kj = k + static_cast<int64_t>(j) * D;
    __m512 acc[Q];
    for (int r = 0; r < Q; ++r) acc[r] = _mm512_setzero_ps();
    for (int t = 0; t < D; t += 16) {
      const __m512 kv = _mm512_loadu_ps(kj + t);
      for (int r = 0; r < Q; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + t), kv, acc[r]);
    }
    for (int r = 0; r < Q; ++r) {
      const __m256 part = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
      s[r][j] = avx2::hsum_ps(part) * scale;
    }
  }
}

void scores(int nq, const float* const* q, const float* k, int j0, int j1, int D, float scale, float* const* s,
            bool prefetch) {
  switch (nq) {
    case 1: scores_tile<1>(q, k, j0, j1, D, scale, s, prefetch); break;
    case 2: scores_tile<2>(q, k, j0, j1, D, scale, s, prefetch); break;
    default: scores_tile<kScoreTile>(q, k, j0, j1, D, scale, s, prefetch); break;
  }
}

// Lanes [c0, c0 + 16U) of out[r], r < Q, over keys [j0, j1).
template <int Q, int U>
void values_pass(const float* const* p, const float* v, int j0, int j1, int D, float* const* out, bool zero,
                 bool prefetch, int c0) {
  __m512 acc[Q][U];
  for (int r = 0; r < Q; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(out[r] + c0 + u * 16);
  for (int j = j0; j < j1; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * D + c0;
    if (prefetch && c0 == 0) prefetch_floats(vj + kPrefetchKeys * D, D);  // whole rows: later passes hit
    __m512 pj[Q];
    for (int r = 0; r < Q; ++r) pj[r] = _mm512_set1_ps(p[r][j]);
    for (int u = 0; u < U; ++u) {
      const __m512 vv = in_register(_mm512_loadu_ps(vj + u * 16));
      for (int r = 0; r < Q; ++r) acc[r][u] = _mm512_fmadd_ps(pj[r], vv, acc[r][u]);
    }
  }
  for (int r = 0; r < Q; ++r)
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(out[r] + c0 + u * 16, acc[r][u]);
}

template <int Q>
void values_tile(const float* const* p, const float* v, int j0, int j1, int D, float* const* out, bool zero,
                 bool prefetch) {
  int c = 0;
  for (; c + kValueU * 16 <= D; c += kValueU * 16) values_pass<Q, kValueU>(p, v, j0, j1, D, out, zero, prefetch, c);
  switch ((D - c) / 16) {
    case 3: values_pass<Q, 3>(p, v, j0, j1, D, out, zero, prefetch, c); break;
    case 2: values_pass<Q, 2>(p, v, j0, j1, D, out, zero, prefetch, c); break;
    case 1: values_pass<Q, 1>(p, v, j0, j1, D, out, zero, prefetch, c); break;
    default: break;
  }
}

void values(int nq, const float* const* p, const float* v, int j0, int j1, int D, float* const* out, bool zero,
            bool prefetch) {
  switch (nq) {
    case 1: values_tile<1>(p, v, j0, j1, D, out, zero, prefetch); break;
    case 2: values_tile<2>(p, v, j0, j1, D, out, zero, prefetch); break;
    case 3: values_tile<3>(p, v, j0, j1, D, out, zero, prefetch); break;
    default: values_tile<kValueTile>(p, v, j0, j1, D, out, zero, prefetch); break;
  }
}

void scale_out(float* out, int D, float inv) {
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int i = 0; i < D; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(out + i), vinv));
}

}  // namespace

const GroupKernels& group_kernels_avx512() {
  static const GroupKernels k{kScoreTile, kValueTile, scores, values, exp_shifted_sum_avx512, scale_out};
  return k;
}

}  // namespace dsinfer::attention_detail
