// dsinfer CUDA backend: exact decoders of DeepSeek-V4's quantized codes (E4M3 weights,
// E2M1 weights, E8M0 scales) by bit arithmetic, for host and device. The quantized GEMV
// (cuda_quant_gemv.cu) runs them on the GPU; the tests run them on the host against
// kernels/cpu/matmul_quant's decoders for every code, so CI checks the device arithmetic
// without a GPU. Plain C++ when not compiled by nvcc.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSINFER_QD __host__ __device__ __forceinline__
#else
#define DSINFER_QD inline
#endif

namespace dsinfer::quant_decode {

DSINFER_QD float bits_to_f32(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

DSINFER_QD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}

// 2^(e - 127); e == 0 is 2^-127 (an F32 subnormal), e == 255 NaN.
DSINFER_QD float e8m0(uint32_t e) {
  return bits_to_f32(e == 0 ? 0x00400000u : (e == 255 ? 0x7fc00000u : e << 23));
}

// E4M3, OCP "fn" variant: no infinities, S.1111.111 is NaN. Normal codes (exponent field
// 1..15): (1 + man/8) · 2^(exp − 7), i.e. F32 exponent field exp + 120 with the 3 mantissa
// bits on top of F32's; subnormals (exponent field 0): man · 2^-9, exact.
DSINFER_QD float e4m3(uint32_t v) {
  const uint32_t sign = (v & 0x80u) << 24, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  if (exp == 0xfu && man == 0x7u) return bits_to_f32(0x7fc00000u);
  const float mag = exp ? bits_to_f32(((exp + 120u) << 23) | (man << 20)) : static_cast<float>(man) * 0x1p-9f;
  return bits_to_f32(f32_to_bits(mag) | sign);
}

// E2M1: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (low three bits: exponent 2, mantissa 1; bit 3: sign).
DSINFER_QD float e2m1(uint32_t nib) {
  const uint32_t m = nib & 0x7u;
  // Exponent field e = m >> 1, mantissa bit m & 1: e == 0 → 0.5 · man; else (1 + man/2) · 2^(e − 1),
  // F32 exponent field e + 126 with the mantissa bit at F32 bit 22.
  const float mag = (m >> 1) ? bits_to_f32((((m >> 1) + 126u) << 23) | ((m & 1u) << 22)) : 0.5f * static_cast<float>(m & 1u);
  return bits_to_f32(f32_to_bits(mag) | ((nib & 0x8u) << 28));
}

}  // namespace dsinfer::quant_decode
