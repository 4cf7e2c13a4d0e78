// dsinfer CUDA backend: y = x · Wᵀ for DeepSeek-V4's block-quantized weights, dequantised
// on the fly in the kernel (the matrix never exists in BF16/F32 on the device), for decode
// and verify steps (a few rows of x against every weight byte once: memory-bound).
//
// Formats as kernels/cpu/matmul_quant.h (the V4 checkpoints' own layout, uploaded as is):
//  - Fp8Block128: codes [rows, cols] E4M3, scales [ceil(rows/128), ceil(cols/128)] E8M0;
//  - Fp4Group32:  codes [rows, cols/2] E2M1 (element 2j in the low nibble), scales
//    [rows, cols/32] E8M0.
// Data flow: one warp per 2 output rows, lane l owning the 16-byte code chunks l, l + 32,
// ... of both (16 FP8 or 32 FP4 weights, always inside one scale block); every lane loads
// its chunks of a column tile before decoding any. Codes are decoded exactly without
// branches: E4M3 pairs by the hardware's e4m3x2 -> f16x2 conversion, E2M1 by placing each
// nibble's bits in an f16 (value * 2^-14), then f16 -> F32. Per chunk, per row of x, the
// products with the decoded codes form one F32 fma chain from 0 (element order); the chunk
// sum times the chunk's power-of-two scale (exact) is fma'd into the lane's accumulator,
// chunks in ascending order; the 32 lanes then reduce by a fixed xor butterfly. x (up to 8
// rows) is staged per block and tile in shared memory, padded so that the lanes' 16-byte
// reads of 32 different chunks are bank-conflict free. Every y[i][j] is therefore the same
// sequence of F32 operations whatever m is and whatever else runs (batch invariance). The
// order differs from the CPU kernel's single sequential chain, so the two agree to
// rounding, not bit for bit.
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

// Routed experts (DeepSeek-V4 MoE): for each pair p < pairs, y[p, :] = x[p / x_div, :] . W_e^T
// with e = eid[p] (a device array) and W_e the matrix whose codes and scales start
// e * code_stride and e * scale_stride bytes after w's; one launch for every pair, no host
// round trip for the routing. Same arithmetic per output as quant_gemv with one row of x.
void quant_gemv_routed(const QuantDeviceMatrix& w, int64_t code_stride, int64_t scale_stride, const int32_t* eid,
                       int pairs, const float* x, int x_div, float* y, cudaStream_t stream);

}  // namespace dsinfer::cuda
