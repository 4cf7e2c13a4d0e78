// dsinfer kernels: y = x · Wᵀ for a weight matrix stored PyTorch-style [out, in].
//
// x is F32 row-major [m, in]; W is F32, BF16 or F16 (usually a pointer into the mmapped
// safetensors); y is F32 row-major [m, out]. Accumulation is always F32.
//
// Batch invariance (the determinism contract): every y[i][j] is computed with the same
// sequence of floating-point operations whatever m is, whichever rows share the call,
// however the work is split across threads, and whether the matrix-vector (m == 1) or
// the matrix-matrix (m > 1) path runs. Greedy speculative decoding is bit-identical to
// plain decoding only because of this.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace dsinfer {

class ThreadPool;

struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;  // out features
  int64_t cols = 0;  // in features
};

// pool == nullptr uses ThreadPool::global().
void matmul(const float* x, int64_t m, const WeightView& w, float* y, ThreadPool* pool = nullptr);

// Converts `n` elements of a weight row to F32 (used for embedding lookups).
void weight_row_to_f32(const WeightView& w, int64_t row, float* out);

}  // namespace dsinfer
