// dsinfer kernels: y = x · Wᵀ for block-quantized weights, dequantised on the fly.
//
// Two formats, both as the original DeepSeek-V4 checkpoints store them
// (../shared/docs/deepseek_v4_spec.md §2.1):
//  - Fp8Block128: W[o, i] = e4m3(q[o, i]) · 2^(s[o/128, i/128] − 127); q is [rows, cols]
//    bytes (F8_E4M3), s is [ceil(rows/128), ceil(cols/128)] bytes (F8_E8M0).
//  - Fp4Group32:  W[o, i] = e2m1(nibble) · 2^(s[o, i/32] − 127); q is [rows, cols/2]
//    bytes, element 2j in the low nibble and 2j+1 in the high nibble; s is
//    [rows, cols/32] bytes (F8_E8M0).
// Data flow: each thread takes a range of output rows; for one row it expands the
// quantized bytes into a small F32 scratch row (one row, never the matrix) and dots every
// x row against it. Every y[i][j] is one sequential F32 fma chain over k = 0..cols-1 with
// the dequantised weight, so the result does not depend on m, on the other rows or on the
// thread split (batch invariance). The dequantisation is exact (E4M3/E2M1 values times a
// power of two are representable in F32), so this equals "dequantise to F32, then an F32
// matmul with the same reduction order".
#pragma once
#include <cstdint>

namespace dsinfer {

class ThreadPool;

enum class QuantFormat : uint8_t { Fp8Block128, Fp4Group32 };

struct QuantWeightView {
  QuantFormat format = QuantFormat::Fp8Block128;
  const uint8_t* data = nullptr;    // codes (layout above)
  const uint8_t* scales = nullptr;  // E8M0 exponents (layout above)
  int64_t rows = 0, cols = 0;       // logical [out, in]
};

// Scalar decoders (exact).
float e4m3_to_f32(uint8_t v);
float e2m1_to_f32(uint8_t nibble);
inline float e8m0_to_f32(uint8_t e) {  // 2^(e-127); 255 is NaN in the format
  union {
    uint32_t u;
    float f;
  } b;
  b.u = e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23;  // e == 0 → 2^-127 (subnormal)
  if (e == 255) b.u = 0x7fc00000u;
  return b.f;
}

// Row `row` of W as F32 (the reference dequantisation).
void quant_row_to_f32(const QuantWeightView& w, int64_t row, float* out);
// Bytes the weight occupies in memory (codes + scales).
uint64_t quant_weight_bytes(const QuantWeightView& w);
// x: [m, cols] F32; y: [m, rows] F32. Throws Error on a bad shape (FP4: cols % 32 != 0).
void matmul_quant(const float* x, int64_t m, const QuantWeightView& w, float* y, ThreadPool* pool = nullptr);

}  // namespace dsinfer
