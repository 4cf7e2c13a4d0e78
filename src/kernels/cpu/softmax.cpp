// dsinfer kernels: softmax, scalar reference and ISA dispatch (see softmax.h).
#include "kernels/cpu/softmax.h"

#include <cmath>

#include "kernels/cpu/cpu_features.h"

namespace dsinfer {

float exp_shifted_sum_scalar(const float* x, float* e, int64_t n) {
  if (n <= 0) return 0.0f;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    e[i] = std::exp(x[i] - m);
    s += e[i];
  }
  return s;
}

void softmax_scalar(float* x, int64_t n) {
  float s = exp_shifted_sum_scalar(x, x, n);
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax(float* x, int64_t n) {
  if (isa_level() >= IsaLevel::Avx2) softmax_avx2(x, n);
  else softmax_scalar(x, n);
}

}  // namespace dsinfer
