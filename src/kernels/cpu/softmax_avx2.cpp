// dsinfer kernels: softmax with AVX2/FMA (see softmax.h). Compiled with -mavx2 -mfma and
// called only after the run-time CPU check.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vec_exp_avx2.h"

namespace dsinfer {

float exp_shifted_sum_avx2(const float* x, float* e, int64_t n) {
  if (n <= 0) return 0.0f;
  const int64_t n8 = n & ~int64_t(7);
  float m = x[0];
  if (n8) {
    __m256 vm = _mm256_loadu_ps(x);
    for (int64_t i = 8; i < n8; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    m = avx2::hmax_ps(vm);
  }
  for (int64_t i = n8; i < n; ++i) m = x[i] > m ? x[i] : m;
  const __m256 vmax = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    __m256 v = avx2::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    _mm256_storeu_ps(e + i, v);
    acc = _mm256_add_ps(acc, v);
  }
  float s = avx2::hsum_ps(acc);
  // The tail goes through the same polynomial (one partially filled vector) so a value's
  // exp does not depend on whether it fell in the tail.
  if (n8 < n) {
    alignas(32) float buf[8];
    for (int i = 0; i < 8; ++i) buf[i] = n8 + i < n ? x[n8 + i] : m;
    __m256 v = avx2::exp_ps(_mm256_sub_ps(_mm256_load_ps(buf), vmax));
    _mm256_store_ps(buf, v);
    for (int64_t i = n8; i < n; ++i) {
      e[i] = buf[i - n8];
      s += e[i];
    }
  }
  return s;
}

void softmax_avx2(float* x, int64_t n) {
  float s = exp_shifted_sum_avx2(x, x, n);
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  const int64_t n8 = n & ~int64_t(7);
  for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (int64_t i = n8; i < n; ++i) x[i] *= 1.0f / s;
}

}  // namespace dsinfer
