// dsinfer CUDA backend: DeepSeek-V4 kernels (see cuda_v4_kernels.h for the data flow).
// Each kernel mirrors one CPU function of model/deepseek_v4_*.cpp step by step; where the
// CPU runs a sequential chain the kernel runs a fixed-order reduction instead (lane-strided
// partial sums, then a fixed xor butterfly / fixed warp order), so results agree with the
// CPU to rounding and never depend on the batch.
#include "backend/cuda/cuda_v4_kernels.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_quant_gemv.h"
#include "core/error.h"

namespace dsinfer::cuda::v4 {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxSplitPartials = 32 * 1024;  // split-K partials per row of x

__device__ __forceinline__ float bf16_bits(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block in a fixed order (butterfly per warp, then the warps in order); every
// thread gets the total. `red` holds 32 values of T.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if constexpr (sizeof(T) == 8)
    v = warp_sum_d(v);
  else
    v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  T t = 0;
  for (int w = 0; w < nw; ++w) t += red[w];
  return t;
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int w = 0; w < nw; ++w) t = fmaxf(t, red[w]);
  return t;
}

// cos/sin of position p for pair j: the angle formed in F32 (as transformers), evaluated in
// double and rounded (as the CPU's rope_tables).
__device__ __forceinline__ void rope_cs(const float* inv, int p, int j, float& c, float& s) {
  const float a = static_cast<float>(p) * inv[j];
  c = static_cast<float>(cos(static_cast<double>(a)));
  s = static_cast<float>(sin(static_cast<double>(a)));
}

// Interleaved rotation of the last 2*half values of x (dim values), sign +1 or -1; threads
// of the group split the pairs. x may be global or shared memory.
__device__ __forceinline__ void rope_tail(float* x, int dim, int half, const float* inv, int p, float sign, int tid,
                                          int nt) {
  float* t = x + dim - 2 * half;
  for (int j = tid; j < half; j += nt) {
    float c, s;
    rope_cs(inv, p, j, c, s);
    s *= sign;
    const float a = t[2 * j], b = t[2 * j + 1];
    t[2 * j] = a * c - b * s;
    t[2 * j + 1] = b * c + a * s;
  }
}

// ---- linear layers (F32 / BF16 weights; FP8 / FP4 go to quant_gemv) ---------------------------
//
// One warp per output row; lane l owns the 16-byte weight chunks l, l + 32, ... (4 F32 or 8
// BF16 weights), sums them in ascending order into one F32 fma chain per row of x, then the
// 32 lanes reduce by a fixed butterfly. A block holds 8 warps (8 outputs) and up to 4 rows
// of x; the order per output depends on the matrix shape only.
template <typename TW, bool kRouted>
__global__ void __launch_bounds__(kThreads)
    plain_linear_kernel(const uint8_t* __restrict__ Wb, int64_t stride, const int32_t* __restrict__ eid, int64_t rows,
                        int64_t cols, int64_t kc, const float* __restrict__ x, int64_t ldx, int m, int x_div,
                        float* __restrict__ y, int64_t ldy) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (j >= rows) return;
  const TW* W;
  const float* xr;
  float* yr;
  int mr;
  if constexpr (kRouted) {
    const int p = blockIdx.y;
    W = reinterpret_cast<const TW*>(Wb + static_cast<int64_t>(eid[p]) * stride);
    xr = x + static_cast<int64_t>(p / x_div) * ldx;
    yr = y + static_cast<int64_t>(p) * ldy;
    mr = 1;
  } else {
    const int i0 = blockIdx.y * 4;
    W = reinterpret_cast<const TW*>(Wb);
    xr = x + static_cast<int64_t>(i0) * ldx;
    yr = y + static_cast<int64_t>(i0) * ldy;
    mr = min(4, m - i0);
  }
  // Split-K (gridDim.z > 1): this block sums columns [k0, k0 + kc) into partial row z.
  const int64_t k0 = static_cast<int64_t>(blockIdx.z) * kc;
  const TW* wr = W + j * cols + k0;
  xr += k0;
  yr += static_cast<int64_t>(blockIdx.z) * rows;
  const int64_t len = min(kc, cols - k0);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  constexpr int kE = 16 / sizeof(TW);
  const bool vec = len % kE == 0 && (reinterpret_cast<uintptr_t>(wr) & 15) == 0 && ldx % 4 == 0 &&
                   (reinterpret_cast<uintptr_t>(xr) & 15) == 0;
  if (vec) {
    const int64_t chunks = len / kE;
#pragma unroll 4
    for (int64_t c = lane; c < chunks; c += 32) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wr) + c);
      float wv[kE];
      if constexpr (sizeof(TW) == 4) {
        wv[0] = __uint_as_float(raw.x);
        wv[1] = __uint_as_float(raw.y);
        wv[2] = __uint_as_float(raw.z);
        wv[3] = __uint_as_float(raw.w);
      } else {
        const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          wv[2 * q] = __uint_as_float(u[q] << 16);
          wv[2 * q + 1] = __uint_as_float(u[q] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i >= mr) break;
        const float* xc = xr + i * ldx + c * kE;
#pragma unroll
        for (int v = 0; v < kE / 4; ++v) {
          const float4 t = __ldg(reinterpret_cast<const float4*>(xc) + v);
          acc[i] = fmaf(t.x, wv[4 * v], acc[i]);
          acc[i] = fmaf(t.y, wv[4 * v + 1], acc[i]);
          acc[i] = fmaf(t.z, wv[4 * v + 2], acc[i]);
          acc[i] = fmaf(t.w, wv[4 * v + 3], acc[i]);
        }
      }
    }
  } else {
    for (int64_t k = lane; k < len; k += 32) {
      float wk;
      if constexpr (sizeof(TW) == 4)
        wk = wr[k];
      else
        wk = bf16_bits(wr[k]);
      for (int i = 0; i < mr; ++i) acc[i] = fmaf(xr[i * ldx + k], wk, acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = warp_sum(acc[i]);
    if (lane == 0 && i < mr) yr[i * ldy + j] = a;
  }
}

// Sums the split-K partials [m][splits][rows] in split order.
__global__ void split_sum_kernel(const float* part, int splits, int64_t rows, int m, float* y, int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * rows) return;
  const int64_t r = i / rows, j = i - r * rows;
  const float* p = part + r * splits * rows + j;
  float a = 0.0f;
  for (int z = 0; z < splits; ++z) a += p[z * rows];
  y[r * ldy + j] = a;
}

