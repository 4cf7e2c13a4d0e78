// dsinfer CUDA backend: the GEMM dispatch and the fixed-order row kernel (see cuda_gemm.h).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemv_impl.cuh"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_gemm_mma.h"

namespace dsinfer::cuda {

namespace {

// Block shape: gemv_shape().warps warps (4 or 8, blockDim.x / 32); each warp owns 2 output
// features (the A chunk it loads is reused for both weight rows), so a block owns 2 x warps
// features; a block stages up to 4 rows of A. The RMSNorm's sum of squares always runs on
// the first kNormThreads threads, so no bit depends on the block shape.
//
// Rows of A per block (kRowsPerBlock, 1 or 4): one row (a decode step) runs an instance
// built for one row, with fewer registers and no per-row loops over absent rows; it measured
// 373 against 346 tokens/s on the H200 (docs/PERFORMANCE.md, session 12). So do verify blocks
// of up to kOneRowMaxM rows of a matrix small enough to stay in the L2
// (GemvShape::one_row_max_bytes), one row group per row: the latency chain of a small model's
// forward is then the decode step's (session 19). Blocks of 8 or 16
// rows (each weight read once per 8 or 16 rows) measured slower for verify blocks and
// prompts than 4-row blocks, whose row groups run at once and share the weights in the L2.
// A row's dot products keep the same lane order and FMA chain in either instance: no bit
// depends on the row count per block (tests check it).
constexpr int kMaxWarps = 8;
constexpr int kMaxThreads = 32 * kMaxWarps;
using detail::kNormThreads;
constexpr int kNormWarps = kNormThreads / 32;
constexpr int kOutPerWarp = 2;
constexpr int kUnroll = 4;  // chunks per lane per batch: kUnroll * kOutPerWarp 16-byte weight loads
constexpr int kStageUnroll = 4;  // 16-byte loads in flight per thread while staging A
constexpr int kOneRowMaxM = 16;  // GemvShape::one_row_max_bytes applies up to this many rows

using detail::argmax_key;
using detail::dot8;
using detail::load8_pair;
using detail::add_squares;
using detail::evict_first_policy;
using detail::load_weight;
using detail::silu_mul;
using detail::stage8;
using detail::unpack8;

constexpr int kEpiY = 0, kEpiSilu = 1;

// Kernel flags (the launch's GemvShape): the interleaved pair order, and weight loads that
// pass the L2 with the evict-first policy.
constexpr int kFlagInterleave = 1, kFlagEvictFirst = 2;
constexpr int kFlatUnroll = 2;  // multi-row blocks: float4 loads per row in flight for the sum of squares

// One batch of this warp's weight loads: chunks c0, c0 + 32, ... (kUnroll of them) of its
// kOutPerWarp feature rows starting at n0 (rows past N clamp to N - 1; their sums are dropped).
__device__ __forceinline__ void load_batch(uint4 (&wv)[kUnroll][kOutPerWarp], const bf16* __restrict__ W, int N,
                                           int K, int n0, int c0, bool evict_first, unsigned long long policy) {
  if (n0 >= N) return;
  const int chunks = K / 8;
#pragma unroll
  for (int o = 0; o < kOutPerWarp; ++o) {
    const uint4* w4 = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(min(n0 + o, N - 1)) * K);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * 32 < chunks) wv[u][o] = load_weight(w4 + c0 + u * 32, evict_first, policy);
  }
}

