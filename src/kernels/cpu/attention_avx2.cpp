// dsinfer kernels: the AVX2/FMA core of causal attention for one query row (see
// attention.h). Compiled with -mavx2 -mfma, called only after the run-time CPU check.
//
// Scores: for every key, q·k is accumulated in two 8-lane FMA partial sums over head_dim
// (chunks alternate between them), the two are added, and the 8 lanes are reduced as
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) (avx2::hsum_ps). When head_dim is a multiple of 8,
// eight keys are reduced together by a transpose that performs exactly those additions in
// exactly that order, so each score is bit-identical to the one-key-at-a-time reduction
// and to any other batching: the result never depends on which rows share a call.
// Values: each output lane is fma(p_j, v_j, acc) over keys in ascending order, kept in
// registers across keys (64 lanes of head_dim at a time) instead of a load/store per key.
#include <immintrin.h>

#include "kernels/cpu/attention.h"
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

}  // namespace dsinfer
