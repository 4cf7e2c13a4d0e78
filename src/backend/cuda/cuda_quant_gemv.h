// dsinfer CUDA backend: y = x · Wᵀ for DeepSeek-V4's block-quantized weights, dequantised
// on the fly in the kernel (the matrix never exists in BF16/F32 on the device), for decode
// and verify steps (a few rows of x against every weight byte once: memory-bound).
//
// Formats as kernels/cpu/matmul_quant.h (the V4 checkpoints' own layout, uploaded as is):
//  - Fp8Block128: codes [rows, cols] E4M3, scales [ceil(rows/128), ceil(cols/128)] E8M0;
//  - Fp4Group32:  codes [rows, cols/2] E2M1 (element 2j in the low nibble), scales
//    [rows, cols/32] E8M0.
// Data flow: one warp per output row; each lane loads 16 code bytes at a time (16 FP8
// weights or 32 FP4 weights, always inside one scale block), dequantises them exactly (code
// × 2^(e − 127) is an F32), and adds their products with up to 8 rows of x into per-row
// accumulators in a fixed order; the 32 lanes then reduce by a fixed butterfly. Rows of x
// are taken 8 at a time. Every y[i][j] is therefore the same sequence of F32 operations
// whatever m is and whatever else runs (batch invariance). The order differs from the CPU
// kernel's single sequential chain, so the two agree to rounding, not bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/matmul_quant.h"

namespace dsinfer::cuda {

// A quantized matrix in device memory (codes and scales as in the checkpoint).
struct QuantDeviceMatrix {
  QuantFormat format = QuantFormat::Fp8Block128;
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int64_t rows = 0, cols = 0;  // logical [out, in]
};

// Throws Error (naming the shape) unless cols is a multiple of 16 (FP8) or 32 (FP4).
void check_quant_gemv_shape(const QuantDeviceMatrix& w);

// x: [m, cols] F32 (row stride cols), y: [m, rows] F32 (row stride rows), both on the device.
void quant_gemv(const QuantDeviceMatrix& w, const float* x, int m, float* y, cudaStream_t stream);

}  // namespace dsinfer::cuda
