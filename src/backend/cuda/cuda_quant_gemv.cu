// dsinfer CUDA backend: the block-quantized GEMV of DeepSeek-V4 weights (see
// cuda_quant_gemv.h for the layout, the data flow and the reduction order). Everything but
// the two entry points lives in quant_gemv_detail so tools/cuda_bench/quant_gemv_bench.cu
// can include this file, time this kernel and try other schedules of the same arithmetic.
#include "backend/cuda/cuda_quant_gemv.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/quant_decode.h"
#include "core/error.h"

namespace dsinfer::cuda {
namespace quant_gemv_detail {

constexpr int kWarps = 8;    // warps per block
constexpr int kMaxRows = 8;  // rows of x per launch

// ---- exact decoders -------------------------------------------------------------------------

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t h) {
  __half2_raw r;
  r.x = static_cast<unsigned short>(h & 0xffffu);
  r.y = static_cast<unsigned short>(h >> 16);
  return __half22float2(__half2(r));
}

// Four E4M3 codes (byte b = element b) -> their values: cvt.rn.f16x2.e4m3x2 (every E4M3 value,
// subnormals included, is an f16), then f16 -> F32; both exact.
__device__ __forceinline__ void fp8_word(uint32_t w, float f[4]) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// Eight E2M1 codes (nibble k = element k, low nibble first) -> value * 2^-14, exactly (sm_90
// has no E2M1 conversion): the 3 magnitude bits m at f16 bits 9-11 are exponent field m >> 1
// and top mantissa bit m & 1, i.e. (1 + (m&1)/2) * 2^((m>>1) - 15) for m >= 2 and
// (m&1) * 2^-15 (an f16 subnormal) for m < 2, which is e2m1(m) * 2^-14 in both cases; the
// sign goes to bit 15. Nibbles k and k + 4 are 16 bits apart, so one shift-and-mask pair
// fills both halves of an f16x2.
__device__ __forceinline__ void fp4_word(uint32_t w, float f[8]) {
  const uint32_t h0 = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
  const uint32_t h1 = ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u);
  const uint32_t h2 = ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u);
  const uint32_t h3 = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
  const float2 a = half2_bits_to_float2(h0), b = half2_bits_to_float2(h1), c = half2_bits_to_float2(h2),
               d = half2_bits_to_float2(h3);
  f[0] = a.x;
  f[4] = a.y;
  f[1] = b.x;
  f[5] = b.y;
  f[2] = c.x;
  f[6] = c.y;
  f[3] = d.x;
  f[7] = d.y;
}

template <bool kFp4>
struct Fmt {
  static constexpr int kPC = kFp4 ? 32 : 16;  // weights per 16-byte chunk
  static constexpr int kPW = kPC / 4;         // weights per 32-bit word
  // Floats per chunk of x in shared memory: 4 floats of padding make the LDS.128 of 8
  // consecutive lanes (one phase) hit 8 disjoint groups of 4 banks (chunk stride 80 or 144
  // bytes), so 32 lanes reading 32 different chunks are conflict-free.
  static constexpr int kPad = kPC + 4;
};

// The arithmetic of one 16-byte chunk of R weight rows against M rows of x (the chunk's x
// at xc + i * x_stride, padded layout); the kernel below and the benchmark's candidate
// schedules all run exactly this. Per (x row, weight row): the chunk's products with the
// exactly decoded codes (FP4: times 2^-14), in element order, in one fma chain from 0; then
// acc = fma(partial [* 2^14], 2^(e - 127), acc). Scaling by a power of two is exact unless
// it leaves F32's range, so the partial equals the chain with scaled weights; the scale
// costs one multiply per chunk instead of one per weight.
template <bool kFp4, int M, int R>
__device__ __forceinline__ void chunk_dot(const uint4 (&raw)[R], const uint32_t (&ex)[R], const float* xc,
                                          int x_stride, float (&acc)[M][R]) {
  using F = Fmt<kFp4>;
  float p[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) p[i][r] = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float wv[R][F::kPW];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t word = q == 0 ? raw[r].x : q == 1 ? raw[r].y : q == 2 ? raw[r].z : raw[r].w;
      if constexpr (kFp4)
        fp4_word(word, wv[r]);
      else
        fp8_word(word, wv[r]);
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xv[F::kPW];
#pragma unroll
      for (int v = 0; v < F::kPW / 4; ++v) {
        const float4 t = *reinterpret_cast<const float4*>(xc + i * x_stride + q * F::kPW + 4 * v);
        xv[4 * v] = t.x;
        xv[4 * v + 1] = t.y;
        xv[4 * v + 2] = t.z;
        xv[4 * v + 3] = t.w;
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int k = 0; k < F::kPW; ++k) p[i][r] = fmaf(xv[k], wv[r][k], p[i][r]);
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[i][r] = fmaf(kFp4 ? p[i][r] * 16384.0f : p[i][r], quant_decode::e8m0(ex[r]), acc[i][r]);
}

