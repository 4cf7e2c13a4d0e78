// Standalone benchmark of the DeepSeek-V4 block-quantized GEMV (src/backend/cuda/
// cuda_quant_gemv.cu): the kernel as it was ("base") and faster variants, each checked
// against a host reference (quant_decode's host decoders, double sums; the F32 sums may
// differ by rounding only) and for batch invariance (a row of x alone, 4 rows and 8 rows
// give the same bits), then timed with CUDA events (median of 15 samples of 32 launches,
// 16 copies of the weight cycled so each launch streams from HBM, not the 60 MB L2) on
// V4-Flash shapes for m = 1, 4, 8. GB/s = (code + scale bytes) / time per launch.
//
// Build: nvcc -O3 -std=c++20 -arch=sm_90 -I src tools/cuda_bench/quant_gemv_bench.cu -o qgb
//
// Data flow of the variants (all one warp per output row or R rows, lanes reduced by the
// same xor butterfly as base):
//  - "chunk" family (bits identical to base): lane l owns the 16-byte code chunks l, l+32,
//    ... of a row, as base; U chunks per lane are loaded before any is decoded (base had one
//    16-byte load in flight per lane: latency-bound); codes are decoded by hardware (E4M3x2
//    -> f16x2 cvt) or by bit placement into f16 (E2M1), both exact, then times the scale as
//    base. x comes from L1 (__ldg, "B") or from shared memory padded 4 floats per chunk so
//    that LDS.128 of 32 lanes reading 32 different chunks is bank-conflict free ("C"); the
//    L1 path touches one 128-byte line per lane per load (16-32 wavefronts per warp load).
//  - "chunk-factored": as C but a chunk's products are summed with the unscaled code
//    values and the chunk sum is multiplied by its power-of-two scale once (exact scaling:
//    same rounding inside a chunk, one more rounding per chunk): one FMUL fewer per weight.
//  - "quad" family: lane l owns 4-column groups l, l+32, ... (32-bit FP8 / 16-bit FP4 code
//    loads) so a warp's x loads are 512 contiguous bytes (ideal L1 wavefronts); the scale is
//    applied per 4-weight partial sum.
//  - "P prod": dsinfer::cuda::quant_gemv itself (this file includes cuda_quant_gemv.cu), the
//    chunk-factored arithmetic with the "Cf smem U4 R2 W8" launch; checked for m = 1..8.
//  - "R ...": a candidate schedule of the same arithmetic (namespace cand below, not yet run
//    on a GPU when written); its bits must equal P prod's ("family bits equal").
// Run it with no argument for everything, or with a name fragment ("R r1g8") to check and
// time only the variants whose name contains it (and base). Exit status 1 if any check fails.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_quant_gemv.cu"
#include "backend/cuda/quant_decode.h"

namespace qd = dsinfer::quant_decode;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// ---------------------------------------------------------------------------------------------
// base: the kernel as committed (copied verbatim, namespace aside).
constexpr int kBaseWarps = 8;
constexpr int kMaxRows = 8;
template <bool kFp4>
__global__ void __launch_bounds__(kBaseWarps * 32)
    base_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows, int64_t cols,
                const float* __restrict__ x, int m, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kBaseWarps + (threadIdx.x >> 5);
  if (j >= rows) return;
  constexpr int kPerChunk = kFp4 ? 32 : 16;
  const int64_t row_bytes = kFp4 ? cols / 2 : cols;
  const int64_t chunks = row_bytes / 16;
  const uint8_t* q = codes + j * row_bytes;
  const int64_t sb_cols = (cols + 127) / 128;
  float acc[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(q) + c);
    const int64_t col0 = c * kPerChunk;
    const float sc = kFp4 ? qd::e8m0(scales[j * (cols / 32) + col0 / 32]) : qd::e8m0(scales[(j / 128) * sb_cols + col0 / 128]);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    float w[kPerChunk];
#pragma unroll
    for (int b = 0; b < 16; ++b) {
      const uint32_t byte = (words[b / 4] >> (8 * (b % 4))) & 0xffu;
      if (kFp4) {
        w[2 * b] = qd::e2m1(byte & 0xfu) * sc;
        w[2 * b + 1] = qd::e2m1(byte >> 4) * sc;
      } else {
        w[b] = qd::e4m3(byte) * sc;
      }
    }
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r >= m) break;
      const float4* xr = reinterpret_cast<const float4*>(x + r * cols + col0);
      float a = acc[r];
#pragma unroll
      for (int v = 0; v < kPerChunk / 4; ++v) {
        const float4 xv = __ldg(xr + v);
        a = fmaf(xv.x, w[4 * v], a);
        a = fmaf(xv.y, w[4 * v + 1], a);
        a = fmaf(xv.z, w[4 * v + 2], a);
        a = fmaf(xv.w, w[4 * v + 3], a);
      }
      acc[r] = a;
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    if (r >= m) break;
    float a = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0) y[r * rows + j] = a;
  }
}

// The production decoders and kernels (quant_gemv_detail), included whole.
using dsinfer::cuda::quant_gemv_detail::fp4_word;
using dsinfer::cuda::quant_gemv_detail::fp8_word;

