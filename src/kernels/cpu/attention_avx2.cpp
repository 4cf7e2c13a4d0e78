// dsinfer kernels: the AVX2/FMA cores of attention: attend_row_avx2 (one query row, the
// bit-exact specification of every SIMD path) and the grouped micro-kernels that
// attend_group() drives (attention_internal.h). Compiled with -mavx2 -mfma, called only
// after the run-time CPU check.
//
// Scores: for every key, q·k is accumulated in two 8-lane FMA partial sums over head_dim
// (chunks alternate between them), the two are added, and the 8 lanes are reduced as
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) (avx2::hsum_ps). When head_dim is a multiple of 8,
// eight keys are reduced together by a transpose that performs exactly those additions in
// exactly that order, so each score is bit-identical to the one-key-at-a-time reduction
// and to any other batching: the result never depends on which rows share a call.
// Values: each output lane is fma(p_j, v_j, acc) over keys in ascending order, kept in
// registers across keys (64 lanes of head_dim at a time) instead of a load/store per key.
// The grouped kernels run these same chains for several query vectors at once, so one
// load of a key (value) row feeds the fmas of all of them; the first tile over a key
// block prefetches rows ahead (DRAM-resident K/V at decode, see attention_internal.h).
#include <immintrin.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vec_exp_avx2.h"

namespace dsinfer {

namespace {

// Sum of the two partial-sum vectors of one key (the value hsum_ps then reduces).
inline __m256 key_partial(const float* q, const float* kj, int d8) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= d8; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kj + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(kj + i + 8), acc1);
  }
  for (; i < d8; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kj + i), acc0);
  return _mm256_add_ps(acc0, acc1);
}

// Horizontal sums of s[0..7], each in hsum_ps's order, returned as one vector.
inline __m256 hsum8(const __m256 s[8]) {
  // a_k = lo(s_k) + hi(s_k), keys k and k+4 side by side.
  __m256 a0 = _mm256_add_ps(_mm256_permute2f128_ps(s[0], s[4], 0x20), _mm256_permute2f128_ps(s[0], s[4], 0x31));
  __m256 a1 = _mm256_add_ps(_mm256_permute2f128_ps(s[1], s[5], 0x20), _mm256_permute2f128_ps(s[1], s[5], 0x31));
  __m256 a2 = _mm256_add_ps(_mm256_permute2f128_ps(s[2], s[6], 0x20), _mm256_permute2f128_ps(s[2], s[6], 0x31));
  __m256 a3 = _mm256_add_ps(_mm256_permute2f128_ps(s[3], s[7], 0x20), _mm256_permute2f128_ps(s[3], s[7], 0x31));
  // b = (a0 + a2, a1 + a3) per key.
  __m256 g01 = _mm256_add_ps(_mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
  __m256 g23 = _mm256_add_ps(_mm256_shuffle_ps(a2, a3, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a2, a3, _MM_SHUFFLE(3, 2, 3, 2)));
  // c = b0 + b1 per key: lanes [k0 k1 k2 k3 | k4 k5 k6 k7].
  return _mm256_add_ps(_mm256_shuffle_ps(g01, g23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(g01, g23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// out[c*8 .. c*8+8) for chunks c in [c0, c0 + U): sum over keys of p_j * v_j, in key order.
template <int U>
inline void accumulate_values(const float* v, const float* p, int n_keys, int head_dim, int c0, float* out) {
  __m256 acc[U];
  for (int u = 0; u < U; ++u) acc[u] = _mm256_setzero_ps();
  for (int j = 0; j < n_keys; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * head_dim + c0 * 8;
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (int u = 0; u < U; ++u) acc[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + u * 8), acc[u]);
  }
  for (int u = 0; u < U; ++u) _mm256_storeu_ps(out + (c0 + u) * 8, acc[u]);
}

// The general path (head_dim not a multiple of 8): one key at a time with scalar tails.
void attend_row_any(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                    float* scores, float* out) {
  const int d8 = head_dim & ~7;
  for (int j = 0; j < n_keys; ++j) {
    const float* kj = k + static_cast<int64_t>(j) * head_dim;
    float d = avx2::hsum_ps(key_partial(q, kj, d8));
    for (int i = d8; i < head_dim; ++i) d += q[i] * kj[i];
    scores[j] = d * scale;
  }
  const float sum = exp_shifted_sum_avx2(scores, scores, n_keys);
  for (int i = 0; i < head_dim; ++i) out[i] = 0.0f;
  for (int j = 0; j < n_keys; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * head_dim;
    const __m256 p = _mm256_set1_ps(scores[j]);
    int i = 0;
    for (; i < d8; i += 8) _mm256_storeu_ps(out + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + i), _mm256_loadu_ps(out + i)));
    for (; i < head_dim; ++i) out[i] += scores[j] * vj[i];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  int i = 0;
  for (; i < d8; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), inv));
  for (; i < head_dim; ++i) out[i] *= 1.0f / sum;
}

}  // namespace