QuantDeviceMatrix quant_of(const DevLinear& w) {
  return {w.kind == DevLinear::FP4 ? QuantFormat::Fp4Group32 : QuantFormat::Fp8Block128,
          static_cast<const uint8_t*>(w.w), w.scales, w.rows, w.cols};
}

// ---- mHC ---------------------------------------------------------------------------------------

__global__ void embed_streams_kernel(const void* emb, bool bf16, int64_t D, const int32_t* token, int T, int nhc,
                                     float* X) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t r = i / D, k = i - r * D;
  const int64_t src = static_cast<int64_t>(token[r]) * D + k;
  const float v = bf16 ? bf16_bits(static_cast<const uint16_t*>(emb)[src]) : static_cast<const float*>(emb)[src];
  for (int j = 0; j < nhc; ++j) X[(r * nhc + j) * D + k] = v;
}

__global__ void capture_mean_kernel(const float* X, int T, int nhc, int64_t D, float* dst, int64_t ld) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t r = i / D, k = i - r * D;
  float acc = 0.0f;
  for (int j = 0; j < nhc; ++j) acc += X[(r * nhc + j) * D + k];
  dst[r * ld + k] = acc / static_cast<float>(nhc);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// The MoE output of (row r, column d): sum over k in ascending expert id (stable: equal ids
// keep k order) of wts * yp, then + shared, as the CPU.
__device__ __forceinline__ float moe_value(const float* yp, const int32_t* eid, const float* wts, const float* shared,
                                           int K, int64_t D, int64_t r, int64_t d) {
  const int32_t* ir = eid + r * K;
  float o = 0.0f;
  int last_e = -1, last_k = -1;
  for (int done = 0; done < K; ++done) {
    int bk = -1;
    for (int k = 0; k < K; ++k) {
      const bool after = ir[k] > last_e || (ir[k] == last_e && k > last_k);
      if (after && (bk < 0 || ir[k] < ir[bk])) bk = k;
    }
    const float c = yp[(r * K + bk) * D + d] * wts[r * K + bk];
    o += c;
    last_e = ir[bk];
    last_k = bk;
  }
  return o + shared[r * D + d];
}

// X[r, k] = post_k * y + sum_j comb[j][k] X[r, j]; y is the sub-block output, or (yp != null)
// the MoE output formed here from the experts' rows (moe_combine fused in).
__global__ void hc_post_kernel(const float* post, const float* comb, const float* y, int T, int n, int64_t D,
                               float* X, const float* yp, const int32_t* eid, const float* wts, const float* shared,
                               int K) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t r = i / D, d = i - r * D;
  float old[8];
  float* xr = X + r * n * D;
  for (int j = 0; j < n; ++j) old[j] = xr[j * D + d];
  const float yv = yp ? moe_value(yp, eid, wts, shared, K, D, r, d) : y[r * D + d];
  const float* C = comb + r * n * n;
  for (int k = 0; k < n; ++k) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += C[j * n + k] * old[j];
    xr[k * D + d] = post[r * n + k] * yv + acc;
  }
}

__global__ void gather_rows_kernel(const float* src, int64_t width, const int32_t* idx, int n, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t r = i / width, k = i - r * width;
  dst[i] = src[static_cast<int64_t>(idx[r]) * width + k];
}

// ---- mHC, wide form: every row spread over many blocks ------------------------------------------

// parts[t * nc + c] = sum of squares (double) of X[t, c * chunk .. (c + 1) * chunk).
__global__ void __launch_bounds__(kThreads) sumsq_parts_kernel(const float* X, int64_t W, int64_t chunk, double* parts) {
  __shared__ double red[32];
  const int c = blockIdx.x, t = blockIdx.y;
  const float* x = X + t * W;
  const int64_t lo = c * chunk, hi = min(W, lo + chunk);
  double ss = 0.0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) parts[static_cast<int64_t>(t) * gridDim.x + c] = ss;
}

// 1 / rms of a row from its chunk sums (in chunk order).
__device__ __forceinline__ float inv_rms_from_parts(const double* parts, int nc, int64_t W, float eps) {
  double s = 0.0;
  for (int c = 0; c < nc; ++c) s += parts[c];
  return static_cast<float>(1.0 / sqrt(s / static_cast<double>(W) + static_cast<double>(eps)));
}

