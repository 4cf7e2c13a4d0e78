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
// BF16 cache (attention_internal.h): the values kernels widen each BF16 value exactly and
// run the same chains; the scores kernel here emulates vdpbf16ps with two fmas per lane
// (the native one is in attention_avx512bf16.cpp), both give attend_row_bf16_reference's
// bits. K/V and query rounding to BF16 (to_bf16) is matmul's x_to_bf16 rule on 16 lanes.
// A scores tile keeps 3 query vectors x 8 keys of accumulators (24 zmm) so every key
// chunk is loaded once for three queries (the three heads of a GQA group at decode); a
// values tile keeps 4 vectors x 64 output lanes (16 zmm) so every value row is loaded
// once for four. The first tile over a key block prefetches rows ahead (DRAM-resident
// K/V at decode, see attention_internal.h).
#include <immintrin.h>

#include "kernels/cpu/bf16_avx512.h"

// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*() (`__Y = __Y`),
// which -Wuninitialized reports at every inlined use; the values are fully defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/attention_avx512_common.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vec_exp_avx2.h"

namespace dsinfer::attention_detail {
namespace {

using namespace avx512;

constexpr int kScoreTile = 3;
constexpr int kValueTile = 4;
constexpr int kValueU = 4;  // zmm of head_dim per values pass

template <int Q>
void scores_tile(const float* const* q, const float* k, int j0, int j1, int D, float scale, float* const* s,
                 bool prefetch) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = j0;
  for (; j + 8 <= j1; j += 8) {
    const float* kj = k + static_cast<int64_t>(j) * D;
    if (prefetch) prefetch_rows(kj + kPrefetchKeys * D, 8 * D);
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

// 16 values of a V row as F32 (BF16 widened exactly).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// Lanes [c0, c0 + 16U) of out[r], r < Q, over keys [j0, j1); T: the cache's element type.
template <int Q, int U, class T>
void values_pass(const float* const* p, const T* v, int j0, int j1, int D, float* const* out, bool zero,
                 bool prefetch, int c0) {
  __m512 acc[Q][U];
  for (int r = 0; r < Q; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(out[r] + c0 + u * 16);
  for (int j = j0; j < j1; ++j) {
    const T* vj = v + static_cast<int64_t>(j) * D + c0;
    if (prefetch && c0 == 0) prefetch_rows(vj + kPrefetchKeys * D, D);  // whole rows: later passes hit
    __m512 pj[Q];
    for (int r = 0; r < Q; ++r) pj[r] = _mm512_set1_ps(p[r][j]);
    for (int u = 0; u < U; ++u) {
      const __m512 vv = in_register(load16(vj + u * 16));
      for (int r = 0; r < Q; ++r) acc[r][u] = _mm512_fmadd_ps(pj[r], vv, acc[r][u]);
    }
  }
  for (int r = 0; r < Q; ++r)
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(out[r] + c0 + u * 16, acc[r][u]);
}

template <int Q, class T>
void values_tile(const float* const* p, const T* v, int j0, int j1, int D, float* const* out, bool zero,
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

template <class T>
void values(int nq, const float* const* p, const T* v, int j0, int j1, int D, float* const* out, bool zero,
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

// ---- BF16 cache ---------------------------------------------------------------------------

using kernels_avx512::to_bf16;  // bf16_avx512.h

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// vdpbf16ps emulated with AVX-512F: the odd element's product first, then the even one's,
// each an fma (exact product, one rounding); MXCSR's DAZ/FTZ (set by attend_group) flush
// as the instruction does.
struct EmuDot {
  struct Q {
    __m512 odd, even;
  };
  static __m512 odd(__m512i x) { return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536))); }
  static __m512 even(__m512i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
  static Q load_q(const uint16_t* p) {
    const __m512i x = _mm512_loadu_si512(p);
    return {odd(x), even(x)};
  }
  static __m512i load_k(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static __m512 step(__m512 acc, const Q& q, __m512i k) {
    acc = _mm512_fmadd_ps(q.odd, in_register(odd(k)), acc);
    return _mm512_fmadd_ps(q.even, in_register(even(k)), acc);
  }
};

constexpr int kEmuScoreTile = 2;  // 16 accumulators + 4 query + 2 key registers

void scores_bf16_emu(int nq, const uint16_t* const* qb, const uint16_t* k, int j0, int j1, int D, float scale,
                     float* const* s, bool prefetch) {
  if (nq == 1) scores_bf16_tile<EmuDot, 1>(qb, k, j0, j1, D, scale, s, prefetch);
  else scores_bf16_tile<EmuDot, kEmuScoreTile>(qb, k, j0, j1, D, scale, s, prefetch);
}

}  // namespace

const GroupKernels& group_kernels_avx512() {
  static const GroupKernels k{kScoreTile, kValueTile, scores, values<float>, exp_shifted_sum_avx512,
                              scale_out};
  return k;
}

void values_bf16_avx512(int nq, const float* const* p, const uint16_t* v, int j0, int j1, int head_dim,
                        float* const* out, bool zero, bool prefetch) {
  values<uint16_t>(nq, p, v, j0, j1, head_dim, out, zero, prefetch);
}

void scale_out_avx512(float* out, int head_dim, float inv) { scale_out(out, head_dim, inv); }

void round_q_bf16_avx512(const float* q, int head_dim, uint16_t* qb) {
  const int d32 = (head_dim + 31) & ~31;
  for (int i = 0; i < d32; i += 16) {
    const int64_t n = head_dim - i;
    const __mmask16 m = n > 0 ? tail_mask(n) : __mmask16(0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + i), to_bf16(_mm512_maskz_loadu_ps(m, q + i)));
  }
}

void kv_round_bf16_avx512(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm256_mask_storeu_epi16(dst + i, m, to_bf16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

const GroupKernelsBf16& group_kernels_bf16_avx512() {
  static const GroupKernelsBf16 k{kEmuScoreTile,      kValueTile, scores_bf16_emu, values_bf16_avx512,
                                  exp_shifted_sum_avx512, scale_out,  round_q_bf16_avx512};
  return k;
}

}  // namespace dsinfer::attention_detail