void attend_row_avx2(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                     float* scores, float* out) {
  if (head_dim % 8 != 0) {
    attend_row_any(q, k, v, n_keys, head_dim, scale, scores, out);
    return;
  }
  const int d8 = head_dim;
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = 0;
  for (; j + 8 <= n_keys; j += 8) {
    __m256 s[8];
    for (int t = 0; t < 8; ++t) s[t] = key_partial(q, k + static_cast<int64_t>(j + t) * head_dim, d8);
    _mm256_storeu_ps(scores + j, _mm256_mul_ps(hsum8(s), vscale));
  }
  for (; j < n_keys; ++j) scores[j] = avx2::hsum_ps(key_partial(q, k + static_cast<int64_t>(j) * head_dim, d8)) * scale;

  const float sum = exp_shifted_sum_avx2(scores, scores, n_keys);
  const int chunks = head_dim / 8;
  int c = 0;
  for (; c + 8 <= chunks; c += 8) accumulate_values<8>(v, scores, n_keys, head_dim, c, out);
  for (; c < chunks; ++c) accumulate_values<1>(v, scores, n_keys, head_dim, c, out);
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (int i = 0; i < head_dim; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), inv));
}

// ---- grouped micro-kernels (head_dim % 8 == 0) -------------------------------------------

namespace attention_detail {
namespace {

// Left to itself GCC folds a load used by several fmas into each of them as a memory
// operand, which makes the loop load-bound (one load per fma); this keeps one load.
inline __m256 in_register(__m256 x) {
  __asm__("" : "+x"(x));
  return x;
}

constexpr int kScoreTile = 3;  // query vectors per scores tile (12 accumulators for 2 keys)
constexpr int kValueTile = 3;  // query vectors per values tile
constexpr int kValueU = 2;     // 8-lane chunks of head_dim per values pass (6 accumulators)

// part[r][kk], part[r][kk + 1]: key_partial() of query r against keys k0 and k1.
template <int Q>
inline void partials_2keys(const float* const* q, const float* k0, const float* k1, int D, __m256 (*part)[8],
                           int kk) {
  __m256 a0[Q][2], a1[Q][2];
  for (int r = 0; r < Q; ++r)
    for (int t = 0; t < 2; ++t) a0[r][t] = a1[r][t] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= D; i += 16) {
    const __m256 k00 = in_register(_mm256_loadu_ps(k0 + i)), k01 = in_register(_mm256_loadu_ps(k0 + i + 8));
    const __m256 k10 = in_register(_mm256_loadu_ps(k1 + i)), k11 = in_register(_mm256_loadu_ps(k1 + i + 8));
    for (int r = 0; r < Q; ++r) {
      const __m256 q0 = _mm256_loadu_ps(q[r] + i), q1 = _mm256_loadu_ps(q[r] + i + 8);
      a0[r][0] = _mm256_fmadd_ps(q0, k00, a0[r][0]);
      a1[r][0] = _mm256_fmadd_ps(q1, k01, a1[r][0]);
      a0[r][1] = _mm256_fmadd_ps(q0, k10, a0[r][1]);
      a1[r][1] = _mm256_fmadd_ps(q1, k11, a1[r][1]);
    }
  }
  if (i < D) {  // head_dim % 16 == 8: the last chunk goes to the first partial sum
    const __m256 k00 = _mm256_loadu_ps(k0 + i), k10 = _mm256_loadu_ps(k1 + i);
    for (int r = 0; r < Q; ++r) {
      const __m256 q0 = _mm256_loadu_ps(q[r] + i);
      a0[r][0] = _mm256_fmadd_ps(q0, k00, a0[r][0]);
      a0[r][1] = _mm256_fmadd_ps(q0, k10, a0[r][1]);
    }
  }
  for (int r = 0; r < Q; ++r) {
    part[r][kk] = _mm256_add_ps(a0[r][0], a1[r][0]);
    part[r][kk + 1] = _mm256_add_ps(a0[r][1], a1[r][1]);
  }
}

template <int Q>
void scores_tile(const float* const* q, const float* k, int j0, int j1, int D, float scale, float* const* s,
                 bool prefetch) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = j0;
  for (; j + 8 <= j1; j += 8) {
    const float* kj = k + static_cast<int64_t>(j) * D;
    if (prefetch) prefetch_rows(kj + kPrefetchKeys * D, 8 * D);
    __m256 part[Q][8];
    for (int kk = 0; kk < 8; kk += 2) partials_2keys<Q>(q, kj + kk * D, kj + (kk + 1) * D, D, part, kk);
    for (int r = 0; r < Q; ++r) _mm256_storeu_ps(s[r] + j, _mm256_mul_ps(hsum8(part[r]), vscale));
  }
  for (; j < j1; ++j)
    for (int r = 0; r < Q; ++r)
      s[r][j] = avx2::hsum_ps(key_partial(q[r], k + static_cast<int64_t>(j) * D, D)) * scale;
}