// One mHC site over row t, columns [blockIdx.x * 256, +256): zr = z_raw * inv_rms(X) (the
// projection of the normalised streams), pre = sigmoid(zr * s0 + b) + eps, u = sum_j pre_j X_j
// and the block's sum of squares of u into uparts. Block 0 of the row also writes post and
// comb (Sinkhorn on its warp 1) for hc_post. head: the final collapse (pre from
// zr * scale[0] + base, no post/comb).
__global__ void __launch_bounds__(kThreads)
    hc_mix_kernel(const float* z, HcSite site, int n, int iters, float hc_eps, const double* xparts, int xnc,
                  const float* X, int64_t D, float eps, bool head, float* u, float* uparts, float* post, float* comb) {
  __shared__ float pre[8], C[64], red[32];
  const int t = blockIdx.y;
  const int M = head ? n : (2 + n) * n;
  const float inv = inv_rms_from_parts(xparts + static_cast<int64_t>(t) * xnc, xnc, n * D, eps);
  const float* zr = z + static_cast<int64_t>(t) * M;
  const float* b = site.base;
  if (threadIdx.x < n) pre[threadIdx.x] = sigmoidf_(zr[threadIdx.x] * inv * site.scale[0] + b[threadIdx.x]) + hc_eps;
  if (!head && blockIdx.x == 0 && threadIdx.x >= 32 && threadIdx.x < 64) {
    // post and comb (warp 1): lane l owns comb elements l and l + 32; row and column sums
    // run over their n values in index order, as the CPU's loops.
    const int lane = threadIdx.x - 32;
    const float s1 = site.scale[1], s2 = site.scale[2];
    if (lane < n) post[t * n + lane] = 2.0f * sigmoidf_(zr[n + lane] * inv * s1 + b[n + lane]);
    const int nn = n * n;
    if ((n & (n - 1)) == 0 && nn <= 32) {
      // n a power of two: lane e = a * n + c holds one element in a register; row sums are
      // xor butterflies over the low log2(n) lane bits, column sums over the next ones
      // (a fixed order; lanes >= nn never mix with lanes < nn). About 20x faster than the
      // shared-memory loop below, whose latency held the whole site (15 us a call).
      float v = lane < nn ? zr[2 * n + lane] * inv * s2 + b[2 * n + lane] : 0.0f;
      float mx = v;
      for (int o = 1; o < n; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      float ex = expf(v - mx), sum = ex;
      for (int o = 1; o < n; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      v = ex / sum + hc_eps;
      for (int it = 0; it < iters; ++it)
        for (int pass = it > 0 ? 0 : 1; pass < 2; ++pass) {  // pass 0: rows, pass 1: columns
          float part = v;
          if (pass == 0)
            for (int o = 1; o < n; o <<= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
          else
            for (int o = n; o < nn; o <<= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
          v = v / (part + hc_eps);
        }
      if (lane < nn) comb[static_cast<int64_t>(t) * nn + lane] = v;
    } else {
    for (int e = lane; e < nn; e += 32) C[e] = zr[2 * n + e] * inv * s2 + b[2 * n + e];
    __syncwarp();
    float v0 = 0.0f, v1 = 0.0f;
    auto softmax_el = [&](int e) {
      const int a = e / n;
      float mx = -INFINITY;
      for (int c = 0; c < n; ++c) mx = fmaxf(mx, C[a * n + c]);
      float sum = 0.0f;
      for (int c = 0; c < n; ++c) sum += expf(C[a * n + c] - mx);
      return expf(C[e] - mx) / sum + hc_eps;
    };
    if (lane < nn) v0 = softmax_el(lane);
    if (lane + 32 < nn) v1 = softmax_el(lane + 32);
    __syncwarp();
    if (lane < nn) C[lane] = v0;
    if (lane + 32 < nn) C[lane + 32] = v1;
    __syncwarp();
    auto norm_el = [&](int e, bool rows) {
      const int a = e / n, c = e - a * n;
      float sum = 0.0f;
      if (rows)
        for (int k = 0; k < n; ++k) sum += C[a * n + k];
      else
        for (int k = 0; k < n; ++k) sum += C[k * n + c];
      return C[e] / (sum + hc_eps);
    };
    for (int it = 0; it < iters; ++it)
      for (int pass = it > 0 ? 0 : 1; pass < 2; ++pass) {  // pass 0: rows, pass 1: columns
        if (lane < nn) v0 = norm_el(lane, pass == 0);
        if (lane + 32 < nn) v1 = norm_el(lane + 32, pass == 0);
        __syncwarp();
        if (lane < nn) C[lane] = v0;
        if (lane + 32 < nn) C[lane + 32] = v1;
        __syncwarp();
      }
    for (int e = lane; e < nn; e += 32) comb[static_cast<int64_t>(t) * nn + e] = C[e];
    }
  }
  __syncthreads();
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float ss = 0.0f;
  if (k < D) {
    const float* xr = X + static_cast<int64_t>(t) * n * D;
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += pre[j] * xr[j * D + k];
    u[static_cast<int64_t>(t) * D + k] = acc;
    ss = acc * acc;
  }
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) uparts[static_cast<int64_t>(t) * gridDim.x + blockIdx.x] = ss;
}

// h[t] = w * (u[t] * inv_rms(u[t])), the rms from the row's block sums in block order.
__global__ void __launch_bounds__(kThreads)
    hc_norm_kernel(const float* u, const float* uparts, int unc, int64_t D, const float* w, float eps, float* h) {
  const int t = blockIdx.y;
  float s = 0.0f;
  for (int c = 0; c < unc; ++c) s += uparts[static_cast<int64_t>(t) * unc + c];
  const float inv = 1.0f / sqrtf(s / static_cast<float>(D) + eps);
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < D) h[static_cast<int64_t>(t) * D + k] = w[k] * (u[static_cast<int64_t>(t) * D + k] * inv);
}

// act[p, i] = silu(min(g, limit)) * clamp(u, -limit, limit) from rows [g | u] of width 2I.
__global__ void swiglu_rows_kernel(const float* gu, int64_t n, int64_t I, float limit, float* act) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * I) return;
  const int64_t p = i / I, k = i - p * I;
  const float gg = fminf(gu[p * 2 * I + k], limit);
  const float uu = fmaxf(fminf(gu[p * 2 * I + I + k], limit), -limit);
  act[i] = gg / (1.0f + expf(-gg)) * uu;
}

