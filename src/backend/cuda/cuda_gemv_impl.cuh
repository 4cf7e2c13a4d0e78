// dsinfer CUDA backend: the per-element device code of the invariant GEMM row kernel
// (cuda_gemm.cu) that the persistent decode kernel (cuda_persistent_decode.cu) must repeat
// bit for bit: BF16 unpacking, the A staging transform, the SwiGLU epilogue and the argmax
// key; the tensor-core GEMM (cuda_gemm_mma.cu) stages A and keys argmax with the same code.
// One copy, so the paths cannot drift apart. Device code only; include from .cu files.
#pragma once
#include <cuda_bf16.h>

namespace dsinfer::cuda::detail {

// Threads (4 warps) over which an RMSNorm's sum of squares is strided, whatever the block
// size: the row kernel and the persistent kernel reduce in this same order.
constexpr int kNormThreads = 128;

// 8 BF16 values (one 16-byte load) as F32.
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// acc + the 8 products a[j] * w[j], in order: one 16-byte chunk's step of the row GEMM's and
// the fused layer tail's dot products, one FMA chain for both (the persistent kernel writes
// the same chain out by hand, two accumulators interleaved).
__device__ __forceinline__ float dot8(const float (&a)[8], const float (&w)[8], float acc) {
#pragma unroll
  for (int j = 0; j < 8; ++j) acc = fmaf(a[j], w[j], acc);
  return acc;
}

// ss + the squares of v's four values, in order (every RMSNorm sum of the GEMM kernels).
__device__ __forceinline__ float add_squares(const float4& v, float ss) {
  ss = fmaf(v.x, v.x, ss);
  ss = fmaf(v.y, v.y, ss);
  ss = fmaf(v.z, v.z, ss);
  return fmaf(v.w, v.w, ss);
}

// A weight load: read once per token, never reused within it, so with evict_first (policy
// from createpolicy) its L2 lines are the first to go, and the L2 keeps what is reused
// instead (the K/V rows attention reads, the activations each GEMM stages); else __ldg.
__device__ __forceinline__ uint4 load_weight(const uint4* p, bool evict_first, unsigned long long policy) {
  if (!evict_first) return __ldg(p);
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
  return v;
}

__device__ __forceinline__ unsigned long long evict_first_policy() {
  unsigned long long policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// silu(g) * u, as kernels/cpu/silu_mul.cpp computes it.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// One 16-byte chunk of a staged row of A from 8 F32 inputs x (two float4) and their partners
// y: RmsNorm bf16(y * (x * inv)) with y the norm weight, SiluMul bf16(silu(x) * y) with y the
// up half (kRmsNorm false). Every staging loop (one row at a time, all rows at once, the
// tensor-core kernel's) uses it: the same values.
template <bool kRmsNorm>
__device__ __forceinline__ uint4 stage8(const float4 (&x)[2], const float4 (&y)[2], float inv) {
  const float xs[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
  const float ys[8] = {y[0].x, y[0].y, y[0].z, y[0].w, y[1].x, y[1].y, y[1].z, y[1].w};
  __nv_bfloat162 o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float lo, hi;
    if constexpr (kRmsNorm) {
      lo = ys[2 * j] * (xs[2 * j] * inv);
      hi = ys[2 * j + 1] * (xs[2 * j + 1] * inv);
    } else {
      lo = silu_mul(xs[2 * j], ys[2 * j]);
      hi = silu_mul(xs[2 * j + 1], ys[2 * j + 1]);
    }
    o[j] = __floats2bfloat162_rn(lo, hi);
  }
  return *reinterpret_cast<const uint4*>(o);
}

// stage8's inputs for the 16-byte item c of a row (elements 8c..8c+7): x from the row, y
// from its partner (the norm weight, or the up half), read through the read-only path.
__device__ __forceinline__ void load8_pair(const float4* x4, const float4* y4, int c, float4 (&x)[2], float4 (&y)[2]) {
  x[0] = x4[2 * c];
  x[1] = x4[2 * c + 1];
  y[0] = __ldg(y4 + 2 * c);
  y[1] = __ldg(y4 + 2 * c + 1);
}

// Orderable 64-bit key of (logit, feature): larger logit first, then the LOWER feature index
// (torch.argmax's tie rule); atomicMax over keys is order-independent, hence deterministic.
__device__ __forceinline__ unsigned long long argmax_key(float v, int n) {
  const unsigned b = __float_as_uint(v);
  const unsigned ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(ord) << 32) | (0xffffffffu - static_cast<unsigned>(n));
}

}  // namespace dsinfer::cuda::detail
