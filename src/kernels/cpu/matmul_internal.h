// dsinfer kernels: internals of matmul shared by the per-ISA files and the tests.
//
// Data flow: matmul() (matmul.cpp) picks a Path (the kernel family) for isa_level() and
// the precision, splits the output features (rows of W) into contiguous blocks across the
// thread pool, and each block calls a "rows kernel" below, which computes
// y[0..m)[j0..j1) for all m activation rows. For Bf16Dot, matmul() first rounds x to BF16
// into a zero-padded scratch buffer that the rows kernels read instead of x.
//
// Canonical order, F32 precision (every path must follow it bit for bit):
//   K = w.cols, K16 = K rounded down to a multiple of kLanes (16).
//   1. 16 partial sums p[0..15], all +0.0f. For k = 0, 16, 32, ... < K16 and l = 0..15:
//        p[l] = fma(x[k + l], w[k + l], p[l])         (one rounding per step)
//   2. fixed tree: q[l] = p[l] + p[l + 8] (l < 8); r[l] = q[l] + q[l + 4] (l < 4);
//                  s[l] = r[l] + r[l + 2] (l < 2);  acc = s[0] + s[1]
//   3. scalar tail in order: for k = K16 .. K-1: acc = fma(x[k], w[k], acc)
// (W is converted to F32 exactly before the fma: BF16/F16 -> F32 is lossless.)
//
// Canonical order, Bf16Dot precision (BF16 W only):
//   0. x row -> BF16: xb[k] = f32_to_bf16(daz(x[k])), where daz maps |v| < FLT_MIN to a
//      zero of the same sign (vcvtneps2bf16's rule; NaN stays NaN, quieted). W elements
//      below FLT_MIN (BF16 subnormals) count as zero. K32 = K rounded UP to a multiple of
//      32; xb and w are logically zero-padded to K32 (kernels load W tails masked and never
//      read past W's memory).
//   1. 16 partial sums p[0..15], all +0.0f. For each 32-chunk c < K32 / 32 and l = 0..15,
//      odd element first:
//        p[l] = step(p[l], xb[32c + 2l + 1], w[32c + 2l + 1])
//        p[l] = step(p[l], xb[32c + 2l],     w[32c + 2l])
//      step(p, a, b) = a * b + p with the product exact and one rounding (an fma); a
//      result below FLT_MIN in magnitude, after rounding to 24 bits with unbounded exponent
//      (x86 detects underflow after rounding), becomes a zero of its sign. This is
//      vdpbf16ps, lane for lane (measured on Zen 5: 0 differences in 6.4M random lanes
//      including the underflow range).
//   2. the same tree as F32 step 2, each addition flushing a result below FLT_MIN to a zero
//      of its sign (p[l] are never subnormal, so sums that small are exact).
//   No tail: the padding has added +0 products, identical on every path.
// In SSE terms, step 1 is two fmas (odd element first) and step 2 the F32 tree, all with
// MXCSR's FTZ and DAZ set: the SIMD kernels set them for the whole call (the native kernel
// needs them only for its tree), and the emulations are exactly those fmas.
// bf16_dot_step() and reduce16_ftz() below are the scalar specification.
//
// One AVX-512 register or two AVX2 registers hold p[0..15]; the scalar path keeps 16
// floats. Register blocking over several x rows and several W rows only changes how
// many such independent reductions run side by side, never the order inside one, so
// y[i][j] does not depend on m, on which rows share the call, on the thread split, nor on
// the path.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"