void scores(int nq, const float* const* q, const float* k, int j0, int j1, int D, float scale, float* const* s,
            bool prefetch) {
  switch (nq) {
    case 1: scores_tile<1>(q, k, j0, j1, D, scale, s, prefetch); break;
    case 2: scores_tile<2>(q, k, j0, j1, D, scale, s, prefetch); break;
    default: scores_tile<kScoreTile>(q, k, j0, j1, D, scale, s, prefetch); break;
  }
}

// Lanes [c0, c0 + 8U) of out[r], r < Q, over keys [j0, j1).
template <int Q, int U>
void values_pass(const float* const* p, const float* v, int j0, int j1, int D, float* const* out, bool zero,
                 bool prefetch, int c0) {
  __m256 acc[Q][U];
  for (int r = 0; r < Q; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(out[r] + c0 + u * 8);
  for (int j = j0; j < j1; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * D + c0;
    if (prefetch && c0 == 0) prefetch_rows(vj + kPrefetchKeys * D, D);  // whole rows: later passes hit
    __m256 pj[Q];
    for (int r = 0; r < Q; ++r) pj[r] = _mm256_broadcast_ss(p[r] + j);
    for (int u = 0; u < U; ++u) {
      const __m256 vv = in_register(_mm256_loadu_ps(vj + u * 8));
      for (int r = 0; r < Q; ++r) acc[r][u] = _mm256_fmadd_ps(pj[r], vv, acc[r][u]);
    }
  }
  for (int r = 0; r < Q; ++r)
    for (int u = 0; u < U; ++u) _mm256_storeu_ps(out[r] + c0 + u * 8, acc[r][u]);
}

template <int Q>
void values_tile(const float* const* p, const float* v, int j0, int j1, int D, float* const* out, bool zero,
                 bool prefetch) {
  int c = 0;
  for (; c + kValueU * 8 <= D; c += kValueU * 8) values_pass<Q, kValueU>(p, v, j0, j1, D, out, zero, prefetch, c);
  for (; c < D; c += 8) values_pass<Q, 1>(p, v, j0, j1, D, out, zero, prefetch, c);
}

void values(int nq, const float* const* p, const float* v, int j0, int j1, int D, float* const* out, bool zero,
            bool prefetch) {
  switch (nq) {
    case 1: values_tile<1>(p, v, j0, j1, D, out, zero, prefetch); break;
    case 2: values_tile<2>(p, v, j0, j1, D, out, zero, prefetch); break;
    default: values_tile<kValueTile>(p, v, j0, j1, D, out, zero, prefetch); break;
  }
}

void scale_out(float* out, int D, float inv) {
  const __m256 vinv = _mm256_set1_ps(inv);
  for (int i = 0; i < D; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), vinv));
}

}  // namespace

const GroupKernels& group_kernels_avx2() {
  static const GroupKernels k{kScoreTile, kValueTile, scores, values, exp_shifted_sum_avx2, scale_out};
  return k;
}

}  // namespace attention_detail

}  // namespace dsinfer
