// dsinfer kernels: argmax, scalar reference and ISA dispatch (see argmax.h).
#include "kernels/cpu/argmax.h"

#include "kernels/cpu/cpu_features.h"

namespace dsinfer {

int32_t argmax_f32_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

int32_t argmax_f32(const float* x, int64_t n) {
  if (isa_level() >= IsaLevel::Avx512) return argmax_f32_avx512(x, n);
  return argmax_f32_scalar(x, n);
}

}  // namespace dsinfer
