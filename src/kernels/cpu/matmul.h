// dsinfer kernels: y = x · Wᵀ for a weight matrix stored PyTorch-style [out, in].
//
// x is F32 row-major [m, in]; W is F32, BF16 or F16 (usually a pointer into the mmapped
// safetensors); y is F32 row-major [m, out]. Accumulation is always F32.
//
// Batch invariance (the determinism contract): every y[i][j] is computed with the same
// sequence of floating-point operations whatever m is, whichever rows share the call,
// however the work is split across threads, and whether the matrix-vector (m == 1) or
// the matrix-matrix (m > 1) path runs. Greedy speculative decoding is bit-identical to
// plain decoding only because of this. The reduction order every path follows (16 fma
// lanes over k, a fixed add tree, an in-order scalar tail) is written out in
// matmul_internal.h; scalar, AVX2 and AVX-512 kernels give identical bits. Threads split
// the output features, never the k reduction.
//
// Cost model: with m == 1 the call streams W once and runs at close to the memory
// bandwidth (membw.h); m > 1 converts each W vector once and reuses it across up to 4 x
// rows held in registers, so verifying 8 tokens costs about 2 decodes, not 8.
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

// pool == nullptr uses ThreadPool::global(). x, y and W may have any alignment; y must not
// alias x. Throws Error for a dtype other than F32/BF16/F16.
void matmul(const float* x, int64_t m, const WeightView& w, float* y, ThreadPool* pool = nullptr);

// Converts row `row` of W (w.cols elements) to F32 in `out` (used for embedding lookups).
// Exact for every dtype. Throws Error if row is out of range.
void weight_row_to_f32(const WeightView& w, int64_t row, float* out);

}  // namespace dsinfer