// Lane 0 gets the sum of the 32 lanes' accumulators (fixed xor butterfly) and writes it;
// the accumulators restart from 0 (for schedules that walk several rows).
template <int M, int R>
__device__ __forceinline__ void reduce_store(float (&acc)[M][R], int lane, int64_t row0, int64_t rows, float* y) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float a = acc[i][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (lane == 0 && row0 + r < rows) y[i * rows + row0 + r] = a;
      acc[i][r] = 0.0f;
    }
}

// The 16-byte code chunk c of row j and its scale exponent (zeros past the matrix).
template <bool kFp4>
__device__ __forceinline__ void load_chunk(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                           int64_t rows, int64_t cols, int64_t j, int c, int chunks, uint4& raw,
                                           uint32_t& ex) {
  if (j < rows && c < chunks) {
    const int64_t row_bytes = kFp4 ? cols / 2 : cols;
    raw = __ldg(reinterpret_cast<const uint4*>(codes + j * row_bytes) + c);
    ex = __ldg(scales + (kFp4 ? j * (cols / 32) + c : (j / 128) * ((cols + 127) / 128) + c / 8));
  } else {
    raw = make_uint4(0u, 0u, 0u, 0u);
    ex = 127u;
  }
}

// ---- the kernel --------------------------------------------------------------------------------
//
// A block of 8 warps owns 16 consecutive rows, R = 2 per warp (the two rows share every
// read of x). The columns go in tiles of 32 * U chunks: each lane first loads its U chunks
// of the tile for both rows (2U 16-byte loads in flight per lane; the kernel this replaced
// had one, and was latency-bound), then the block stages the tile's x (M rows, padded)
// in shared memory between two barriers, then each lane runs chunk_dot on its chunks. From
// L1 instead, the lanes' x reads touch one 128-byte line per lane (16-32 wavefronts per
// warp load: the old kernel's other bottleneck); from the padded copy they are
// conflict-free. U = 4 for one row of x, 2 for more (shared memory M * 32U * (kPC + 4)
// floats: at most 74 KB).
template <bool kFp4, int M, int R, int U>
__device__ __forceinline__ void gemv_body(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                          int64_t rows, int64_t cols, const float* __restrict__ x,
                                          float* __restrict__ y) {
  using F = Fmt<kFp4>;
  constexpr int kTile = 32 * U;  // chunks per tile
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int lane = threadIdx.x & 31;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  const int chunks = static_cast<int>((kFp4 ? cols / 2 : cols) / 16);
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
  for (int t0 = 0; t0 < chunks; t0 += kTile) {
    uint4 raw[U][R];
    uint32_t ex[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        load_chunk<kFp4>(codes, scales, rows, cols, j0 + r, t0 + lane + 32 * u, chunks, raw[u][r], ex[u][r]);
    __syncthreads();  // the previous tile's x is no longer read
    const int f4_row = min(kTile, chunks - t0) * (F::kPC / 4);
    for (int idx = threadIdx.x; idx < M * f4_row; idx += kWarps * 32) {
      const int i = idx / f4_row, f = idx - i * f4_row;
      const int c = f / (F::kPC / 4), o = f - c * (F::kPC / 4);
      *reinterpret_cast<float4*>(xs + (i * kTile + c) * F::kPad + 4 * o) =
          __ldg(reinterpret_cast<const float4*>(x + i * cols + static_cast<int64_t>(t0) * F::kPC) + f);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = lane + 32 * u;
      if (t0 + c < chunks) chunk_dot<kFp4, M, R>(raw[u], ex[u], xs + c * F::kPad, kTile * F::kPad, acc);
    }
  }
  if (j0 < rows) reduce_store<M, R>(acc, lane, j0, rows, y);
}

template <bool kFp4, int M, int R, int U>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows,
                      int64_t cols, const float* __restrict__ x, float* __restrict__ y) {
  gemv_body<kFp4, M, R, U>(codes, scales, rows, cols, x, y);
}

// Routed experts: block row blockIdx.y is pair p, against expert eid[p]'s matrix (code_stride
// and scale_stride bytes apart) and x row p / x_div; the same arithmetic per output.
template <bool kFp4, int U>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_routed_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows,
                             int64_t cols, int64_t code_stride, int64_t scale_stride, const int32_t* __restrict__ eid,
                             const float* __restrict__ x, int x_div, float* __restrict__ y) {
  const int p = blockIdx.y;
  const int64_t e = eid[p];
  gemv_body<kFp4, 1, 2, U>(codes + e * code_stride, scales + e * scale_stride, rows, cols,
                           x + static_cast<int64_t>(p / x_div) * cols, y + static_cast<int64_t>(p) * rows);
}