// ---- attention pieces --------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) rmsnorm_rows_kernel(float* x, int64_t ld, int n, const float* w, float eps) {
  __shared__ float red[32];
  float* xr = x + blockIdx.x * ld;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = w[i] * (xr[i] * inv);
}

// One warp per (row, head).
__global__ void head_rms_rope_kernel(float* q, int T, int H, int d, int half, const float* inv, const int32_t* pos,
                                     float eps, bool norm) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (g >= static_cast<int64_t>(T) * H) return;
  const int64_t r = g / H;
  float* qh = q + g * d;
  if (norm) {
    float ss = 0.0f;
    for (int k = lane; k < d; k += 32) ss += qh[k] * qh[k];
    ss = warp_sum(ss);
    const float iv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    for (int k = lane; k < d; k += 32) qh[k] = qh[k] * iv;
    __syncwarp();
  }
  rope_tail(qh, d, half, inv, pos[r], 1.0f, lane, 32);
}

__global__ void __launch_bounds__(128) kv_norm_rope_store_kernel(const float* kv, int64_t ld, int d, const float* w,
                                                                  float eps,
                                                                  int half, const float* inv, RowMeta rows, float* state,
                                                                  int cap) {
  extern __shared__ float row[];
  __shared__ float red[32];
  const int r = blockIdx.x;
  const int slot = rows.slot[r], p = rows.pos[r];
  const float* x = kv + static_cast<int64_t>(r) * ld;
  float ss = 0.0f;
  for (int k = threadIdx.x; k < d; k += blockDim.x) ss += x[k] * x[k];
  ss = block_sum(ss, red);
  const float iv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (int k = threadIdx.x; k < d; k += blockDim.x) row[k] = w[k] * (x[k] * iv);
  __syncthreads();
  rope_tail(row, d, half, inv, p, 1.0f, threadIdx.x, blockDim.x);
  __syncthreads();
  float* dst = state + (static_cast<int64_t>(slot) * cap + p) * d;
  for (int k = threadIdx.x; k < d; k += blockDim.x) dst[k] = row[k];
}

__global__ void store_raw_kernel(const float* C, const float* Z, int64_t ld, int T, int cw, RowMeta rows, float* raw,
                                 int cap) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(T) * cw) return;
  const int64_t r = i / cw, k = i - r * cw;
  float* dst = raw + (static_cast<int64_t>(rows.slot[r]) * cap + rows.pos[r]) * 2 * cw;
  dst[k] = C[r * ld + k];
  dst[cw + k] = Z[r * ld + k];
}

__global__ void __launch_bounds__(128)
    pool_windows_kernel(const float* raw, int cap, float* entries, int ecap, const PoolJob* jobs, const int32_t* njobs,
                        int m, int dd, bool overlap, const float* pos_bias, const float* norm_w, float eps, int half,
                        const float* inv) {
  extern __shared__ float pooled[];
  __shared__ float red[32];
  if (static_cast<int>(blockIdx.x) >= *njobs) return;
  const PoolJob job = jobs[blockIdx.x];
  const int cw = overlap ? 2 * dd : dd;
  const float* base = raw + static_cast<int64_t>(job.slot) * cap * 2 * cw;
  const int w = job.window;
  float ss = 0.0f;
  for (int k = threadIdx.x; k < dd; k += blockDim.x) {
    // The window's slots: (position, bias row j, half offset), as the CPU's pool_window.
    auto slot_at = [&](int s, int64_t& p, int& j, int& off) {
      if (overlap && w > 0) {
        if (s < m) {
          p = static_cast<int64_t>(w - 1) * m + s, j = s, off = 0;
          return;
        }
        s -= m;
      }
      p = static_cast<int64_t>(w) * m + s, j = s, off = overlap ? dd : 0;
    };
    const int nslot = (overlap && w > 0) ? 2 * m : m;
    float mx = -INFINITY;
    for (int s = 0; s < nslot; ++s) {
      int64_t p;
      int j, off;
      slot_at(s, p, j, off);
      const float g = base[p * 2 * cw + cw + off + k] + pos_bias[static_cast<int64_t>(j) * cw + off + k];
      mx = fmaxf(mx, g);
    }
    float sum = 0.0f;
    for (int s = 0; s < nslot; ++s) {
      int64_t p;
      int j, off;
      slot_at(s, p, j, off);
      sum += expf(base[p * 2 * cw + cw + off + k] + pos_bias[static_cast<int64_t>(j) * cw + off + k] - mx);
    }
    float acc = 0.0f;
    for (int s = 0; s < nslot; ++s) {
      int64_t p;
      int j, off;
      slot_at(s, p, j, off);
      const float g = base[p * 2 * cw + cw + off + k] + pos_bias[static_cast<int64_t>(j) * cw + off + k];
      acc += base[p * 2 * cw + off + k] * (expf(g - mx) / sum);
    }
    pooled[k] = acc;
    ss += acc * acc;
  }
  ss = block_sum(ss, red);
  const float iv = 1.0f / sqrtf(ss / static_cast<float>(dd) + eps);
  for (int k = threadIdx.x; k < dd; k += blockDim.x) pooled[k] = norm_w[k] * (pooled[k] * iv);
  __syncthreads();
  rope_tail(pooled, dd, half, inv, w * m, 1.0f, threadIdx.x, blockDim.x);
  __syncthreads();
  float* dst = entries + (static_cast<int64_t>(job.slot) * ecap + w) * dd;
  for (int k = threadIdx.x; k < dd; k += blockDim.x) dst[k] = pooled[k];
}

