// dsinfer kernels: RMSNorm (see rmsnorm.h). Scalar on purpose: it is a tiny share of a
// forward pass, and a plain sequential sum is the easiest fixed reduction order to keep.
#include "kernels/cpu/rmsnorm.h"

#include <cmath>

namespace dsinfer {

void rmsnorm(const float* x, int64_t x_stride, int64_t rows, int64_t n, const float* w, float eps, float* y,
             int64_t y_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    // Same formula as transformers' Qwen3RMSNorm in F32: x * rsqrt(mean + eps) * w.
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

}  // namespace dsinfer
