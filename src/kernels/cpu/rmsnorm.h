// dsinfer kernels: RMSNorm, y = x / sqrt(mean(x²) + eps) * w, row by row.
//
// Used for the pre-attention/pre-MLP norms (rows = tokens, n = hidden) and for Qwen3's
// per-head q/k norms (rows = tokens × heads, n = head_dim). Each row's sum of squares is
// accumulated in one fixed order (a single sequential F32 chain), so a row's result never
// depends on how many rows share the call: part of the batch-invariance contract.
#pragma once
#include <cstdint>

namespace dsinfer {

// x and y are [rows, n] with row strides x_stride / y_stride (in floats); y may equal x.
void rmsnorm(const float* x, int64_t x_stride, int64_t rows, int64_t n, const float* w, float eps, float* y,
             int64_t y_stride);

}  // namespace dsinfer