constexpr int kMaxIndexerEntries = 16384;

__device__ __forceinline__ uint32_t float_order(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Bitonic sort of n (a power of two) 64-bit keys in shared memory, ascending.
__device__ void bitonic_sort(unsigned long long* key, int n) {
  for (int k = 2; k <= n; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int l = i ^ j;
        if (l > i) {
          const bool up = (i & k) == 0;
          const unsigned long long a = key[i], b = key[l];
          if ((a > b) == up) {
            key[i] = b;
            key[l] = a;
          }
        }
      }
      __syncthreads();
    }
}

__global__ void __launch_bounds__(kThreads)
    indexer_topk_kernel(const float* iq, const float* iw, int HI, int dI, RowMeta rows, const float* entries, int ecap,
                        int m, int topk, int32_t* sel, int32_t* nsel) {
  extern __shared__ unsigned long long keys[];
  const int r = blockIdx.x;
  const int slot = rows.slot[r], p = rows.pos[r];
  const int nvis = (p + 1) / m;
  const int kk = min(topk, nvis);
  int32_t* out = sel + static_cast<int64_t>(r) * topk;
  if (threadIdx.x == 0) nsel[r] = kk;
  if (nvis <= topk) {  // every visible entry, in order
    for (int w = threadIdx.x; w < nvis; w += blockDim.x) out[w] = w;
    return;
  }
  const float iscale = 1.0f / sqrtf(static_cast<float>(dI)), wscale = 1.0f / sqrtf(static_cast<float>(HI));
  const float* q = iq + static_cast<int64_t>(r) * HI * dI;
  const float* wr = iw + static_cast<int64_t>(r) * HI;
  int n = 1;
  while (n < nvis) n <<= 1;
  for (int w = threadIdx.x; w < n; w += blockDim.x) {
    if (w >= nvis) {
      keys[w] = ~0ull;
      continue;
    }
    const float* kw = entries + (static_cast<int64_t>(slot) * ecap + w) * dI;
    float sc = 0.0f;
    for (int h = 0; h < HI; ++h) {
      float dot = 0.0f;
      for (int k = 0; k < dI; ++k) dot += q[h * dI + k] * kw[k];
      sc += fmaxf(dot, 0.0f) * iscale * (wr[h] * wscale);
    }
    if (sc == 0.0f) sc = 0.0f;  // -0 ranks as +0 (the CPU compares values)
    keys[w] = (static_cast<unsigned long long>(~float_order(sc)) << 32) | static_cast<uint32_t>(w);
  }
  __syncthreads();
  bitonic_sort(keys, n);
  // The kk best, in ascending entry order: sort their indices.
  int n2 = 1;
  while (n2 < kk) n2 <<= 1;
  for (int i = threadIdx.x; i < n2; i += blockDim.x) keys[i] = i < kk ? (keys[i] & 0xffffffffull) : ~0ull;
  __syncthreads();
  bitonic_sort(keys, n2);
  for (int i = threadIdx.x; i < kk; i += blockDim.x) out[i] = static_cast<int32_t>(keys[i]);
}

// One block per (head, row): logits of every key (a warp per key), softmax with the sink,
// the weighted sum of the keys (a thread per dimension, keys in order), inverse RoPE.
__global__ void __launch_bounds__(128)
    attention_rows_kernel(const float* q, int H, int d, int half, const float* inv, RowMeta rows, const float* kv,
                          int cap, int W, int kind, const float* entries, int ecap, int m, const int32_t* sel,
                          const int32_t* nsel, int topk, const float* sinks, float* att) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  const int h = blockIdx.x, r = blockIdx.y;
  const int slot = rows.slot[r], p = rows.pos[r];
  const int lo = max(0, p - W + 1), nw = p - lo + 1;
  const int ne = kind == 0 ? 0 : kind == 2 ? (p + 1) / m : nsel[r];
  const int nk = nw + ne;
  float* qs = sm;          // d
  float* logit = sm + d;   // nk
  const float* qh = q + (static_cast<int64_t>(r) * H + h) * d;
  for (int k = threadIdx.x; k < d; k += blockDim.x) qs[k] = qh[k];
  __syncthreads();
  const float* kvs = kv + static_cast<int64_t>(slot) * cap * d;
  const float* ens = entries ? entries + static_cast<int64_t>(slot) * ecap * d : nullptr;
  const int32_t* sr = kind == 1 ? sel + static_cast<int64_t>(r) * topk : nullptr;
  auto key = [&](int j) -> const float* {
    if (j < nw) return kvs + static_cast<int64_t>(lo + j) * d;
    const int e = j - nw;
    return ens + static_cast<int64_t>(kind == 1 ? sr[e] : e) * d;
  };
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  for (int j = warp; j < nk; j += nwarp) {
    const float* kj = key(j);
    float dot = 0.0f;
    for (int k = lane; k < d; k += 32) dot += qs[k] * kj[k];
    dot = warp_sum(dot);
    if (lane == 0) logit[j] = dot * scale;
  }
  __syncthreads();
  float mx = sinks[h];
  for (int j = threadIdx.x; j < nk; j += blockDim.x) mx = fmaxf(mx, logit[j]);
  mx = block_max(mx, red);
  float part = 0.0f;
  for (int j = threadIdx.x; j < nk; j += blockDim.x) part += (logit[j] = expf(logit[j] - mx));
  const float sum = block_sum(part, red) + expf(sinks[h] - mx);
  __syncthreads();
  for (int k = threadIdx.x; k < d; k += blockDim.x) {
    float o = 0.0f;
    for (int j = 0; j < nk; ++j) o += (logit[j] / sum) * key(j)[k];
    qs[k] = o;
  }
  __syncthreads();
  rope_tail(qs, d, half, inv, p, -1.0f, threadIdx.x, blockDim.x);
  __syncthreads();
  float* dst = att + (static_cast<int64_t>(r) * H + h) * d;
  for (int k = threadIdx.x; k < d; k += blockDim.x) dst[k] = qs[k];
}