namespace dsinfer::matmul_detail {

inline constexpr int kLanes = 16;
// Bf16Dot consumes x and W in chunks of 32 BF16 elements (16 lanes x 2).
inline constexpr int kBf16Chunk = 32;

// Computes y[i * ldy + j] for i in [0, m), j in [j0, j1). x is [m, w.cols] row-major.
using RowsKernel = void (*)(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1,
                            float* y, int64_t ldy);
// The Bf16Dot form: xb is [m, ldx] BF16 (ldx = w.cols rounded up to kBf16Chunk, the
// padding zero, rows 64-byte aligned), w.dtype is BF16.
using Bf16RowsKernel = void (*)(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w,
                                int64_t j0, int64_t j1, float* y, int64_t ldy);
// Rounds x [m, K] to BF16 (step 0 above) into xb [m, ldx], zero-filling columns K..ldx.
using XToBf16 = void (*)(const float* x, int64_t m, int64_t K, uint16_t* xb, int64_t ldx);

void rows_scalar(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
                 int64_t ldy);
void rows_avx2(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
               int64_t ldy);
void rows_avx512(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
                 int64_t ldy);

void bf16_rows_scalar(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0,
                      int64_t j1, float* y, int64_t ldy);
void bf16_rows_avx2(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0,
                    int64_t j1, float* y, int64_t ldy);
void bf16_rows_avx512(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0,
                      int64_t j1, float* y, int64_t ldy);  // AVX-512F emulation
void bf16_rows_avx512bf16(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0,
                          int64_t j1, float* y, int64_t ldy);  // native vdpbf16ps

// AMX (matmul_amx.cpp). amx_pack_weights re-lays BF16 W [rows, cols] (cols % 32 == 0)
// out as VNNI panels of 16 output features (amx_packed_elems elements, last panel zero
// padded); amx_rows computes y rows [0, m) x features [j0, j1) (j0 a multiple of 16) from
// x rounded to BF16 (xb [m, ldx]) and w.amx_panels. amx_os_enabled() asks Linux for the
// tile state (once per process).
int64_t amx_packed_elems(int64_t rows, int64_t cols);
void amx_pack_weights(const WeightView& w, uint16_t* out);
void amx_rows(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
              int64_t ldy);
bool amx_os_enabled();

void x_to_bf16_scalar(const float* x, int64_t m, int64_t K, uint16_t* xb, int64_t ldx);
void x_to_bf16_avx2(const float* x, int64_t m, int64_t K, uint16_t* xb, int64_t ldx);
void x_to_bf16_avx512(const float* x, int64_t m, int64_t K, uint16_t* xb, int64_t ldx);

// The kernel families. Avx512Bf16 differs from Avx512 only for Bf16Dot (the native
// instruction instead of its emulation); with F32 precision it runs the Avx512 kernel.
//
// Amx runs Bf16Dot on AMX tiles where the CPU and OS allow it, for matrices that carry an
// AMX layout (WeightView::amx_panels; others take the Avx512Bf16 kernel, for every m):
// its order of operations is the hardware's, not the canonical one above, so its bits
// differ from the other paths, but, like them, never
// depend on m, on which rows share a call, or on the thread split. With F32 precision it
// runs the Avx512 kernel. DSINFER_AMX=0 keeps a process off it.
enum class Path { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, Amx = 4 };
const char* path_name(Path p);

// The best level this CPU can run, ignoring DSINFER_ISA (tests iterate up to it).
IsaLevel hardware_isa_level();
// The best path this CPU can run, ignoring DSINFER_ISA (Amx only if amx_usable()).
Path hardware_path();
// AMX-BF16 + AVX512_BF16 on the CPU, the tile state granted by the OS, DSINFER_AMX not "0"
// (any value but 0, 1 or empty throws Error naming it).
bool amx_usable();
// The path matmul() takes at `isa`: the ISA's own, plus the native BF16 kernel (or AMX)
// at Avx512 when the CPU has it.
Path path_for(IsaLevel isa);

// p, or hardware_path() if the CPU cannot run p.
Path runnable_path(Path p);

// The kernel for `isa`, lowered to hardware_isa_level() if the CPU cannot run it.
RowsKernel rows_kernel(IsaLevel isa);

// Default lower bound on the work of one thread chunk (multiply-adds), see matmul.cpp.
inline constexpr int64_t kMinMacsPerChunk = int64_t{1} << 18;

// matmul() with an explicit path (lowered to hardware_path() if the CPU cannot run it) and
// precision instead of the process-wide ones, and an explicit chunk size; tests use it to
// compare paths in one process (DSINFER_ISA is read only once) and to force small
// matrices to be split across threads.
void matmul_path(Path path, MatmulPrecision prec, const float* x, int64_t m, const WeightView& w,
                 float* y, ThreadPool* pool, int64_t min_macs_per_chunk = kMinMacsPerChunk);
// The same with the path matmul() takes at `isa`.
void matmul_isa(IsaLevel isa, MatmulPrecision prec, const float* x, int64_t m, const WeightView& w,
                float* y, ThreadPool* pool, int64_t min_macs_per_chunk = kMinMacsPerChunk);

// The horizontal step 2 above, in scalar code (used by the scalar path and as the
// specification the SIMD versions are tested against).
inline float reduce16(const float* p) {
  float q[8], r[4];
  for (int l = 0; l < 8; ++l) q[l] = p[l] + p[l + 8];
  for (int l = 0; l < 4; ++l) r[l] = q[l] + q[l + 4];
  float s0 = r[0] + r[2], s1 = r[1] + r[3];
  return s0 + s1;
}

// ---- the Bf16Dot specification in scalar code -----------------------------------------

// A subnormal becomes a zero of its sign (DAZ on inputs, SSE's FTZ on results).
inline float flush_subnormal(float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; }

// Step 1's step(p, a, b); a and b are never subnormal (flushed before).
inline float bf16_dot_step(float p, float a, float b) {
  const float r = std::fma(a, b, p);  // exact product, one rounding (to the subnormal grid)
  if (std::fabs(r) > FLT_MIN || std::isnan(r)) return r;
  if (std::fabs(r) < FLT_MIN) return std::copysign(0.0f, r);
  // |r| == FLT_MIN: the exact sum may lie in [FLT_MIN - 2^-150, FLT_MIN), where rounding to
  // 24 bits with unbounded exponent gives a value below FLT_MIN iff the sum is below
  // FLT_MIN - 2^-151. The double fma is exact up to its own rounding, close enough here.
  const double d = std::fma(static_cast<double>(a), static_cast<double>(b), static_cast<double>(p));
  return std::fabs(d) < static_cast<double>(FLT_MIN) - 0x1p-151 ? std::copysign(0.0f, r) : r;
}

// Step 2: reduce16 with each sum flushed.
inline float reduce16_ftz(const float* p) {
  float q[8], r[4];
  for (int l = 0; l < 8; ++l) q[l] = flush_subnormal(p[l] + p[l + 8]);
  for (int l = 0; l < 4; ++l) r[l] = flush_subnormal(q[l] + q[l + 4]);
  float s0 = flush_subnormal(r[0] + r[2]), s1 = flush_subnormal(r[1] + r[3]);
  return flush_subnormal(s0 + s1);
}

// Step 0 for one element.
inline uint16_t x_to_bf16(float v) { return f32_to_bf16(flush_subnormal(v)); }

#if defined(__x86_64__)
// Sets MXCSR's FTZ and DAZ bits for the life of the object (one Bf16Dot rows kernel call
// on one thread) and restores the caller's MXCSR after. The arithmetic it governs must sit
// in a function that is not inlined into the guard's scope, so that the compiler cannot
// move it across the MXCSR writes.
class FlushSubnormalsScope {
 public:
  FlushSubnormalsScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushSubnormalsScope() { _mm_setcsr(saved_); }
  FlushSubnormalsScope(const FlushSubnormalsScope&) = delete;
  FlushSubnormalsScope& operator=(const FlushSubnormalsScope&) = delete;

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
};
#endif

}  // namespace dsinfer::matmul_detail