// ---------------------------------------------------------------------------------------------
// The chunk family. M rows of x (compile time), R output rows per warp, U chunks per lane in
// flight (and, with shared-memory x, a tile of 32*U chunks of x staged per block), W warps.
template <bool kFp4, int M, int R, int U, int W, bool kSmem, bool kFactor>
__global__ void __launch_bounds__(W * 32)
    chunk_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows, int64_t cols,
                 const float* __restrict__ x, float* __restrict__ y) {
  constexpr int kPC = kFp4 ? 32 : 16;  // weights per 16-byte chunk
  constexpr int kPW = kPC / 4;         // weights per 32-bit word
  constexpr int kPad = kPC + 4;        // floats per chunk in shared memory
  constexpr int kTile = 32 * U;        // chunks per tile
  extern __shared__ float4 xs4[];
  float* xs = reinterpret_cast<float*>(xs4);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * W + warp) * R;
  if (!kSmem && j0 >= rows) return;
  const int64_t row_bytes = kFp4 ? cols / 2 : cols;
  const int chunks = static_cast<int>(row_bytes / 16);
  const int64_t sb_cols = (cols + 127) / 128;
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
      for (int r = 0; r < R; ++r) {
        const int c = t0 + lane + 32 * u;
        const int64_t j = j0 + r;
        if (j < rows && c < chunks) {
          raw[u][r] = __ldg(reinterpret_cast<const uint4*>(codes + j * row_bytes) + c);
          ex[u][r] = __ldg(scales + (kFp4 ? j * (cols / 32) + c : (j / 128) * sb_cols + c / 8));
        } else {
          raw[u][r] = make_uint4(0, 0, 0, 0);
          ex[u][r] = 127;
        }
      }
    if constexpr (kSmem) {
      __syncthreads();  // the previous tile's x is no longer read
      const int tchunks = min(kTile, chunks - t0);
      const int f4_row = tchunks * (kPC / 4);
      for (int idx = threadIdx.x; idx < M * f4_row; idx += W * 32) {
        const int i = idx / f4_row, f = idx - i * f4_row;
        const float4 v = __ldg(reinterpret_cast<const float4*>(x + i * cols + static_cast<int64_t>(t0) * kPC) + f);
        const int cl = f / (kPC / 4), o = f - cl * (kPC / 4);
        *reinterpret_cast<float4*>(xs + (i * kTile + cl) * kPad + 4 * o) = v;
      }
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = t0 + lane + 32 * u;
      if (c >= chunks) break;
      const int cl = lane + 32 * u;
      const int64_t col0 = static_cast<int64_t>(c) * kPC;
      float sc[R], scw[R];
      bool slow[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        sc[r] = qd::e8m0(ex[u][r]);
        // Per-weight scaling of FP4 values decoded times 2^-14: the 2^14 goes into the scale
        // unless that overflows (exponents 241..254), then the weight is rescaled first.
        scw[r] = kFp4 ? sc[r] * 16384.0f : sc[r];
        slow[r] = kFp4 && !kFactor && isinf(scw[r]);
      }
      float p[M][R];
#pragma unroll
      for (int i = 0; i < M; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) p[i][r] = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float wv[R][kPW];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t word = q == 0 ? raw[u][r].x : q == 1 ? raw[u][r].y : q == 2 ? raw[u][r].z : raw[u][r].w;
          if constexpr (kFp4)
            fp4_word(word, wv[r]);
          else
            fp8_word(word, wv[r]);
          if constexpr (!kFactor) {
            if (slow[r]) {
#pragma unroll
              for (int k = 0; k < kPW; ++k) wv[r][k] = (wv[r][k] * 16384.0f) * sc[r];
            } else {
#pragma unroll
              for (int k = 0; k < kPW; ++k) wv[r][k] *= scw[r];
            }
          }
        }
#pragma unroll
        for (int i = 0; i < M; ++i) {
          float xv[kPW];
#pragma unroll
          for (int v = 0; v < kPW / 4; ++v) {
            float4 t;
            if constexpr (kSmem)
              t = *reinterpret_cast<const float4*>(xs + (i * kTile + cl) * kPad + q * kPW + 4 * v);
            else
              t = __ldg(reinterpret_cast<const float4*>(x + i * cols + col0 + q * kPW) + v);
            xv[4 * v] = t.x;
            xv[4 * v + 1] = t.y;
            xv[4 * v + 2] = t.z;
            xv[4 * v + 3] = t.w;
          }
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int k = 0; k < kPW; ++k) {
              if constexpr (kFactor)
                p[i][r] = fmaf(xv[k], wv[r][k], p[i][r]);
              else
                acc[i][r] = fmaf(xv[k], wv[r][k], acc[i][r]);
            }
        }
      }
      if constexpr (kFactor) {
#pragma unroll
        for (int i = 0; i < M; ++i)
#pragma unroll
          for (int r = 0; r < R; ++r) acc[i][r] = fmaf(kFp4 ? p[i][r] * 16384.0f : p[i][r], sc[r], acc[i][r]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float a = acc[i][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (lane == 0 && j0 + r < rows) y[i * rows + j0 + r] = a;
    }
}

// ---------------------------------------------------------------------------------------------
// The quad family: lane l owns 4-column groups ("quads") l + 32 s, s = 0, 1, ...
template <bool kFp4, int M, int R, int U, int W>
__global__ void __launch_bounds__(W * 32)
    quad_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows, int64_t cols,
                const float* __restrict__ x, float* __restrict__ y) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * W + warp) * R;
  if (j0 >= rows) return;
  const int64_t row_bytes = kFp4 ? cols / 2 : cols;
  const int quads = static_cast<int>(cols / 4);
  const int64_t sb_cols = (cols + 127) / 128;
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
  for (int s0 = 0; s0 * 32 < quads; s0 += U) {
    uint32_t cw[U][R], ex[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int q = (s0 + u) * 32 + lane;
        const int64_t j = j0 + r;
        if (j < rows && q < quads) {
          if constexpr (kFp4) {
            cw[u][r] = __ldg(reinterpret_cast<const unsigned short*>(codes + j * row_bytes) + q);
            ex[u][r] = __ldg(scales + j * (cols / 32) + q / 8);
          } else {
            cw[u][r] = __ldg(reinterpret_cast<const uint32_t*>(codes + j * row_bytes) + q);
            ex[u][r] = __ldg(scales + (j / 128) * sb_cols + (s0 + u));
          }
        } else {
          cw[u][r] = 0;
          ex[u][r] = 127;
        }
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int q = (s0 + u) * 32 + lane;
      if (q >= quads) break;
      float wv[R][4], sc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        sc[r] = qd::e8m0(ex[u][r]);
        if constexpr (kFp4) {
          // Bytes 0, 1 -> bits 0-7, 16-23: nibble pairs (0, 2) and (1, 3) are 16 bits apart.
          const uint32_t v = __byte_perm(cw[u][r], 0u, 0x4140);
          float f[8];
          fp4_word(v, f);  // f[0] = n0, f[4] = n2, f[1] = n1, f[5] = n3
          wv[r][0] = f[0];
          wv[r][1] = f[1];
          wv[r][2] = f[4];
          wv[r][3] = f[5];
        } else {
          fp8_word(cw[u][r], wv[r]);
        }
      }
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(x + i * cols) + q);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float p = t.x * wv[r][0];
          p = fmaf(t.y, wv[r][1], p);
          p = fmaf(t.z, wv[r][2], p);
          p = fmaf(t.w, wv[r][3], p);
          acc[i][r] = fmaf(kFp4 ? p * 16384.0f : p, sc[r], acc[i][r]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float a = acc[i][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (lane == 0 && j0 + r < rows) y[i * rows + j0 + r] = a;
    }
}