// ---- MoE ---------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    moe_route_kernel(const float* logits, int E, int K, bool sigmoid, const float* bias, const int32_t* tid2eid,
                     const int32_t* tokens, float routed_scale, int32_t* eid, float* wts) {
  extern __shared__ float s[];
  __shared__ int ir[64];
  const int r = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float x = logits[static_cast<int64_t>(r) * E + e];
    if (sigmoid) {
      s[e] = 1.0f / (1.0f + expf(-x));
    } else {
      const float sp = x > 20.0f ? x : log1pf(expf(x));
      s[e] = sqrtf(sp);
    }
  }
  __syncthreads();
  if (tid2eid) {
    if (threadIdx.x < K) ir[threadIdx.x] = tid2eid[static_cast<int64_t>(tokens[r]) * K + threadIdx.x];
  } else {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float v = s[e] + bias[e];
      int rank = 0;
      for (int o = 0; o < E; ++o) {
        const float vo = s[o] + bias[o];
        rank += (vo > v) || (vo == v && o < e);
      }
      if (rank < K) ir[rank] = e;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += s[ir[k]];
    for (int k = 0; k < K; ++k) {
      eid[r * K + k] = ir[k];
      wts[r * K + k] = s[ir[k]] / (sum + 1e-20f) * routed_scale;
    }
  }
}

__global__ void swiglu_clamp_kernel(const float* g, const float* u, int64_t n, float limit, float* act) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gg = fminf(g[i], limit);
  const float uu = fmaxf(fminf(u[i], limit), -limit);
  act[i] = gg / (1.0f + expf(-gg)) * uu;
}

__global__ void __launch_bounds__(kThreads) argmax_rows_kernel(const float* logits, int V, int32_t* ids) {
  __shared__ float bv[kThreads];
  __shared__ int bi[kThreads];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * V;
  float best = -INFINITY;
  int at = 0x7fffffff;
  for (int j = threadIdx.x; j < V; j += blockDim.x)
    if (row[j] > best || at == 0x7fffffff) best = row[j], at = j;
  bv[threadIdx.x] = best;
  bi[threadIdx.x] = at;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) {
      const float v2 = bv[threadIdx.x + o];
      const int i2 = bi[threadIdx.x + o];
      if (v2 > bv[threadIdx.x] || (v2 == bv[threadIdx.x] && i2 < bi[threadIdx.x])) {
        bv[threadIdx.x] = v2;
        bi[threadIdx.x] = i2;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = bi[0];
}

unsigned blocks_for(int64_t n, int per = kThreads) { return static_cast<unsigned>((n + per - 1) / per); }

void opt_in_smem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  raise_dynamic_smem(kernel, bytes);
}

}  // namespace

int64_t max_split_partials() { return kMaxSplitPartials; }

