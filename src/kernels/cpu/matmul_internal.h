// dsinfer kernels: internals of matmul shared by the per-ISA files and the tests.
//
// Data flow: matmul() (matmul.cpp) picks the kernel for isa_level(), splits the output
// features (rows of W) into contiguous blocks across the thread pool, and each block calls
// a "rows kernel" below, which computes y[0..m)[j0..j1) for all m activation rows.
//
// The canonical per-element reduction (every path must follow it bit for bit):
//   K = w.cols, K16 = K rounded down to a multiple of kLanes (16).
//   1. 16 partial sums p[0..15], all +0.0f. For k = 0, 16, 32, ... < K16 and l = 0..15:
//        p[l] = fma(x[k + l], w[k + l], p[l])         (one rounding per step)
//   2. fixed tree: q[l] = p[l] + p[l + 8] (l < 8); r[l] = q[l] + q[l + 4] (l < 4);
//                  s[l] = r[l] + r[l + 2] (l < 2);  acc = s[0] + s[1]
//   3. scalar tail in order: for k = K16 .. K-1: acc = fma(x[k], w[k], acc)
// One AVX-512 register or two AVX2 registers hold p[0..15]; the scalar path keeps 16
// floats. Register blocking over several x rows and several W rows only changes how
// many such independent reductions run side by side, never the order inside one, so
// y[i][j] does not depend on m, on which rows share the call, on the thread split, nor on
// the ISA. (W is converted to F32 exactly before the fma: BF16/F16 -> F32 is lossless.)
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"

namespace dsinfer::matmul_detail {

inline constexpr int kLanes = 16;

// Computes y[i * ldy + j] for i in [0, m), j in [j0, j1). x is [m, w.cols] row-major.
using RowsKernel = void (*)(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1,
                            float* y, int64_t ldy);

void rows_scalar(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
                 int64_t ldy);
void rows_avx2(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
               int64_t ldy);
void rows_avx512(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
                 int64_t ldy);

// The best level this CPU can run, ignoring DSINFER_ISA (tests iterate up to it).
IsaLevel hardware_isa_level();

// The kernel for `isa`, lowered to hardware_isa_level() if the CPU cannot run it.
RowsKernel rows_kernel(IsaLevel isa);

// Default lower bound on the work of one thread chunk (multiply-adds), see matmul.cpp.
inline constexpr int64_t kMinMacsPerChunk = int64_t{1} << 18;

// matmul() with an explicit ISA level instead of isa_level(), and an explicit chunk size;
// tests use it to compare paths in one process (DSINFER_ISA is read only once) and to force
// small matrices to be split across threads.
void matmul_isa(IsaLevel isa, const float* x, int64_t m, const WeightView& w, float* y,
                ThreadPool* pool, int64_t min_macs_per_chunk = kMinMacsPerChunk);

// The horizontal step 2 above, in scalar code (used by the scalar path and as the
// specification the SIMD versions are tested against).
inline float reduce16(const float* p) {
  float q[8], r[4];
  for (int l = 0; l < 8; ++l) q[l] = p[l] + p[l + 8];
  for (int l = 0; l < 4; ++l) r[l] = q[l] + q[l + 4];
  float s0 = r[0] + r[2], s1 = r[1] + r[3];
  return s0 + s1;
}

}  // namespace dsinfer::matmul_detail