// Decoder check: every E4M3 code and every E2M1 byte through the device decoders.
__global__ void decode_check_kernel(float* f8, float* f4) {
  const uint32_t t = threadIdx.x;  // 64 threads: 4 bytes each
  const uint32_t w = (4 * t) | ((4 * t + 1) << 8) | ((4 * t + 2) << 16) | ((4 * t + 3) << 24);
  fp8_word(w, f8 + 4 * t);
  fp4_word(w, f4 + 8 * t);
}

// ---------------------------------------------------------------------------------------------
// Host side.

struct Mat {
  bool fp4;
  int64_t rows, cols;
  const uint8_t* codes;
  const uint8_t* scales;
  size_t code_bytes() const { return fp4 ? rows * cols / 2 : rows * cols; }
  size_t scale_bytes() const { return fp4 ? rows * (cols / 32) : ((rows + 127) / 128) * ((cols + 127) / 128); }
};

using Launch = std::function<void(const Mat&, const float*, int, float*)>;
struct Variant {
  std::string name, family;
  Launch launch;
};

template <bool kFp4, int M, int R, int U, int W, bool kSmem, bool kFactor>
void launch_chunk(const Mat& w, const float* x, float* y) {
  constexpr int kPC = kFp4 ? 32 : 16;
  const size_t smem = kSmem ? static_cast<size_t>(M) * 32 * U * (kPC + 4) * sizeof(float) : 0;
  auto k = chunk_kernel<kFp4, M, R, U, W, kSmem, kFactor>;
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    set = true;
  }
  const unsigned grid = static_cast<unsigned>((w.rows + W * R - 1) / (W * R));
  k<<<grid, W * 32, smem>>>(w.codes, w.scales, w.rows, w.cols, x, y);
}

template <bool kFp4, int M, int R, int U, int W>
void launch_quad(const Mat& w, const float* x, float* y) {
  const unsigned grid = static_cast<unsigned>((w.rows + W * R - 1) / (W * R));
  quad_kernel<kFp4, M, R, U, W><<<grid, W * 32>>>(w.codes, w.scales, w.rows, w.cols, x, y);
}

// U for shared-memory x as a function of M (the x tile is M * 32 * U chunks).
constexpr int smem_u(int m, int u1) { return m == 1 ? u1 : 2; }

template <int R, int U1, int W, bool kSmem, bool kFactor>
Launch chunk_variant() {
  return [](const Mat& w, const float* x, int m, float* y) {
#define DSI_CASE(MM)                                                                                      \
  case MM:                                                                                                \
    if (w.fp4)                                                                                            \
      launch_chunk<true, MM, R, (kSmem ? smem_u(MM, U1) : U1), W, kSmem, kFactor>(w, x, y);               \
    else                                                                                                  \
      launch_chunk<false, MM, R, (kSmem ? smem_u(MM, U1) : U1), W, kSmem, kFactor>(w, x, y);              \
    break;
    switch (m) {
      DSI_CASE(1)
      DSI_CASE(4)
      DSI_CASE(8)
      default:
        std::fprintf(stderr, "m %d not instantiated\n", m);
        std::exit(1);
    }
#undef DSI_CASE
  };
}

template <int R, int U, int W>
Launch quad_variant() {
  return [](const Mat& w, const float* x, int m, float* y) {
#define DSI_CASE(MM)                                   \
  case MM:                                             \
    if (w.fp4)                                         \
      launch_quad<true, MM, R, U, W>(w, x, y);         \
    else                                               \
      launch_quad<false, MM, R, U, W>(w, x, y);        \
    break;
    switch (m) {
      DSI_CASE(1)
      DSI_CASE(4)
      DSI_CASE(8)
      default:
        std::fprintf(stderr, "m %d not instantiated\n", m);
        std::exit(1);
    }
#undef DSI_CASE
  };
}