void linear(const DevLinear& w, const float* x, int64_t ldx, int m, float* y, int64_t ldy, float* staging,
            int64_t staging_floats, cudaStream_t s) {
  if (m <= 0) return;
  if (w.kind == DevLinear::FP8 || w.kind == DevLinear::FP4) {
    const QuantDeviceMatrix q = quant_of(w);
    if (m == 1 || (ldx == w.cols && ldy == w.rows)) {
      quant_gemv(q, x, m, y, s);
      return;
    }
    // Strided rows (the grouped output projection): through dense staging.
    float* xs = staging;
    float* ys = staging + static_cast<int64_t>(m) * w.cols;
    DSINFER_CUDA_CHECK(cudaMemcpy2DAsync(xs, w.cols * sizeof(float), x, ldx * sizeof(float), w.cols * sizeof(float), m,
                                         cudaMemcpyDeviceToDevice, s));
    quant_gemv(q, xs, m, ys, s);
    DSINFER_CUDA_CHECK(cudaMemcpy2DAsync(y, ldy * sizeof(float), ys, w.rows * sizeof(float), w.rows * sizeof(float), m,
                                         cudaMemcpyDeviceToDevice, s));
    return;
  }
  // Few long rows (the mHC projections, the router): split K into chunks of 512 so that
  // enough warps stream the matrix; the chunk count depends on the shape alone, and the
  // partials are summed in chunk order, so the bits still do not depend on m.
  int splits = 1;
  int64_t kc = w.cols;
  if (w.rows < 1024 && w.cols >= 2048 && (w.cols + 511) / 512 * w.rows <= kMaxSplitPartials) {
    kc = 512;
    splits = static_cast<int>((w.cols + kc - 1) / kc);
    if (static_cast<int64_t>(m) * splits * w.rows > staging_floats)
      throw Error("v4::linear: staging of " + std::to_string(staging_floats) + " floats is below " +
                  std::to_string(int64_t(m) * kMaxSplitPartials) + " (rows x split-K partials)");
  }
  float* yk = splits > 1 ? staging : y;
  const int64_t ldk = splits > 1 ? splits * w.rows : ldy;
  const dim3 grid(blocks_for(w.rows, 8), static_cast<unsigned>((m + 3) / 4), static_cast<unsigned>(splits));
  if (w.kind == DevLinear::BF16)
    plain_linear_kernel<uint16_t, false><<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(w.w), 0, nullptr, w.rows,
                                                                   w.cols, kc, x, ldx, m, 1, yk, ldk);
  else
    plain_linear_kernel<float, false><<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(w.w), 0, nullptr, w.rows,
                                                                w.cols, kc, x, ldx, m, 1, yk, ldk);
  DSINFER_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    split_sum_kernel<<<blocks_for(m * w.rows), kThreads, 0, s>>>(staging, splits, w.rows, m, y, ldy);
    DSINFER_CUDA_CHECK(cudaGetLastError());
  }
}

