// dsinfer kernels: the AVX2/FMA core of causal attention for one query row (see
// attention.h). q·k uses 8-lane FMA partial sums over head_dim with a fixed horizontal
// order; the V accumulation walks keys in order, 8 lanes of head_dim at a time. Compiled
// with -mavx2 -mfma, called only after the run-time CPU check.
#include <immintrin.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vec_exp_avx2.h"

namespace dsinfer {

void attend_row_avx2(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                     float* scores, float* out) {
  const int d8 = head_dim & ~7;
  for (int j = 0; j < n_keys; ++j) {
    const float* kj = k + static_cast<int64_t>(j) * head_dim;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= d8; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kj + i), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(kj + i + 8), acc1);
    }
    for (; i < d8; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kj + i), acc0);
    float d = avx2::hsum_ps(_mm256_add_ps(acc0, acc1));
    for (; i < head_dim; ++i) d += q[i] * kj[i];
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

}  // namespace dsinfer