Launch base_variant() {
  return [](const Mat& w, const float* x, int m, float* y) {
    const unsigned grid = static_cast<unsigned>((w.rows + kBaseWarps - 1) / kBaseWarps);
    if (w.fp4)
      base_kernel<true><<<grid, kBaseWarps * 32>>>(w.codes, w.scales, w.rows, w.cols, x, m, y);
    else
      base_kernel<false><<<grid, kBaseWarps * 32>>>(w.codes, w.scales, w.rows, w.cols, x, m, y);
  };
}

namespace qg = dsinfer::cuda::quant_gemv_detail;

// ---------------------------------------------------------------------------------------------
// Candidate schedule "rows" (written 2026-12-03 after run 1, NOT yet run on a GPU: the
// device budget of that session was spent). Same arithmetic as production (qg::chunk_dot,
// qg::reduce_store), so its bits must equal production's; it attacks what run 1 pointed
// at: wave quantization (448 blocks of 16 rows on 396 slots for FP8 7168 rows, say), the
// serialized load -> barrier -> compute of each tile, and x re-staged per 16 rows.
//  - x (m rows, padded) staged in shared memory whole, once per block, while the first
//    codes load (falls back to the production kernel when it does not fit);
//  - each warp owns row groups (R rows) gw, gw + nw, ..., k of them: the host picks k and
//    nw so that every SM runs the same number of row groups, give or take one;
//  - a row's chunks go G per lane per unit; D code buffers, so D - 1 units load while one
//    is computed, across row ends too.
namespace cand {
using namespace dsinfer;
using namespace dsinfer::cuda;
using namespace dsinfer::cuda::quant_gemv_detail;
namespace qg = dsinfer::cuda::quant_gemv_detail;

// Codes of one unit of work: G chunks (per lane) of R rows.
template <int R, int G>
struct Unit {
  uint4 raw[G][R];
  uint32_t ex[G][R];
};

// Each warp owns row groups (R consecutive rows) gw, gw + nw, ..., k of them (the host picks
// k and nw so that every SM gets the same number of row groups, give or take one). Lane l
// owns the 16-byte chunks l, l + 32, ... of a row; a row's chunks go G per lane per unit, and
// the warp walks units (row group, chunk group) in order with the next unit's codes already
// loading while it computes the current one, across row ends too. x (M rows, padded) is
// staged once per block while the first unit's codes load.
template <bool kFp4, int M, int R, int G>
__device__ __forceinline__ void load_unit(Unit<R, G>& b, const uint8_t* __restrict__ codes,
                                          const uint8_t* __restrict__ scales, int64_t rows, int64_t cols, int chunks,
                                          int64_t rg, int g, int lane) {
#pragma unroll
  for (int e = 0; e < G; ++e)
#pragma unroll
    for (int r = 0; r < R; ++r)
      load_chunk<kFp4>(codes, scales, rows, cols, rg * R + r, lane + 32 * (g * G + e), chunks, b.raw[e][r], b.ex[e][r]);
}

template <bool kFp4, int M, int R, int G>
__device__ __forceinline__ void compute_unit(const Unit<R, G>& b, const float* xs, int x_stride, int chunks, int g,
                                             int ngroups, int lane, int64_t rg, int64_t rows, float (&acc)[M][R],
                                             float* __restrict__ y) {
#pragma unroll
  for (int e = 0; e < G; ++e) {
    const int c = lane + 32 * (g * G + e);
    if (c < chunks) chunk_dot<kFp4, M, R>(b.raw[e], b.ex[e], xs + c * Fmt<kFp4>::kPad, x_stride, acc);
  }
  if (g == ngroups - 1) reduce_store<M, R>(acc, lane, rg * R, rows, y);
}

template <bool kFp4, int M, int R, int G, int D>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_rows_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows, int64_t cols,
                     const float* __restrict__ x, float* __restrict__ y, int k, int nw) {
  using F = Fmt<kFp4>;
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int lane = threadIdx.x & 31;
  const int gw = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int chunks = static_cast<int>((kFp4 ? cols / 2 : cols) / 16);
  const int ngroups = ((chunks + 31) / 32 + G - 1) / G;
  const int units = k * ngroups;
  const int x_stride = chunks * F::kPad;
  // Unit u: row group gw + (u / ngroups) * nw, chunk group u % ngroups. D buffers, unit u in
  // buffer u % D: D - 1 units load while one is computed (the loop is unrolled by D so no
  // buffer is indexed at run time).
  Unit<R, G> buf[D];
#pragma unroll
  for (int s = 0; s < D - 1; ++s)
    if (gw < nw && s < units) {
      const int t = s / ngroups;
      load_unit<kFp4, M, R, G>(buf[s], codes, scales, rows, cols, chunks, gw + static_cast<int64_t>(t) * nw,
                               s - t * ngroups, lane);
    }
  const int f4_row = static_cast<int>(cols / 4);
  for (int idx = threadIdx.x; idx < M * f4_row; idx += kWarps * 32) {
    const int i = idx / f4_row, f = idx - i * f4_row;
    const int c = f / (F::kPC / 4), o = f - c * (F::kPC / 4);
    *reinterpret_cast<float4*>(xs + i * x_stride + c * F::kPad + 4 * o) =
        __ldg(reinterpret_cast<const float4*>(x + i * cols) + f);
  }
  __syncthreads();
  if (gw >= nw) return;
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
  for (int u0 = 0; u0 < units; u0 += D) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      const int u = u0 + s, v = u + D - 1;
      if (v < units) {
        const int t = v / ngroups;
        load_unit<kFp4, M, R, G>(buf[(s + D - 1) % D], codes, scales, rows, cols, chunks,
                                 gw + static_cast<int64_t>(t) * nw, v - t * ngroups, lane);
      }
      if (u < units) {
        const int t = u / ngroups;
        compute_unit<kFp4, M, R, G>(buf[s], xs, x_stride, chunks, u - t * ngroups, ngroups, lane,
                                    gw + static_cast<int64_t>(t) * nw, rows, acc, y);
      }
    }
  }
}