void linear_routed(const DevLinear& w, const int32_t* eid, int pairs, const float* x, int x_div, float* y,
                   cudaStream_t s) {
  if (pairs <= 0) return;
  if (w.kind == DevLinear::FP8 || w.kind == DevLinear::FP4) {
    quant_gemv_routed(quant_of(w), w.stride, w.scale_stride, eid, pairs, x, x_div, y, s);
    return;
  }
  const dim3 grid(blocks_for(w.rows, 8), static_cast<unsigned>(pairs));
  if (w.kind == DevLinear::BF16)
    plain_linear_kernel<uint16_t, true><<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(w.w), w.stride, eid,
                                                                  w.rows, w.cols, w.cols, x, w.cols, pairs, x_div, y,
                                                                  w.rows);
  else
    plain_linear_kernel<float, true><<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(w.w), w.stride, eid, w.rows,
                                                               w.cols, w.cols, x, w.cols, pairs, x_div, y, w.rows);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void embed_streams(const void* emb, bool bf16, int64_t D, RowMeta rows, int T, int nhc, float* X, cudaStream_t s) {
  if (T <= 0) return;
  embed_streams_kernel<<<blocks_for(T * D), kThreads, 0, s>>>(emb, bf16, D, rows.token, T, nhc, X);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void capture_mean(const float* X, int T, int nhc, int64_t D, float* dst, int64_t ld, cudaStream_t s) {
  if (T <= 0) return;
  capture_mean_kernel<<<blocks_for(T * D), kThreads, 0, s>>>(X, T, nhc, D, dst, ld);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void hc_post(const float* post, const float* comb, const float* y, int T, int n, int64_t D, float* X, cudaStream_t s) {
  if (T <= 0) return;
  hc_post_kernel<<<blocks_for(T * D), kThreads, 0, s>>>(post, comb, y, T, n, D, X, nullptr, nullptr, nullptr, nullptr,
                                                         0);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void hc_post_moe(const float* post, const float* comb, const float* yp, const int32_t* eid, const float* wts,
                 const float* shared, int K, int T, int n, int64_t D, float* X, cudaStream_t s) {
  if (T <= 0) return;
  hc_post_kernel<<<blocks_for(T * D), kThreads, 0, s>>>(post, comb, nullptr, T, n, D, X, yp, eid, wts, shared, K);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const float* src, int64_t width, const int32_t* idx, int n, float* dst, cudaStream_t s) {
  if (n <= 0) return;
  gather_rows_kernel<<<blocks_for(n * width), kThreads, 0, s>>>(src, width, idx, n, dst);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_rows(float* x, int64_t ld, int T, int n, const float* w, float eps, cudaStream_t s) {
  if (T <= 0) return;
  rmsnorm_rows_kernel<<<T, kThreads, 0, s>>>(x, ld, n, w, eps);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void head_rms_rope(float* q, int T, int H, int d, int half, const float* inv, const int32_t* pos, float eps,
                   cudaStream_t s) {
  if (T <= 0) return;
  head_rms_rope_kernel<<<blocks_for(static_cast<int64_t>(T) * H, 8), kThreads, 0, s>>>(q, T, H, d, half, inv, pos, eps,
                                                                                       true);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void head_rope(float* q, int T, int H, int d, int half, const float* inv, const int32_t* pos, cudaStream_t s) {
  if (T <= 0) return;
  head_rms_rope_kernel<<<blocks_for(static_cast<int64_t>(T) * H, 8), kThreads, 0, s>>>(q, T, H, d, half, inv, pos,
                                                                                       0.0f, false);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void kv_norm_rope_store(const float* kv, int64_t ld, int T, int d, const float* w, float eps, int half,
                        const float* inv, RowMeta rows, float* state, int cap, cudaStream_t s) {
  if (T <= 0) return;
  kv_norm_rope_store_kernel<<<T, 128, sizeof(float) * d, s>>>(kv, ld, d, w, eps, half, inv, rows, state, cap);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void store_raw(const float* C, const float* Z, int64_t ld, int T, int cw, RowMeta rows, float* raw, int cap,
               cudaStream_t s) {
  if (T <= 0) return;
  store_raw_kernel<<<blocks_for(static_cast<int64_t>(T) * cw), kThreads, 0, s>>>(C, Z, ld, T, cw, rows, raw, cap);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void pool_windows(const float* raw, int cap, float* entries, int ecap, const PoolJob* jobs, const int32_t* njobs,
                  int max_jobs, int m, int dd, bool overlap, const float* pos_bias, const float* norm_w, float eps,
                  int half, const float* inv, cudaStream_t s) {
  if (max_jobs <= 0) return;
  pool_windows_kernel<<<max_jobs, 128, sizeof(float) * dd, s>>>(raw, cap, entries, ecap, jobs, njobs, m, dd, overlap,
                                                               pos_bias, norm_w, eps, half, inv);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

int max_indexer_entries() { return kMaxIndexerEntries; }

void indexer_topk(const float* iq, const float* iw, int T, int HI, int dI, RowMeta rows, const float* entries,
                  int ecap, int m, int topk, int32_t* sel, int32_t* nsel, cudaStream_t s) {
  if (T <= 0) return;
  int n = 1;
  while (n < std::min(ecap, kMaxIndexerEntries)) n <<= 1;
  const size_t smem = sizeof(unsigned long long) * std::max(n, 1);
  static std::once_flag once;
  std::call_once(once, [] {
    opt_in_smem(reinterpret_cast<const void*>(indexer_topk_kernel), sizeof(unsigned long long) * kMaxIndexerEntries);
  });
  indexer_topk_kernel<<<T, kThreads, smem, s>>>(iq, iw, HI, dI, rows, entries, ecap, m, topk, sel, nsel);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void attention_rows(const float* q, int T, int H, int d, int half, const float* inv, RowMeta rows, const float* kv,
                    int cap, int W, int kind, const float* entries, int ecap, int m, const int32_t* sel,
                    const int32_t* nsel, int topk, const float* sinks, float* att, cudaStream_t s) {
  if (T <= 0) return;
  const int max_entries = kind == 0 ? 0 : kind == 2 ? ecap : topk;
  const size_t smem = sizeof(float) * (static_cast<size_t>(d) + W + max_entries);
  static std::once_flag once;
  std::call_once(once, [] { opt_in_smem(reinterpret_cast<const void*>(attention_rows_kernel), 200 * 1024); });
  if (smem > 200 * 1024) throw Error("DeepSeek-V4 CUDA attention: " + std::to_string(W + max_entries) +
                                     " keys per query exceed the kernel's shared memory");
  attention_rows_kernel<<<dim3(H, T), 128, smem, s>>>(q, H, d, half, inv, rows, kv, cap, W, kind, entries, ecap, m, sel,
                                                      nsel, topk, sinks, att);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void moe_route(const float* logits, int T, int E, int K, bool sigmoid, const float* bias, const int32_t* tid2eid,
               const int32_t* tokens, float routed_scale, int32_t* eid, float* wts, cudaStream_t s) {
  if (T <= 0) return;
  if (K > 64) throw Error("DeepSeek-V4 CUDA MoE: top-k " + std::to_string(K) + " above 64");
  moe_route_kernel<<<T, kThreads, sizeof(float) * E, s>>>(logits, E, K, sigmoid, bias, tid2eid, tokens, routed_scale,
                                                         eid, wts);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void swiglu_clamp(const float* g, const float* u, int64_t n, float limit, float* act, cudaStream_t s) {
  if (n <= 0) return;
  swiglu_clamp_kernel<<<blocks_for(n), kThreads, 0, s>>>(g, u, n, limit, act);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

int sumsq_chunks(int64_t W) { return static_cast<int>((W + 1023) / 1024); }

void sumsq_parts(const float* X, int T, int64_t W, double* parts, cudaStream_t s) {
  if (T <= 0) return;
  sumsq_parts_kernel<<<dim3(sumsq_chunks(W), T), kThreads, 0, s>>>(X, W, 1024, parts);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

int mix_blocks(int64_t D) { return static_cast<int>((D + kThreads - 1) / kThreads); }

void hc_site(const float* z, HcSite site, int n, int iters, float hc_eps, const double* xparts, const float* X, int T,
             int64_t D, const float* norm_w, float eps, bool head, float* u, float* uparts, float* post, float* comb,
             float* h, cudaStream_t s) {
  if (T <= 0) return;
  const dim3 grid(mix_blocks(D), T);
  hc_mix_kernel<<<grid, kThreads, 0, s>>>(z, site, n, iters, hc_eps, xparts, sumsq_chunks(n * D), X, D, eps, head, u,
                                          uparts, post, comb);
  DSINFER_CUDA_CHECK(cudaGetLastError());
  hc_norm_kernel<<<grid, kThreads, 0, s>>>(u, uparts, mix_blocks(D), D, norm_w, eps, h);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void swiglu_rows(const float* gu, int64_t n, int64_t I, float limit, float* act, cudaStream_t s) {
  if (n <= 0) return;
  swiglu_rows_kernel<<<blocks_for(n * I), kThreads, 0, s>>>(gu, n, I, limit, act);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

void argmax_rows(const float* logits, int n, int V, int32_t* ids, cudaStream_t s) {
  if (n <= 0) return;
  argmax_rows_kernel<<<n, kThreads, 0, s>>>(logits, V, ids);
  DSINFER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsinfer::cuda::v4
