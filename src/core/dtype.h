// dsinfer core: element types of weights and activations, and scalar conversions.
// Weights arrive as F32, BF16 or F16 (safetensors); all arithmetic accumulates in F32.
// The vectorised conversions live in kernels/; these scalar ones are the reference.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dsinfer {

// F8E4M3 / F8E8M0: safetensors' F8_E4M3 and F8_E8M0, one-byte codes that only the quantised
// matmul (kernels/cpu/matmul_quant.h) reads: FP8 weights and their E8M0 block scales.
enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, I8, F8E4M3, F8E8M0 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses a safetensors dtype string ("F32", "BF16", ...); throws Error naming `what`.
DType dtype_from_safetensors(const std::string& s, const std::string& what);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN preserved (same rule as PyTorch's .to(torch.bfloat16)).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace dsinfer
