// dsinfer CUDA backend: the block-quantized GEMV of DeepSeek-V4 weights (see
// cuda_quant_gemv.h for the layout and the reduction order).
#include "backend/cuda/cuda_quant_gemv.h"

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/quant_decode.h"
#include "core/error.h"

namespace dsinfer::cuda {
namespace {

constexpr int kWarps = 8;     // output rows per block
constexpr int kMaxRows = 8;   // rows of x per launch

using quant_decode::e2m1;
using quant_decode::e4m3;
using quant_decode::e8m0;

// One warp per output row j; `m` (1..8) rows of x. Lane l handles 16-byte chunks l, l + 32,
// ... of the row's codes.
template <bool kFp4>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows,
                      int64_t cols, const float* __restrict__ x, int m, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (j >= rows) return;
  constexpr int kPerChunk = kFp4 ? 32 : 16;  // weights per 16-byte chunk
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
    const float sc = kFp4 ? e8m0(scales[j * (cols / 32) + col0 / 32]) : e8m0(scales[(j / 128) * sb_cols + col0 / 128]);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    float w[kPerChunk];
#pragma unroll
    for (int b = 0; b < 16; ++b) {
      const uint32_t byte = (words[b / 4] >> (8 * (b % 4))) & 0xffu;
      if (kFp4) {
        w[2 * b] = e2m1(byte & 0xfu) * sc;
        w[2 * b + 1] = e2m1(byte >> 4) * sc;
      } else {
        w[b] = e4m3(byte) * sc;
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

}  // namespace

void check_quant_gemv_shape(const QuantDeviceMatrix& w) {
  const int64_t need = w.format == QuantFormat::Fp4Group32 ? 32 : 16;
  if (w.rows <= 0 || w.cols <= 0 || w.cols % need != 0)
    throw Error("quant_gemv: " + std::string(w.format == QuantFormat::Fp4Group32 ? "FP4" : "FP8") + " weight [" +
                std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]: columns must be a positive multiple of " +
                std::to_string(need));
}

void quant_gemv(const QuantDeviceMatrix& w, const float* x, int m, float* y, cudaStream_t stream) {
  check_quant_gemv_shape(w);
  if (m <= 0) return;
  const dim3 grid(static_cast<unsigned>((w.rows + kWarps - 1) / kWarps));
  for (int r0 = 0; r0 < m; r0 += kMaxRows) {
    const int mr = m - r0 < kMaxRows ? m - r0 : kMaxRows;
    // Rows of x in chunks of 8: y row r0 + r is written at y + (r0 + r) * rows.
    if (w.format == QuantFormat::Fp4Group32)
      quant_gemv_kernel<true><<<grid, kWarps * 32, 0, stream>>>(w.codes, w.scales, w.rows, w.cols, x + r0 * w.cols, mr,
                                                                y + r0 * w.rows);
    else
      quant_gemv_kernel<false><<<grid, kWarps * 32, 0, stream>>>(w.codes, w.scales, w.rows, w.cols, x + r0 * w.cols, mr,
                                                                 y + r0 * w.rows);
    DSINFER_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace dsinfer::cuda