// ---- host side --------------------------------------------------------------------------------

template <bool kFp4, int M>
void launch_m(const QuantDeviceMatrix& w, const float* x, float* y, cudaStream_t stream) {
  constexpr int R = 2, U = M == 1 ? 4 : 2;
  constexpr int smem = M * 32 * U * Fmt<kFp4>::kPad * static_cast<int>(sizeof(float));
  auto kernel = quant_gemv_kernel<kFp4, M, R, U>;
  if constexpr (smem > 48 * 1024) {
    // Above the default 48 KB a kernel must opt in (once per kernel).
    static std::once_flag once;
    std::call_once(once, [&] {
      DSINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    });
  }
  const unsigned grid = static_cast<unsigned>((w.rows + kWarps * R - 1) / (kWarps * R));
  kernel<<<grid, kWarps * 32, smem, stream>>>(w.codes, w.scales, w.rows, w.cols, x, y);
}

template <bool kFp4>
void launch_format(const QuantDeviceMatrix& w, const float* x, int m, float* y, cudaStream_t stream) {
  switch (m) {
    case 1: return launch_m<kFp4, 1>(w, x, y, stream);
    case 2: return launch_m<kFp4, 2>(w, x, y, stream);
    case 3: return launch_m<kFp4, 3>(w, x, y, stream);
    case 4: return launch_m<kFp4, 4>(w, x, y, stream);
    case 5: return launch_m<kFp4, 5>(w, x, y, stream);
    case 6: return launch_m<kFp4, 6>(w, x, y, stream);
    case 7: return launch_m<kFp4, 7>(w, x, y, stream);
    default: return launch_m<kFp4, 8>(w, x, y, stream);
  }
}

template <bool kFp4>
void launch_routed(const QuantDeviceMatrix& w, int64_t code_stride, int64_t scale_stride, const int32_t* eid, int pairs,
                   const float* x, int x_div, float* y, cudaStream_t stream) {
  constexpr int R = 2, U = 4;
  constexpr int smem = 32 * U * Fmt<kFp4>::kPad * static_cast<int>(sizeof(float));
  static_assert(smem <= 48 * 1024, "one row of x fits the default shared memory");
  const dim3 grid(static_cast<unsigned>((w.rows + kWarps * R - 1) / (kWarps * R)), static_cast<unsigned>(pairs));
  quant_gemv_routed_kernel<kFp4, U><<<grid, kWarps * 32, smem, stream>>>(w.codes, w.scales, w.rows, w.cols, code_stride,
                                                                         scale_stride, eid, x, x_div, y);
}

}  // namespace quant_gemv_detail

void quant_gemv_routed(const QuantDeviceMatrix& w, int64_t code_stride, int64_t scale_stride, const int32_t* eid,
                       int pairs, const float* x, int x_div, float* y, cudaStream_t stream) {
  check_quant_gemv_shape(w);
  if (pairs <= 0) return;
  if (w.format == QuantFormat::Fp4Group32)
    quant_gemv_detail::launch_routed<true>(w, code_stride, scale_stride, eid, pairs, x, x_div, y, stream);
  else
    quant_gemv_detail::launch_routed<false>(w, code_stride, scale_stride, eid, pairs, x, x_div, y, stream);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void check_quant_gemv_shape(const QuantDeviceMatrix& w) {
  const int64_t need = w.format == QuantFormat::Fp4Group32 ? 32 : 16;
  if (w.rows <= 0 || w.cols <= 0 || w.cols % need != 0)
    throw Error("quant_gemv: " + std::string(w.format == QuantFormat::Fp4Group32 ? "FP4" : "FP8") + " weight [" +
                std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]: columns must be a positive multiple of " +
                std::to_string(need));
}

void quant_gemv(const QuantDeviceMatrix& w, const float* x, int m, float* y, cudaStream_t stream) {
  check_quant_gemv_shape(w);
  for (int r0 = 0; r0 < m; r0 += quant_gemv_detail::kMaxRows) {
    const int mr = std::min(m - r0, quant_gemv_detail::kMaxRows);
    // Rows of x in launches of up to 8: y row r0 + r is written at y + (r0 + r) * rows.
    if (w.format == QuantFormat::Fp4Group32)
      quant_gemv_detail::launch_format<true>(w, x + r0 * w.cols, mr, y + r0 * w.rows, stream);
    else
      quant_gemv_detail::launch_format<false>(w, x + r0 * w.cols, mr, y + r0 * w.rows, stream);
    DSINFER_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace dsinfer::cuda