// kVec: K % 8 == 0 and W 16-byte aligned (the 16-byte path); else the same lane-strided,
// in-order accumulation over single elements. kEpi: kEpiY writes Y; kEpiSilu: the feature
// pairs (2i, 2i + 1) are (gate_i, up_i) and the epilogue writes silu_out[m, i] =
// bf16(silu(gate) * up) instead of Y.
//
// A block stages its rows of A once; then each warp walks its own feature pairs j = base,
// base + S, base + 2S, ... (S = gridDim.x * warps; features 2j, 2j + 1). Grouped (base =
// blockIdx.x * warps + warp): a block takes whole groups of adjacent pairs. Interleaved
// (base = warp * gridDim.x + blockIdx.x): the grid is every resident slot and a block's pairs
// are spread, so that blocks, and so SMs, get shares within one pair of each other when the
// pairs are few (N = 2560 over 132 SMs). Which warp computes a feature changes no bit. The
// grid is sized so every block is resident: one wave. The
// weights are constant, so each warp issues its first batch of weight loads before the PDL
// wait and the A staging, and from then on always has the next batch (the next chunks, or
// the first chunks of its next group) in flight while it computes the current one.
template <int kMode, bool kVec, int kEpi, int kRowsPerBlock>
__global__ void __launch_bounds__(kMaxThreads)
    gemm_rows_kernel(GemmInput in, const bf16* __restrict__ W, int N, int K, float* __restrict__ Y, int64_t ldy, int M,
                     int accumulate, unsigned long long* __restrict__ argmax_keys, bf16* __restrict__ silu_out,
                     int64_t ld_silu, L2Prefetch next, int flags) {
  constexpr bool kSilu = kEpi == kEpiSilu;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* As = reinterpret_cast<bf16*>(smem_raw);  // [mr][Kp]: this block's rows of A, BF16
  __shared__ float red[kRowsPerBlock][kNormWarps];
  __shared__ unsigned long long best_w[kMaxWarps][kRowsPerBlock];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nthreads = blockDim.x, nwarps = nthreads >> 5, out_per_block = nwarps * kOutPerWarp;
  const int m0 = blockIdx.y * kRowsPerBlock;
  const int mr = min(kRowsPerBlock, M - m0);
  const int Kp = (K + 7) & ~7;
  const int pair_base = (flags & kFlagInterleave) ? warp * gridDim.x + blockIdx.x : blockIdx.x * nwarps + warp;
  const bool evict_first = (flags & kFlagEvictFirst) != 0;
  const unsigned long long policy = evict_first ? evict_first_policy() : 0ull;
  const int n_step = gridDim.x * out_per_block;  // features between a warp's pairs

  uint4 wv[kUnroll][kOutPerWarp];
  if constexpr (kVec) load_batch(wv, W, N, K, pair_base * kOutPerWarp, lane, evict_first, policy);
  pdl_wait();

  // ---- stage A: the input transform once per block, rounded to BF16 -------------------
  float inv[kRowsPerBlock];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) inv[r] = 1.0f;
  if constexpr (kMode == GemmInput::RmsNorm) {
    // 1 / rms of each row in a fixed order: sums strided over the first kNormThreads
    // threads (float4 groups in order when vectorised), a warp xor tree, those warps in
    // order. Depends on the row alone (not on the block shape).
    if constexpr (kVec && kRowsPerBlock > 1) {
      // Every row's loads in flight at once (kFlatUnroll per row), each row's sum in the
      // same element order as the one-row loop below: the same bits, one round trip to the
      // L2 per batch rather than per row. (Rows one after another: a verify block of the
      // embedded target took 0.304 against 0.263 ms at 8 rows; docs/PERFORMANCE.md, session 19.)
      float ss[kRowsPerBlock];
      const float4* x4r[kRowsPerBlock];
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) {
        ss[r] = 0.0f;
        const int src = r < mr ? (in.row_index ? in.row_index[m0 + r] : m0 + r) : 0;
        x4r[r] = reinterpret_cast<const float4*>(static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx);
      }
      if (warp < kNormWarps) {
        const int n4 = K / 4;
        for (int c0 = threadIdx.x; c0 < n4; c0 += kNormThreads * kFlatUnroll) {
          float4 v[kRowsPerBlock][kFlatUnroll];
#pragma unroll
          for (int r = 0; r < kRowsPerBlock; ++r)
#pragma unroll
            for (int u = 0; u < kFlatUnroll; ++u)
              if (r < mr && c0 + u * kNormThreads < n4) v[r][u] = x4r[r][c0 + u * kNormThreads];
#pragma unroll
          for (int r = 0; r < kRowsPerBlock; ++r)
#pragma unroll
            for (int u = 0; u < kFlatUnroll; ++u)
              if (r < mr && c0 + u * kNormThreads < n4) {
                ss[r] = add_squares(v[r][u], ss[r]);
              }
        }
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], o);
          if (lane == 0) red[r][warp] = ss[r];
        }
      }
    } else
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      if (warp >= kNormWarps) break;
      float ss = 0.0f;
      if (r < mr) {
        const int src = in.row_index ? in.row_index[m0 + r] : m0 + r;
        const float* x = static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx;
        if constexpr (kVec) {
          const float4* x4 = reinterpret_cast<const float4*>(x);
          const int n4 = K / 4;
          for (int c0 = threadIdx.x; c0 < n4; c0 += kNormThreads * kStageUnroll) {
            float4 v[kStageUnroll];
#pragma unroll
            for (int u = 0; u < kStageUnroll; ++u)
              if (c0 + u * kNormThreads < n4) v[u] = x4[c0 + u * kNormThreads];
#pragma unroll
            for (int u = 0; u < kStageUnroll; ++u)
              if (c0 + u * kNormThreads < n4) {
                ss = add_squares(v[u], ss);
              }
          }
        } else {
          for (int i = threadIdx.x; i < K; i += kNormThreads) ss = fmaf(x[i], x[i], ss);
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) red[r][warp] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      float ss = 0.0f;
      for (int w = 0; w < kNormWarps; ++w) ss += red[r][w];
      inv[r] = 1.0f / sqrtf(ss / static_cast<float>(K) + in.eps);
    }
  }
  if constexpr (kVec && kRowsPerBlock > 1) {
    // Every row's chunk c loaded at once, then transformed and stored (elementwise: the
    // same values as the per-row loop below).
    const int n8 = K / 8;
    const char* xr[kRowsPerBlock];
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      const int src = r < mr ? ((kMode == GemmInput::RmsNorm && in.row_index) ? in.row_index[m0 + r] : m0 + r) : 0;
      xr[r] = static_cast<const char*>(in.x) +
              static_cast<int64_t>(src) * in.ldx * (kMode == GemmInput::Bf16 ? sizeof(bf16) : sizeof(float));
    }
    for (int c = threadIdx.x; c < n8; c += nthreads) {
      if constexpr (kMode == GemmInput::Bf16) {
        uint4 v[kRowsPerBlock];
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r)
          if (r < mr) v[r] = reinterpret_cast<const uint4*>(xr[r])[c];
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r)
          if (r < mr) reinterpret_cast<uint4*>(As + r * Kp)[c] = v[r];
      } else {
        float4 a[kRowsPerBlock][2], b[kRowsPerBlock][2];
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r) {
          if (r >= mr) break;
          const float4* x4 = reinterpret_cast<const float4*>(xr[r]);
          a[r][0] = x4[2 * c];
          a[r][1] = x4[2 * c + 1];
          if (kMode == GemmInput::SiluMul || r == 0) {
            const float4* y4 = kMode == GemmInput::RmsNorm ? reinterpret_cast<const float4*>(in.norm_w) : x4 + K / 4;
            b[r][0] = __ldg(y4 + 2 * c);
            b[r][1] = __ldg(y4 + 2 * c + 1);
          }
        }
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r) {
          if (r >= mr) break;
          reinterpret_cast<uint4*>(As + r * Kp)[c] = stage8<kMode == GemmInput::RmsNorm>(a[r], b[kMode == GemmInput::RmsNorm ? 0 : r], inv[r]);
        }
      }
    }
  } else
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
    if (r >= mr) break;
    bf16* dst = As + r * Kp;
    const int src = (kMode == GemmInput::RmsNorm && in.row_index) ? in.row_index[m0 + r] : m0 + r;
    if constexpr (kVec) {
      // 8 elements per step: one 16-byte store of BF16.
      const int n8 = K / 8;
      for (int c0 = threadIdx.x; c0 < n8; c0 += nthreads * kStageUnroll) {
        if constexpr (kMode == GemmInput::Bf16) {
          const uint4* x8 = reinterpret_cast<const uint4*>(static_cast<const bf16*>(in.x) + static_cast<int64_t>(src) * in.ldx);
          uint4 v[kStageUnroll];
#pragma unroll
          for (int u = 0; u < kStageUnroll; ++u)
            if (c0 + u * nthreads < n8) v[u] = x8[c0 + u * nthreads];
#pragma unroll
          for (int u = 0; u < kStageUnroll; ++u)
            if (c0 + u * nthreads < n8) reinterpret_cast<uint4*>(dst)[c0 + u * nthreads] = v[u];
        } else {
          const float4* x4 = reinterpret_cast<const float4*>(static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx);
          // RmsNorm: (x, norm weight) pairs; SiluMul: (gate, up) pairs (up starts K floats on).
          const float4* y4 = kMode == GemmInput::RmsNorm ? reinterpret_cast<const float4*>(in.norm_w) : x4 + K / 4;
          float4 a[kStageUnroll][2], b[kStageUnroll][2];
#pragma unroll
          for (int u = 0; u < kStageUnroll; ++u) {
            const int c = c0 + u * nthreads;
            if (c < n8) load8_pair(x4, y4, c, a[u], b[u]);
          }
#pragma unroll
          for (int u = 0; u < kStageUnroll; ++u) {
            const int c = c0 + u * nthreads;
            if (c < n8) reinterpret_cast<uint4*>(dst)[c] = stage8<kMode == GemmInput::RmsNorm>(a[u], b[u], inv[r]);
          }
        }
      }
    } else {
      if constexpr (kMode == GemmInput::Bf16) {
        const bf16* x = static_cast<const bf16*>(in.x) + static_cast<int64_t>(src) * in.ldx;
        for (int i = threadIdx.x; i < K; i += nthreads) dst[i] = x[i];
      } else if constexpr (kMode == GemmInput::RmsNorm) {
        const float* x = static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx;
        for (int i = threadIdx.x; i < K; i += nthreads) dst[i] = __float2bfloat16(in.norm_w[i] * (x[i] * inv[r]));
      } else {
        const float* g = static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx;
        for (int i = threadIdx.x; i < K; i += nthreads) dst[i] = __float2bfloat16(silu_mul(g[i], g[K + i]));
      }
      for (int i = K + threadIdx.x; i < Kp; i += nthreads) dst[i] = __float2bfloat16(0.0f);
    }
  }
  __syncthreads();

  // ---- dot products: warp -> features n0, n0 + 1; lane -> chunks lane, lane + 32, ... --
  unsigned long long best[kRowsPerBlock];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) best[r] = 0ull;
  for (int n0 = pair_base * kOutPerWarp;; n0 += n_step) {
    if (n0 >= N) break;  // (later pairs only go further past N)
    const int nw = min(kOutPerWarp, N - n0);
    float acc[kRowsPerBlock][kOutPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r)
#pragma unroll
      for (int o = 0; o < kOutPerWarp; ++o) acc[r][o] = 0.0f;
    if constexpr (kVec) {
      const int chunks = K / 8;
      for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
        // The next batch goes out before this one is used: the next chunks of this group,
        // or the first chunks of this warp's next group. (A second batch issued before the
        // A staging held more registers and measured 323 against 371 tokens/s on the H200:
        // docs/PERFORMANCE.md, session 12.)
        uint4 nx[kUnroll][kOutPerWarp];
        if (c0 + 32 * kUnroll < chunks) load_batch(nx, W, N, K, n0, c0 + 32 * kUnroll, evict_first, policy);
        else load_batch(nx, W, N, K, n0 + n_step, lane, evict_first, policy);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = c0 + u * 32;
          if (c < chunks) {
            float wf[kOutPerWarp][8];
#pragma unroll
            for (int o = 0; o < kOutPerWarp; ++o) unpack8(wv[u][o], wf[o]);
#pragma unroll
            for (int r = 0; r < kRowsPerBlock; ++r) {
              if (r < mr) {
                float a[8];
                unpack8(*reinterpret_cast<const uint4*>(As + r * Kp + c * 8), a);
#pragma unroll
                for (int o = 0; o < kOutPerWarp; ++o) acc[r][o] = dot8(a, wf[o], acc[r][o]);
              }
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int o = 0; o < kOutPerWarp; ++o) wv[u][o] = nx[u][o];
      }
    } else {
      for (int k = lane; k < K; k += 32) {
        float wk[kOutPerWarp];
#pragma unroll
        for (int o = 0; o < kOutPerWarp; ++o) wk[o] = __bfloat162float(W[static_cast<int64_t>(min(n0 + o, N - 1)) * K + k]);
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r)
          if (r < mr) {
            const float a = __bfloat162float(As[r * Kp + k]);
#pragma unroll
            for (int o = 0; o < kOutPerWarp; ++o) acc[r][o] = fmaf(a, wk[o], acc[r][o]);
          }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      float v[kOutPerWarp];
#pragma unroll
      for (int o = 0; o < kOutPerWarp; ++o) {
        v[o] = acc[r][o];
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) v[o] += __shfl_xor_sync(0xffffffffu, v[o], s);
      }
      if (lane == 0 && r < mr) {
        if constexpr (kSilu) {
          // nw == 2 (N even, checked at launch): (gate, up) of feature n0 / 2.
          silu_out[static_cast<int64_t>(m0 + r) * ld_silu + n0 / 2] = __float2bfloat16(silu_mul(v[0], v[1]));
        } else {
#pragma unroll
          for (int o = 0; o < kOutPerWarp; ++o)
            if (o < nw) {
              float* y = Y + static_cast<int64_t>(m0 + r) * ldy + n0 + o;
              const float out = accumulate ? *y + v[o] : v[o];
              *y = out;
              if (argmax_keys) {
                const unsigned long long key = argmax_key(out, n0 + o);
                best[r] = key > best[r] ? key : best[r];
              }
            }
        }
      }
    }
  }
  // This block's weights are all requested: its share of the next GEMM's first weights goes
  // to the L2 now, while slower blocks still stream (the DRAM would idle in this tail and in
  // the launch gap). One row group asks (at decode there is one).
  if (blockIdx.y == 0) l2_prefetch_part(next, blockIdx.x, gridDim.x);
  // The next kernel may be scheduled once every block got here (its blocks then take the SM
  // room ours free and start their weight loads). Not earlier: blocks of kernels two or three
  // launches on would take room this grid (sized to one resident wave) still needs.
  pdl_trigger();
  // Argmax: the block's best key per row, one atomicMax per (block, row) (max is order-free).
  if (argmax_keys) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) best_w[warp][r] = best[r];
    __syncthreads();
    if (threadIdx.x < mr) {
      unsigned long long b = 0ull;
      for (int w = 0; w < nwarps; ++w) b = best_w[w][threadIdx.x] > b ? best_w[w][threadIdx.x] : b;
      if (b) atomicMax(argmax_keys + m0 + threadIdx.x, b);
    }
  }
}

