// dsinfer kernels: y = x · Wᵀ for a weight matrix stored PyTorch-style [out, in].
//
// x is F32 row-major [m, in]; W is F32, BF16 or F16 (usually a pointer into the mmapped
// safetensors); y is F32 row-major [m, out]. Accumulation is always F32.
//
// Two precisions (MatmulPrecision, process-wide, default F32):
//  - F32: W converted to F32 (exact), F32 fma. Used for every F32/F16 W, and for BF16 W
//    unless Bf16Dot is selected.
//  - Bf16Dot (BF16 W only): each x row is rounded to BF16 once per call, and pairs of
//    BF16 products are accumulated in F32 the way AVX512_BF16's vdpbf16ps does (products
//    exact, denormals flushed). On CPUs with that instruction the m > 1 path does twice the
//    multiply-adds per instruction; elsewhere an emulation gives the same bits. The cost is
//    x's precision: 8 significant bits instead of 24, as llama.cpp's BF16 path.
//
// Batch invariance (the determinism contract): for a given precision, every y[i][j] is
// computed with the same sequence of floating-point operations whatever m is, whichever
// rows share the call, however the work is split across threads, and whether the
// matrix-vector (m == 1) or the matrix-matrix (m > 1) path runs. Greedy speculative
// decoding is bit-identical to plain decoding only because of this. The reduction order of
// each precision is written out in matmul_internal.h; the scalar, AVX2 and AVX-512 kernels
// (and, for Bf16Dot, the native AVX512_BF16 one) give identical bits. Threads split the
// output features, never the k reduction. Switching the precision changes the bits, so do
// it before decoding starts, not between a draft and its verification.
//
// Cost model: with m == 1 the call streams W once and runs at close to the memory
// bandwidth (membw.h); m > 1 converts each W vector once and reuses it across 4-5 x rows
// held in registers, so verifying 8 tokens costs about 4-5 decodes (F32), not 8, and
// about 2 with Bf16Dot where the CPU has AVX512_BF16 (12M target shapes, Zen 5).
// Where the CPU has AMX-BF16 and a matrix carries its AMX layout (amx_pack), Bf16Dot runs
// on AMX tiles: up to 16 rows cost about one (matmul_amx.cpp), with that path's own bits.
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
  // Optional: the same BF16 matrix re-laid out for the AMX kernel (amx_pack()), 64-byte
  // aligned, owned by whoever made the view. Used only where matmul runs on AMX; a matrix
  // without it never does, whatever m is.
  const uint16_t* amx_panels = nullptr;
};

enum class MatmulPrecision : uint8_t { F32, Bf16Dot };

// The precision matmul() uses. Set by code, it wins; otherwise DSINFER_MATMUL=f32|bf16
// (read once, on first use; any other value throws Error); otherwise F32.
void set_matmul_precision(MatmulPrecision p);
MatmulPrecision matmul_precision();
const char* matmul_precision_name(MatmulPrecision p);  // "f32" or "bf16"

// pool == nullptr uses ThreadPool::global(). x, y and W may have any alignment; y must not
// alias x. Throws Error for a dtype other than F32/BF16/F16. Uses matmul_precision().
void matmul(const float* x, int64_t m, const WeightView& w, float* y, ThreadPool* pool = nullptr);

// AMX packing: whether this process runs BF16 matmuls on AMX tiles (CPU + OS + Bf16Dot
// precision, DSINFER_AMX not "0") and `w` has a shape the AMX kernel takes (BF16, cols a
// multiple of 32); the packed size in uint16_t elements; and the packing itself into
// `out` (64-byte aligned). Pack before decoding starts, as with the precision.
bool amx_wants(const WeightView& w);
int64_t amx_pack_elems(const WeightView& w);
void amx_pack(const WeightView& w, uint16_t* out);

// The kernel family BF16 matmuls take in this process with Bf16Dot precision: "amx",
// "avx512bf16", "avx512", "avx2" or "scalar" (for check-env and benchmark reports).
const char* bf16_matmul_kernel_name();

// Converts row `row` of W (w.cols elements) to F32 in `out` (used for embedding lookups).
// Exact for every dtype. Throws Error if row is out of range.
void weight_row_to_f32(const WeightView& w, int64_t row, float* out);

}  // namespace dsinfer