// ---- host side ----
// Path 1 configurations (rows per warp R, chunks per lane per unit G, code buffers D; D
// absent: 2); the choice changes only the schedule, never a row's arithmetic.
enum class RowsCfg { kAuto, kR1G8, kR1G8D3, kR1G4D3, kR2G4, kR4G2 };
struct Options {
  RowsCfg cfg = RowsCfg::kAuto;
  int blocks_per_sm = 0;      // path 1: 0 = picked for balance
  bool force_tiled = false;   // the production kernel even when x fits
};

struct DeviceInfo {
  int sms = 0;
  int smem_optin = 0;
};

inline DeviceInfo device_info() {
  static std::mutex mu;
  static DeviceInfo info[64];
  int dev = 0;
  DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  DeviceInfo& d = info[dev & 63];
  if (d.sms == 0) {
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  }
  return d;
}

// Lets a kernel take up to the device's opt-in shared memory (once per kernel).
template <class K>
void allow_smem(K kernel, int bytes, std::atomic<int>& allowed) {
  if (allowed.load(std::memory_order_relaxed) >= bytes) return;
  DSINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  allowed.store(bytes, std::memory_order_relaxed);
}

template <bool kFp4, int M, int R, int G, int D>
void launch_rows(const QuantDeviceMatrix& w, const float* x, float* y, cudaStream_t stream, const DeviceInfo& dev,
                 int smem, int blocks_per_sm) {
  auto kernel = gemv_rows_kernel<kFp4, M, R, G, D>;
  static std::atomic<int> allowed{0};
  allow_smem(kernel, dev.smem_optin, allowed);
  // Blocks per SM that fit (registers, shared memory), cached for the last shared size.
  static std::atomic<int64_t> occ_cache{-1};
  int occ = 0;
  const int64_t cached = occ_cache.load(std::memory_order_relaxed);
  if (cached >= 0 && (cached >> 8) == smem) {
    occ = static_cast<int>(cached & 0xff);
  } else {
    DSINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kWarps * 32, smem));
    occ = std::max(1, std::min(occ, 255));
    occ_cache.store((static_cast<int64_t>(smem) << 8) | occ, std::memory_order_relaxed);
  }
  // Row groups per warp k: the fewest row groups any SM runs in sequence; among blocks per
  // SM b with the same k * b, the most warps (more loads in flight).
  const int64_t nrg = (w.rows + R - 1) / R;
  int best_b = 1;
  int64_t best_cost = -1;
  const int bmax = blocks_per_sm > 0 ? std::min(blocks_per_sm, occ) : occ;
  for (int b = blocks_per_sm > 0 ? bmax : 1; b <= bmax; ++b) {
    const int64_t cap = static_cast<int64_t>(dev.sms) * b * kWarps;
    const int64_t cost = (nrg + cap - 1) / cap * b;
    if (best_cost < 0 || cost <= best_cost) best_cost = cost, best_b = b;
  }
  const int64_t cap = static_cast<int64_t>(dev.sms) * best_b * kWarps;
  const int64_t k = (nrg + cap - 1) / cap;
  const int64_t nw = (nrg + k - 1) / k;
  const unsigned grid = static_cast<unsigned>((nw + kWarps - 1) / kWarps);
  kernel<<<grid, kWarps * 32, smem, stream>>>(w.codes, w.scales, w.rows, w.cols, x, y, static_cast<int>(k),
                                              static_cast<int>(nw));
}

template <bool kFp4, int M>
void launch_rows_m(const QuantDeviceMatrix& w, const float* x, float* y, cudaStream_t stream, const Options& opt) {
  using F = Fmt<kFp4>;
  const DeviceInfo dev = device_info();
  const int64_t chunks = (kFp4 ? w.cols / 2 : w.cols) / 16;
  const int64_t smem = static_cast<int64_t>(M) * chunks * F::kPad * static_cast<int64_t>(sizeof(float));
  if (opt.force_tiled || smem > dev.smem_optin) return qg::launch_m<kFp4, M>(w, x, y, stream);  // production
  const int64_t kmax = (chunks + 31) / 32;  // chunks per lane
  RowsCfg cfg = opt.cfg;
  if (cfg == RowsCfg::kAuto) cfg = kmax >= 6 ? (M <= 2 ? RowsCfg::kR1G8 : RowsCfg::kR2G4) : kmax >= 3 ? RowsCfg::kR2G4 : RowsCfg::kR4G2;
  const int s = static_cast<int>(smem);
  if constexpr (M <= 2) {
    if (cfg == RowsCfg::kR1G8) return launch_rows<kFp4, M, 1, 8, 2>(w, x, y, stream, dev, s, opt.blocks_per_sm);
    if (cfg == RowsCfg::kR1G8D3) return launch_rows<kFp4, M, 1, 8, 3>(w, x, y, stream, dev, s, opt.blocks_per_sm);
    if (cfg == RowsCfg::kR1G4D3) return launch_rows<kFp4, M, 1, 4, 3>(w, x, y, stream, dev, s, opt.blocks_per_sm);
  }
  if (cfg == RowsCfg::kR4G2) return launch_rows<kFp4, M, 4, 2, 2>(w, x, y, stream, dev, s, opt.blocks_per_sm);
  launch_rows<kFp4, M, 2, 4, 2>(w, x, y, stream, dev, s, opt.blocks_per_sm);
}