template <int kMode, bool kVec, int kEpi, int kRows>
void launch_one(int row_groups, size_t smem, const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy,
                int M, bool accumulate, unsigned long long* keys, bf16* silu_out, int64_t ld_silu, L2Prefetch next,
                cudaStream_t stream) {
  auto kernel = gemm_rows_kernel<kMode, kVec, kEpi, kRows>;
  const GemvShape shape = gemv_shape();
  const int threads = 32 * shape.warps;
  const int groups = (N + kOutPerWarp * shape.warps - 1) / (kOutPerWarp * shape.warps);
  // Per instance and thread (one device per process): the resident blocks per SM for each
  // (dynamic shared memory, block size) seen.
  thread_local int sms = 0;
  thread_local std::vector<std::pair<std::pair<size_t, int>, int>> occ;
  // Opted in for every new maximum, not only past 48 KB: the kernel's static shared memory
  // counts too (4 staged rows of K = 6144, Qwen3-1.7B's down projection, are exactly 48 KB
  // and failed to launch with "invalid argument" before).
  raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (sms == 0) {
    int dev = 0;
    DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  int per_sm = 0;
  for (const auto& [key, n] : occ)
    if (key.first == smem && key.second == threads) per_sm = n;
  if (per_sm == 0) {
    DSINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    per_sm = std::max(per_sm, 1);
    occ.push_back({{smem, threads}, per_sm});
  }
  if (shape.blocks_per_sm > 0) per_sm = std::min(per_sm, shape.blocks_per_sm);
  // One resident wave of blocks per row group, each walking the same number of feature
  // groups (balanced): a function of the shape, never of the data.
  const int cap = std::max(1, per_sm * sms / std::max(1, std::min(row_groups, per_sm * sms)));
  const int per_block = (groups + cap - 1) / cap;
  const int pairs = (N + kOutPerWarp - 1) / kOutPerWarp;
  const dim3 grid(shape.interleave ? std::min(cap, pairs) : (groups + per_block - 1) / per_block, row_groups);
  launch_pdl(PdlSite::Gemv, kernel, grid, dim3(threads), smem, stream, in, W, N, K, Y, ldy, M, accumulate ? 1 : 0, keys, silu_out,
             ld_silu, next, (shape.interleave ? kFlagInterleave : 0) | (shape.evict_first_weights ? kFlagEvictFirst : 0));
}

template <int kMode, int kEpi>
void launch(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
            unsigned long long* keys, bf16* silu_out, int64_t ld_silu, L2Prefetch next, cudaStream_t stream) {
  const size_t row_bytes = static_cast<size_t>((K + 7) & ~7) * sizeof(bf16);  // one staged row of A
  static int optin = 0;  // the device's opt-in shared memory per block (one device per process)
  if (optin == 0) {
    int dev = 0;
    DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  }
  // The tensor-core kernel when switched on (cuda_gemm_mma.cu, experimental), for every row
  // count of a matrix it supports, so that a row's bits never depend on the row count.
  const GemvShape shape = gemv_shape();
  if (shape.mma && gemm_mma_supported(in, W, K)) {
    gemm_mma(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
    return;
  }
  // The 16-byte paths: K a multiple of 8, and W, A's rows (and the norm weight) 16-byte aligned.
  const int elems16 = kMode == GemmInput::Bf16 ? 8 : 4;
  bool vec = K % 8 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0 && in.ldx % elems16 == 0 &&
             reinterpret_cast<uintptr_t>(in.x) % 16 == 0;
  if (kMode == GemmInput::RmsNorm) vec = vec && reinterpret_cast<uintptr_t>(in.norm_w) % 16 == 0;
  // Rows per block: 1 for one row (a decode step), else 4; also 1 for a small verify block
  // (up to kOneRowMaxM rows) of a matrix of at most one_row_max_bytes, which stays in the
  // L2, so that row groups re-reading it cost no DRAM traffic.
  const bool one_row = M == 1 || (M <= kOneRowMaxM && static_cast<uint64_t>(N) * K * sizeof(bf16) <= shape.one_row_max_bytes);
  const int rows = vec && one_row && shape.one_row_kernel ? 1 : 4;
  const int row_groups = (M + rows - 1) / rows;
  const size_t smem = static_cast<size_t>(std::min(M, rows)) * row_bytes;
  if (smem > static_cast<size_t>(optin))
    throw Error("CUDA GEMM: K = " + std::to_string(K) + " needs " + std::to_string(smem) +
                " bytes of shared memory per block, more than the device's " + std::to_string(optin));
  if (!vec) launch_one<kMode, false, kEpi, 4>(row_groups, smem, in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
  else if (rows == 1) launch_one<kMode, true, kEpi, 1>(row_groups, smem, in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
  else launch_one<kMode, true, kEpi, 4>(row_groups, smem, in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
  DSINFER_CUDA_LAUNCHED("gemm_rows_kernel");
}

GemvShape& shape_setting() {
  static GemvShape shape = [] {
    GemvShape g;
    auto read = [](const char* name, int lo, int hi, int def) {
      const char* e = std::getenv(name);
      if (!e) return def;
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);
      if (end == e || *end != '\0' || v < lo || v > hi)
        throw Error(std::string(name) + " must be a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "], not '" + e + "'");
      return static_cast<int>(v);
    };
    g.warps = read("DSINFER_CUDA_GEMV_WARPS", 4, kMaxWarps, g.warps);
    if (g.warps != 4 && g.warps != 8) throw Error("DSINFER_CUDA_GEMV_WARPS must be 4 or 8");
    g.blocks_per_sm = read("DSINFER_CUDA_GEMV_BLOCKS_PER_SM", 0, 32, g.blocks_per_sm);
    g.interleave = read("DSINFER_CUDA_GEMV_INTERLEAVE", 0, 1, g.interleave ? 1 : 0) == 1;
    g.one_row_kernel = read("DSINFER_CUDA_GEMV_ONE_ROW", 0, 1, g.one_row_kernel ? 1 : 0) == 1;
    g.evict_first_weights = read("DSINFER_CUDA_GEMV_EVICT_FIRST", 0, 1, g.evict_first_weights ? 1 : 0) == 1;
    g.one_row_max_bytes = static_cast<uint64_t>(read("DSINFER_CUDA_GEMV_ONE_ROW_MB", 0, 65536,
                                                     static_cast<int>(g.one_row_max_bytes >> 20))) << 20;
    return g;
  }();
  return shape;
}

}  // namespace

GemvShape gemv_shape() { return shape_setting(); }

void set_gemv_shape(GemvShape shape) {
  if (shape.warps != 4 && shape.warps != 8) throw Error("CUDA GEMM: a block has 4 or 8 warps, not " + std::to_string(shape.warps));
  if (shape.blocks_per_sm < 0) throw Error("CUDA GEMM: blocks per SM must be 0 (as many as fit) or more");
  shape_setting() = shape;
}

void gemm_rows(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
               cudaStream_t stream, unsigned long long* argmax_keys, L2Prefetch next) {
  if (M <= 0 || N <= 0) return;
  switch (in.kind) {
    case GemmInput::Bf16: launch<GemmInput::Bf16, kEpiY>(in, W, N, K, Y, ldy, M, accumulate, argmax_keys, nullptr, 0, next, stream); break;
    case GemmInput::RmsNorm: launch<GemmInput::RmsNorm, kEpiY>(in, W, N, K, Y, ldy, M, accumulate, argmax_keys, nullptr, 0, next, stream); break;
    case GemmInput::SiluMul: launch<GemmInput::SiluMul, kEpiY>(in, W, N, K, Y, ldy, M, accumulate, argmax_keys, nullptr, 0, next, stream); break;
  }
}

void gemm_rows_silu(const GemmInput& in, const bf16* W, int N, int K, bf16* act, int64_t ld_act, int M,
                    cudaStream_t stream, L2Prefetch next) {
  if (M <= 0 || N <= 0) return;
  if (N % 2 != 0) throw Error("CUDA GEMM: the SwiGLU epilogue needs (gate, up) feature pairs (N even), got N = " + std::to_string(N));
  switch (in.kind) {
    case GemmInput::Bf16: launch<GemmInput::Bf16, kEpiSilu>(in, W, N, K, nullptr, 0, M, false, nullptr, act, ld_act, next, stream); break;
    case GemmInput::RmsNorm: launch<GemmInput::RmsNorm, kEpiSilu>(in, W, N, K, nullptr, 0, M, false, nullptr, act, ld_act, next, stream); break;
    case GemmInput::SiluMul: throw Error("CUDA GEMM: the SwiGLU epilogue takes BF16 or RMSNorm rows");
  }
}

Gemm::Gemm(bool batch_invariant) : invariant_(batch_invariant) {
  if (invariant_) return;
  DSINFER_CUBLAS_CHECK(cublasCreate(&handle_));
  // A fixed workspace keeps cuBLAS from allocating inside a CUDA graph capture.
  const size_t ws = 32u << 20;
  DSINFER_CUDA_CHECK(cudaMalloc(&workspace_, ws));
  DSINFER_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, ws));
  DSINFER_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

void Gemm::run(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
               bf16* scratch, cudaStream_t stream, unsigned long long* argmax_keys, L2Prefetch next) {
  if (M <= 0 || N <= 0) return;
  if (invariant_) {
    gemm_rows(in, W, N, K, Y, ldy, M, accumulate, stream, argmax_keys, next);
    return;
  }
  // Materialise A as BF16 rows, then cuBLAS.
  const bf16* A = static_cast<const bf16*>(in.x);
  int64_t lda = in.ldx;
  if (in.kind != GemmInput::Bf16) {
    if (!scratch) throw Error("CUDA GEMM: the cuBLAS path needs a scratch buffer for a fused input");
    if (in.kind == GemmInput::RmsNorm) {
      rmsnorm_rows(static_cast<const float*>(in.x), in.ldx, in.row_index, M, K, in.norm_w, in.eps, scratch, K, stream);
    } else {
      if (in.ldx != 2 * static_cast<int64_t>(K)) throw Error("CUDA GEMM: SwiGLU input must be [rows, 2K]");
      silu_mul_rows(static_cast<const float*>(in.x), M, K, scratch, stream);
    }
    A = scratch;
    lda = K;
  }
  // Column-major view: Yᵀ [N, M] = (W as K×N col-major)ᵀ · (A as K×M col-major).
  DSINFER_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  DSINFER_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W, CUDA_R_16BF, K, A,
                                    CUDA_R_16BF, static_cast<int>(lda), &beta, Y, CUDA_R_32F, static_cast<int>(ldy),
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (argmax_keys) argmax_keys_rows(Y, ldy, M, N, argmax_keys, stream);
}

void Gemm::run_silu(const GemmInput& in, const bf16* W, int N, int K, bf16* act, int64_t ld_act, int M,
                    float* gu_scratch, bf16* scratch, cudaStream_t stream, L2Prefetch next) {
  if (M <= 0 || N <= 0) return;
  if (invariant_) {
    gemm_rows_silu(in, W, N, K, act, ld_act, M, stream, next);
    return;
  }
  if (!gu_scratch) throw Error("CUDA GEMM: the cuBLAS SwiGLU path needs an F32 scratch of M x N");
  run(in, W, N, K, gu_scratch, N, M, false, scratch, stream);
  silu_mul_pairs(gu_scratch, M, N / 2, act, ld_act, stream);
}

}  // namespace dsinfer::cuda