template <bool kFp4>
void launch_rows_format(const QuantDeviceMatrix& w, const float* x, int m, float* y, cudaStream_t stream, const Options& opt) {
  switch (m) {
    case 1: return launch_rows_m<kFp4, 1>(w, x, y, stream, opt);
    case 2: return launch_rows_m<kFp4, 2>(w, x, y, stream, opt);
    case 3: return launch_rows_m<kFp4, 3>(w, x, y, stream, opt);
    case 4: return launch_rows_m<kFp4, 4>(w, x, y, stream, opt);
    case 5: return launch_rows_m<kFp4, 5>(w, x, y, stream, opt);
    case 6: return launch_rows_m<kFp4, 6>(w, x, y, stream, opt);
    case 7: return launch_rows_m<kFp4, 7>(w, x, y, stream, opt);
    default: return launch_rows_m<kFp4, 8>(w, x, y, stream, opt);
  }
}

// quant_gemv through the candidate schedule.
inline void gemv_rows(const QuantDeviceMatrix& w, const float* x, int m, float* y, cudaStream_t stream,
                            const Options& opt) {
  for (int r0 = 0; r0 < m; r0 += qg::kMaxRows) {
    const int mr = std::min(m - r0, qg::kMaxRows);
    // Rows of x in launches of up to 8: y row r0 + r is written at y + (r0 + r) * rows.
    if (w.format == QuantFormat::Fp4Group32)
      launch_rows_format<true>(w, x + r0 * w.cols, mr, y + r0 * w.rows, stream, opt);
    else
      launch_rows_format<false>(w, x + r0 * w.cols, mr, y + r0 * w.rows, stream, opt);
    DSINFER_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace cand

Launch prod_variant() {
  return [](const Mat& w, const float* x, int m, float* y) {
    const dsinfer::cuda::QuantDeviceMatrix dw{w.fp4 ? dsinfer::QuantFormat::Fp4Group32 : dsinfer::QuantFormat::Fp8Block128,
                                              w.codes, w.scales, w.rows, w.cols};
    dsinfer::cuda::quant_gemv(dw, x, m, y, nullptr);
  };
}

Launch rows_variant(cand::Options opt) {
  return [opt](const Mat& w, const float* x, int m, float* y) {
    const dsinfer::cuda::QuantDeviceMatrix dw{w.fp4 ? dsinfer::QuantFormat::Fp4Group32 : dsinfer::QuantFormat::Fp8Block128,
                                              w.codes, w.scales, w.rows, w.cols};
    cand::gemv_rows(dw, x, m, y, nullptr, opt);
  };
}

cand::Options opts(cand::RowsCfg cfg, int bps) {
  cand::Options o;
  o.cfg = cfg;
  o.blocks_per_sm = bps;
  return o;
}

// Run 1 (2026-12-03, docs/PERFORMANCE.md) also timed chunk variants with x from L1 (B),
// unfactored scales (C: bits equal to base), other U/R/W and quad variants; "Cf smem U4 R2
// W8" won overall and is what production now runs ("P prod", same arithmetic and launch).
std::vector<Variant> variants() {
  using cand::RowsCfg;
  return {
      {"base", "base", base_variant()},
      {"Cf smem U4 R2 W8", "chunk-factored", chunk_variant<2, 4, 8, true, true>()},
      {"D quad U8 R1 W8", "quad", quad_variant<1, 8, 8>()},
      {"P prod", "chunk-factored", prod_variant()},
      {"R auto", "chunk-factored", rows_variant(opts(RowsCfg::kAuto, 0))},
      {"R r1g8 b1", "chunk-factored", rows_variant(opts(RowsCfg::kR1G8, 1))},
      {"R r1g8 b2", "chunk-factored", rows_variant(opts(RowsCfg::kR1G8, 2))},
      {"R r1g8d3", "chunk-factored", rows_variant(opts(RowsCfg::kR1G8D3, 0))},
      {"R r1g4d3", "chunk-factored", rows_variant(opts(RowsCfg::kR1G4D3, 0))},
      {"R r1g4d3 b2", "chunk-factored", rows_variant(opts(RowsCfg::kR1G4D3, 2))},
      {"R r2g4", "chunk-factored", rows_variant(opts(RowsCfg::kR2G4, 0))},
      {"R r2g4 b2", "chunk-factored", rows_variant(opts(RowsCfg::kR2G4, 2))},
      {"R r4g2", "chunk-factored", rows_variant(opts(RowsCfg::kR4G2, 0))},
  };
}

struct Problem {
  bool fp4;
  int64_t rows, cols;
  std::vector<uint8_t> codes, scales;
  std::vector<float> x;  // 8 rows
  std::vector<double> ref, mag;  // [8][rows]
};

Problem make_problem(bool fp4, int64_t rows, int64_t cols, uint32_t seed) {
  Problem p{fp4, rows, cols, {}, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  const size_t cb = fp4 ? rows * cols / 2 : rows * cols;
  const size_t sb = fp4 ? rows * (cols / 32) : ((rows + 127) / 128) * ((cols + 127) / 128);
  p.codes.resize(cb);
  p.scales.resize(sb);
  for (uint8_t& c : p.codes) {
    c = static_cast<uint8_t>(rng());
    if (!fp4 && (c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
  }
  for (uint8_t& e : p.scales) e = static_cast<uint8_t>(118 + rng() % 16);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  p.x.resize(8 * cols);
  for (float& v : p.x) v = nd(rng);
  // Host reference: exact weights (host decoders), double sums.
  p.ref.assign(8 * rows, 0.0);
  p.mag.assign(8 * rows, 0.0);
  std::vector<float> wrow(cols);
  const int64_t sbc = (cols + 127) / 128;
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t k = 0; k < cols; ++k) {
      if (fp4) {
        const uint8_t b = p.codes[j * (cols / 2) + k / 2];
        wrow[k] = qd::e2m1(k % 2 ? b >> 4 : b & 0xf) * qd::e8m0(p.scales[j * (cols / 32) + k / 32]);
      } else {
        wrow[k] = qd::e4m3(p.codes[j * cols + k]) * qd::e8m0(p.scales[(j / 128) * sbc + k / 128]);
      }
    }
    for (int i = 0; i < 8; ++i) {
      double s = 0, m = 0;
      const float* xr = p.x.data() + i * cols;
      for (int64_t k = 0; k < cols; ++k) {
        const double t = static_cast<double>(xr[k]) * wrow[k];
        s += t;
        m += std::fabs(t);
      }
      p.ref[i * rows + j] = s;
      p.mag[i * rows + j] = m;
    }
  }
  return p;
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) { CK(cudaMalloc(&p, n * sizeof(T) + 16)); }
  Dev(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void put(const std::vector<T>& v) { CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> get(size_t k) const {
    std::vector<T> v(k);
    CK(cudaMemcpy(v.data(), p, k * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  Dev<uint8_t> a(bytes), b(bytes);
  CK(cudaMemset(a.p, 0x5a, bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    CK(cudaMemcpyAsync(i % 2 ? a.p : b.p, i % 2 ? b.p : a.p, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (only == "--probe") return 0;  // the binary loads and runs on this machine
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  // Decoder check against the host decoders, every code.
  {
    Dev<float> f8(256), f4(512);
    decode_check_kernel<<<1, 64>>>(f8.p, f4.p);
    CK(cudaGetLastError());
    const std::vector<float> g8 = f8.get(256), g4 = f4.get(512);
    int bad = 0;
    for (int v = 0; v < 256; ++v) {
      const float want = qd::e4m3(v);
      const bool ok = std::isnan(want) ? std::isnan(g8[v]) : std::memcmp(&want, &g8[v], 4) == 0;
      if (!ok) {
        ++bad;
        std::printf("  E4M3 %d: device %g host %g\n", v, g8[v], want);
      }
    }
    for (int t = 0; t < 64; ++t)
      for (int k = 0; k < 8; ++k) {
        const uint32_t byte = 4 * t + k / 2;
        const uint32_t nib = k % 2 ? byte >> 4 : byte & 0xf;
        const float want = qd::e2m1(nib) * 0x1p-14f, got = g4[8 * t + k];
        if (std::memcmp(&want, &got, 4) != 0) {
          ++bad;
          std::printf("  E2M1 %u: device %g host %g\n", nib, got, want);
        }
      }
    std::printf("decoders: %s (256 E4M3 codes, 512 E2M1 nibbles)\n", bad ? "MISMATCH" : "exact");
  }
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("device-to-device copy bandwidth: %.0f GB/s (read + write counted)\n", copy_gbs);

  const std::vector<Variant> vs = variants();
  struct Shape {
    bool fp4;
    int64_t rows, cols;
  };
  // Correctness: the unit test's shapes (partial scale blocks, partial 32-lane rounds) and
  // the timed ones.
  const Shape check_shapes[] = {{false, 300, 1040}, {false, 129, 4096}, {true, 257, 2048}, {true, 64, 7168},
                                {true, 100, 1056},  {false, 7168, 4096}, {false, 32768, 1024}, {true, 4096, 7168},
                                {true, 7168, 2048}};
  bool all_ok = true;
  for (const Shape& sh : check_shapes) {
    const Problem pr = make_problem(sh.fp4, sh.rows, sh.cols, static_cast<uint32_t>(sh.rows * 31 + sh.cols));
    Dev<uint8_t> dc(pr.codes.size()), ds(pr.scales.size());
    dc.put(pr.codes);
    ds.put(pr.scales);
    Dev<float> dx(pr.x.size()), dy8(8 * sh.rows), dy4(4 * sh.rows), dy1(sh.rows);
    dx.put(pr.x);
    const Mat w{sh.fp4, sh.rows, sh.cols, dc.p, ds.p};
    std::vector<float> base_y;
    std::vector<std::pair<std::string, std::vector<float>>> fam_y;
    for (const Variant& v : vs) {
      if (!only.empty() && v.name.find(only) == std::string::npos && v.name != "base") continue;
      CK(cudaMemset(dy8.p, 0xff, 8 * sh.rows * 4));
      v.launch(w, dx.p, 8, dy8.p);
      CK(cudaGetLastError());
      const std::vector<float> y8 = dy8.get(8 * sh.rows);
      double worst = 0;
      for (int i = 0; i < 8; ++i)
        for (int64_t j = 0; j < sh.rows; ++j)
          worst = std::max(worst, std::fabs(y8[i * sh.rows + j] - pr.ref[i * sh.rows + j]) / (pr.mag[i * sh.rows + j] + 1e-30));
      // Invariance: each row alone, and rows 4..7 as m = 4, against the m = 8 launch.
      int diff = 0;
      for (int i = 0; i < 8; ++i) {
        v.launch(w, dx.p + i * sh.cols, 1, dy1.p);
        const std::vector<float> y1 = dy1.get(sh.rows);
        diff += std::memcmp(y1.data(), y8.data() + i * sh.rows, 4 * sh.rows) != 0;
      }
      v.launch(w, dx.p + 4 * sh.cols, 4, dy4.p);
      const std::vector<float> y4 = dy4.get(4 * sh.rows);
      diff += std::memcmp(y4.data(), y8.data() + 4 * sh.rows, 4 * 4 * sh.rows) != 0;
      // The production dispatch takes every m: rows 6..7 (m = 2), 1..3 (m = 3), 3..7 (m = 5).
      if (v.name[0] == 'P' || v.name[0] == 'R') {
        Dev<float> dym(5 * sh.rows);
        for (const auto& [first, mm] : {std::pair{6, 2}, std::pair{1, 3}, std::pair{3, 5}}) {
          v.launch(w, dx.p + first * sh.cols, mm, dym.p);
          const std::vector<float> ym = dym.get(mm * sh.rows);
          diff += std::memcmp(ym.data(), y8.data() + first * sh.rows, 4 * mm * sh.rows) != 0;
        }
      }
      CK(cudaGetLastError());
      // Same family -> same bits.
      std::string same = "";
      const std::vector<float>* ref_bits = nullptr;
      if (v.family == "base")
        base_y = y8;
      if (v.family == "chunk") ref_bits = &base_y;
      for (auto& fy : fam_y)
        if (fy.first == v.family) ref_bits = &fy.second;
      if (ref_bits && !ref_bits->empty())
        same = std::memcmp(ref_bits->data(), y8.data(), 4 * 8 * sh.rows) == 0 ? ", family bits equal" : ", FAMILY BITS DIFFER";
      else if (v.family != "base" && v.family != "chunk")
        fam_y.push_back({v.family, y8});
      const bool ok = worst < 1e-5 && diff == 0 && same.find("DIFFER") == std::string::npos;
      all_ok &= ok;
      std::printf("check %s %lldx%lld %-18s worst %.2e of sum|xw|, invariance %s%s%s\n", sh.fp4 ? "FP4" : "FP8",
                  (long long)sh.rows, (long long)sh.cols, v.name.c_str(), worst, diff ? "BROKEN" : "ok", same.c_str(),
                  ok ? "" : "  <-- FAIL");
    }
  }
  std::printf("correctness: %s\n", all_ok ? "all passed" : "FAILURES");

  // Timing.
  const Shape time_shapes[] = {{false, 7168, 4096}, {false, 32768, 1024}, {true, 4096, 7168}, {true, 7168, 2048}};
  constexpr int kCopies = 16, kBatch = 32, kSamples = 15;
  for (const Shape& sh : time_shapes) {
    const Problem pr = make_problem(sh.fp4, 256, sh.cols, 5);  // x only (codes random below)
    std::mt19937 rng(7);
    const size_t cb = sh.fp4 ? sh.rows * sh.cols / 2 : sh.rows * sh.cols;
    const size_t sb = sh.fp4 ? sh.rows * (sh.cols / 32) : ((sh.rows + 127) / 128) * ((sh.cols + 127) / 128);
    std::vector<uint8_t> codes(cb), scales(sb);
    for (uint8_t& c : codes) {
      c = static_cast<uint8_t>(rng());
      if (!sh.fp4 && (c & 0x7f) == 0x7f) c ^= 1;
    }
    for (uint8_t& e : scales) e = static_cast<uint8_t>(118 + rng() % 16);
    Dev<uint8_t> dc(cb * kCopies), ds(sb * kCopies);
    CK(cudaMemcpy(dc.p, codes.data(), cb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds.p, scales.data(), sb, cudaMemcpyHostToDevice));
    for (int c = 1; c < kCopies; ++c) {
      CK(cudaMemcpy(dc.p + c * cb, dc.p, cb, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(ds.p + c * sb, ds.p, sb, cudaMemcpyDeviceToDevice));
    }
    Dev<float> dx(8 * sh.cols), dy(8 * sh.rows);
    dx.put(pr.x);
    const double bytes = static_cast<double>(cb + sb);
    std::printf("\n[time] %s %lldx%lld (%.1f MB), copy roofline %.0f GB/s\n", sh.fp4 ? "FP4" : "FP8", (long long)sh.rows,
                (long long)sh.cols, bytes / 1e6, copy_gbs);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (const Variant& v : vs) {
      if (!only.empty() && v.name.find(only) == std::string::npos && v.name != "base") continue;
      std::printf("  %-18s", v.name.c_str());
      for (int m : {1, 4, 8}) {
        auto run = [&](int i) {
          const Mat w{sh.fp4, sh.rows, sh.cols, dc.p + (i % kCopies) * cb, ds.p + (i % kCopies) * sb};
          v.launch(w, dx.p, m, dy.p);
        };
        for (int i = 0; i < kCopies; ++i) run(i);
        std::vector<float> per;
        for (int s = 0; s < kSamples; ++s) {
          cudaEventRecord(a);
          for (int i = 0; i < kBatch; ++i) run(i);
          cudaEventRecord(b);
          CK(cudaEventSynchronize(b));
          float ms = 0;
          cudaEventElapsedTime(&ms, a, b);
          per.push_back(ms * 1e3f / kBatch);
        }
        CK(cudaGetLastError());
        std::sort(per.begin(), per.end());
        const double us = per[per.size() / 2];
        std::printf("  m=%d %7.2f us %5.0f GB/s %4.1f%%", m, us, bytes / (us * 1e-6) / 1e9,
                    100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbs);
      }
      std::printf("\n");
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  return all_ok ? 0 : 1;
}
