// dsinfer CUDA backend: the invariant GEMM on tensor cores (GemvShape::mma; a model's default
// since session 20, --cuda-gemm rows for the row kernel; see cuda_gemm.h).
//
// Why: the CUDA-core row kernel streams the weights at batch 1 but a verify block of 8 rows of
// the 4B shape costs 2.7 decode steps (PERFORMANCE.md, session 19): per 8 weights it unpacks
// and multiplies once per row. mma.sync m16n8k16 (BF16 in, F32 accumulate) does 16 rows x 8
// features x 16 k per instruction, so up to 16 rows cost about what one row costs.
//
// Data flow: a block (4 warps) stages up to kMaxRows rows of A as BF16 in shared memory (the
// RMSNorm / SwiGLU input transform; the sums of squares strided over the whole block, all
// rows at once), then walks 8-feature tiles of W, one tile at a time, the tile's K split over
// the 4 warps (warp w takes chunks [w C / 4, (w + 1) C / 4) of the C = K / 64 chunks): a
// 2560-wide output is then 1280 warps of work, not 320. Per 64-wide chunk, thread
// (g = lane / 4, t = lane % 4) loads weights 8t..8t+7 and 32+8t..32+8t+7 of feature n0 + g
// (two 16-byte __ldg; each load instruction of the warp reads whole 32-byte sectors, where 16
// consecutive weights per thread read each sector twice, half at a time) and the same 16
// positions of A rows g and g + 8 from shared memory, and feeds them to 4 mma instructions.
// The k order is permuted identically for A and W (mma j's logical k 2t, 2t + 1 / 2t + 8,
// 2t + 9 are the pairs 2j / 2j + 1 of the thread's 16 values, pair()), so the sum is the same
// dot product. Warp 0 adds the other warps' partial tiles in warp order (double-buffered in
// shared memory) and runs the epilogue. A launch of one row (a decode step) runs an instance
// built for one row (96 registers against 108-128: 5 blocks per SM; staging loads batched).
// The row kernel's L2 evict-first weight loads cost this kernel 3 % of 4B decode (359.0
// against 369.6 tokens/s, session 20), so it reads with plain __ldg.
//
// Batch invariance: a row's output is the same chain of mma instructions (the split, chunk
// order, j order and warp order are functions of K only) whatever the row count, its row
// group or its place in the 16-row fragment, given that the tensor core reduces every (row,
// column) of a tile the same way; the test checks rows 1-40 against each other bit for bit.
// Rows of the fragment past the block's rows are zeros. The decode row takes this path too
// when the switch is on, so greedy speculation stays equal to plain greedy decoding.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_gemm_mma.h"
#include "backend/cuda/cuda_gemv_impl.cuh"

namespace dsinfer::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxRows = 16;    // one m16 fragment of rows per block
constexpr int kChunk = 64;      // k per chunk: 4 mma k-steps
constexpr int kBatch = 4;       // chunks per load batch (256 weights per feature in flight per warp)
constexpr int kStageUnroll = 4;  // one-row instance: float4 loads per thread in flight for the sum of squares
constexpr int kStageItems = 2;  // 8-element items of A per thread in flight while staging
constexpr int kPad = 8;         // BF16 of padding per staged row: rows g and g + 1 fall in other banks

using detail::argmax_key;
using detail::load8_pair;
using detail::add_squares;
using detail::silu_mul;
using detail::stage8;

constexpr int kEpiY = 0, kEpiSilu = 1;

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// The pair p (0-7) of a thread's two 16-byte loads: two consecutive BF16 as one 32-bit register.
__device__ __forceinline__ uint32_t pair(const uint4& lo, const uint4& hi, int p) {
  const uint4& v = p < 4 ? lo : hi;
  switch (p & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
  }
}

// kOne: the instance for one row (a decode step): the same arithmetic per row, its sum of
// squares' loads issued kStageUnroll at a time, fewer registers (row g + 8 never exists).
template <int kMode, int kEpi, bool kOne>
__global__ void __launch_bounds__(kThreads)
    gemm_mma_kernel(GemmInput in, const bf16* __restrict__ W, int N, int K, float* __restrict__ Y, int64_t ldy, int M,
                    int rows_per_block, int accumulate, unsigned long long* __restrict__ argmax_keys,
                    bf16* __restrict__ silu_out, int64_t ld_silu, L2Prefetch next) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* As = reinterpret_cast<bf16*>(smem_raw);  // [mr][K + kPad]: padded rows, no bank conflicts
  const int lda = K + kPad;
  __shared__ float inv_s[kMaxRows];
  __shared__ float ss_s[kWarps][kMaxRows];
  __shared__ unsigned long long best_s[kMaxRows];
  __shared__ float4 part_s[2][kWarps - 1][32];  // the other warps' partial tiles, by tile parity
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * rows_per_block;
  const int mr = min(rows_per_block, M - m0);
  const int tiles = (N + 7) / 8, chunks = K / kChunk;
  const int c_begin = warp * chunks / kWarps, c_end = (warp + 1) * chunks / kWarps;

  // Chunks c0 .. c0 + kBatch - 1 (those before c_end) of this warp's share of a tile.
  auto load_w = [&](uint4 (&w)[kBatch][2], int tile, int c0) {
    if (tile >= tiles) return;
    const int n = min(tile * 8 + g, N - 1);
    const uint4* row = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(n) * K);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (c0 + b < c_end) {
        const int off = (c0 + b) * (kChunk / 8) + t;  // in 16-byte units: k 8t..8t+7, 32+8t..32+8t+7
        w[b][0] = __ldg(row + off);
        w[b][1] = __ldg(row + off + 4);
      }
  };
  // First weight batch before the PDL wait (weights are constant).
  uint4 wv[kBatch][2];
  int tile = blockIdx.x;
  load_w(wv, tile, c_begin);
  pdl_wait();

  // ---- stage A: inverse RMS per row (every thread strides all rows' float4 groups, an xor
  // tree per warp, the warps' sums in order), then the rows as BF16 ------------------------
  if (threadIdx.x < kMaxRows) best_s[threadIdx.x] = 0ull;
  if constexpr (kMode == GemmInput::RmsNorm && kOne) {
    const int src = in.row_index ? in.row_index[m0] : m0;
    const float4* x4 = reinterpret_cast<const float4*>(static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx);
    const int n4 = K / 4;
    float v = 0.0f;
    for (int c0 = threadIdx.x; c0 < n4; c0 += kThreads * kStageUnroll) {  // the order of the loop below
      float4 x[kStageUnroll];
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u)
        if (c0 + u * kThreads < n4) x[u] = x4[c0 + u * kThreads];
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u)
        if (c0 + u * kThreads < n4) v = add_squares(x[u], v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) ss_s[warp][0] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = ss_s[0][0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) t += ss_s[w][0];
      inv_s[0] = 1.0f / sqrtf(t / static_cast<float>(K) + in.eps);
    }
    __syncthreads();
  } else if constexpr (kMode == GemmInput::RmsNorm) {
    float ss[kMaxRows];
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) ss[r] = 0.0f;
    // The rows' addresses through shared memory: 16 pointers in registers would cost occupancy.
    __shared__ const float4* x4_s[kMaxRows];
    if (threadIdx.x < mr) {
      const int src = in.row_index ? in.row_index[m0 + threadIdx.x] : m0 + threadIdx.x;
      x4_s[threadIdx.x] = reinterpret_cast<const float4*>(static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx);
    }
    __syncthreads();
#pragma unroll 1
    for (int c = threadIdx.x; c < K / 4; c += kThreads) {
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r)
        if (r < mr) ss[r] = add_squares(x4_s[r][c], ss[r]);
    }
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r >= mr) break;
      float v = ss[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) ss_s[warp][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < mr) {
      float v = ss_s[0][threadIdx.x];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) v += ss_s[w][threadIdx.x];
      inv_s[threadIdx.x] = 1.0f / sqrtf(v / static_cast<float>(K) + in.eps);
    }
    __syncthreads();
  }
  // Staging, kStageItems 16-byte items per thread in flight (loads first, then the stores):
  // one round trip to the L2 per kStageItems * kThreads items. Elementwise: the same values
  // whatever the batching.
  const int n8 = K / 8, n_items = mr * n8;
  if constexpr (kOne && kMode != GemmInput::Bf16) {
    // One row: its addresses and scale hoisted out of the loop (96 registers, not 108).
    const int src = (kMode == GemmInput::RmsNorm && in.row_index) ? in.row_index[m0] : m0;
    const float4* x4 = reinterpret_cast<const float4*>(static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx);
    const float4* y4 = kMode == GemmInput::RmsNorm ? reinterpret_cast<const float4*>(in.norm_w) : x4 + K / 4;
    const float inv = kMode == GemmInput::RmsNorm ? inv_s[0] : 1.0f;
    for (int c0 = threadIdx.x; c0 < n8; c0 += kThreads * kStageItems) {
      float4 x[kStageItems][2], y[kStageItems][2];
#pragma unroll
      for (int u = 0; u < kStageItems; ++u) {
        const int c = c0 + u * kThreads;
        if (c < n8) load8_pair(x4, y4, c, x[u], y[u]);
      }
#pragma unroll
      for (int u = 0; u < kStageItems; ++u) {
        const int c = c0 + u * kThreads;
        if (c < n8) reinterpret_cast<uint4*>(As)[c] = stage8<kMode == GemmInput::RmsNorm>(x[u], y[u], inv);
      }
    }
  } else
  for (int i0 = threadIdx.x; i0 < n_items; i0 += kThreads * kStageItems) {
    float4 x[kStageItems][2], y[kStageItems][2];
    uint4 raw[kStageItems];
#pragma unroll
    for (int u = 0; u < kStageItems; ++u) {
      const int item = i0 + u * kThreads;
      if (item >= n_items) break;
      const int r = kOne ? 0 : item / n8, c = kOne ? item : item % n8;
      const int src = (kMode == GemmInput::RmsNorm && in.row_index) ? in.row_index[m0 + r] : m0 + r;
      if constexpr (kMode == GemmInput::Bf16) {
        raw[u] = reinterpret_cast<const uint4*>(static_cast<const bf16*>(in.x) + static_cast<int64_t>(src) * in.ldx)[c];
      } else {
        const float4* x4 = reinterpret_cast<const float4*>(static_cast<const float*>(in.x) + static_cast<int64_t>(src) * in.ldx);
        const float4* y4 = kMode == GemmInput::RmsNorm ? reinterpret_cast<const float4*>(in.norm_w) : x4 + K / 4;
        load8_pair(x4, y4, c, x[u], y[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kStageItems; ++u) {
      const int item = i0 + u * kThreads;
      if (item >= n_items) break;
      const int r = kOne ? 0 : item / n8, c = kOne ? item : item % n8;
      uint4 out;
      if constexpr (kMode == GemmInput::Bf16) out = raw[u];
      else out = stage8<kMode == GemmInput::RmsNorm>(x[u], y[u], kMode == GemmInput::RmsNorm ? inv_s[r] : 1.0f);
      reinterpret_cast<uint4*>(As + static_cast<int64_t>(r) * lda)[c] = out;
    }
  }
  __syncthreads();

  // ---- tiles of 8 features, K split over the warps -------------------------------------
  const bool row_lo = kOne ? g == 0 : g < mr, row_hi = kOne ? false : g + 8 < mr;
  const uint4* a_lo = reinterpret_cast<const uint4*>(As + static_cast<int64_t>(row_lo ? g : 0) * lda);
  const uint4* a_hi = reinterpret_cast<const uint4*>(As + static_cast<int64_t>(row_hi ? g + 8 : 0) * lda);
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  unsigned long long best_lo = 0ull, best_hi = 0ull;
  for (int parity = 0; tile < tiles; tile += gridDim.x, parity ^= 1) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = c_begin; c0 < c_end; c0 += kBatch) {
      uint4 nx[kBatch][2];
      if (c0 + kBatch < c_end) load_w(nx, tile, c0 + kBatch);
      else load_w(nx, tile + gridDim.x, c_begin);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (c0 + b >= c_end) break;
        const int off = (c0 + b) * (kChunk / 8) + t;
        const uint4 al0 = row_lo ? a_lo[off] : zero, al1 = row_lo ? a_lo[off + 4] : zero;
        const uint4 ah0 = row_hi ? a_hi[off] : zero, ah1 = row_hi ? a_hi[off + 4] : zero;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma_bf16(acc, pair(al0, al1, 2 * j), pair(ah0, ah1, 2 * j), pair(al0, al1, 2 * j + 1), pair(ah0, ah1, 2 * j + 1),
                   pair(wv[b][0], wv[b][1], 2 * j), pair(wv[b][0], wv[b][1], 2 * j + 1));
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        wv[b][0] = nx[b][0];
        wv[b][1] = nx[b][1];
      }
    }
    // The K split's partial tiles: warps 1.. hand theirs to warp 0, which adds them in order.
    // Double-buffered by tile parity: a buffer is written again two tiles on, after warp 0
    // has passed the next tile's barrier, so one barrier per tile suffices.
    if (warp > 0) part_s[parity][warp - 1][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp != 0) continue;
#pragma unroll
    for (int w = 0; w < kWarps - 1; ++w) {
      const float4 p = part_s[parity][w][lane];
      acc[0] += p.x;
      acc[1] += p.y;
      acc[2] += p.z;
      acc[3] += p.w;
    }
    // acc: rows g (0, 1) and g + 8 (2, 3), features tile * 8 + 2t, + 1.
    const int n = tile * 8 + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      if (r >= mr) continue;
      const float v0 = acc[2 * h], v1 = acc[2 * h + 1];
      if constexpr (kEpi == kEpiSilu) {
        // (gate_i, up_i) are features (2i, 2i + 1): this thread holds both (N even).
        if (n < N) silu_out[static_cast<int64_t>(m0 + r) * ld_silu + n / 2] = __float2bfloat16(silu_mul(v0, v1));
      } else {
        unsigned long long& best = h ? best_hi : best_lo;
#pragma unroll
        for (int o = 0; o < 2; ++o) {
          if (n + o >= N) break;
          float* y = Y + static_cast<int64_t>(m0 + r) * ldy + n + o;
          const float out = accumulate ? *y + (o ? v1 : v0) : (o ? v1 : v0);
          *y = out;
          if (argmax_keys) {
            const unsigned long long key = argmax_key(out, n + o);
            best = key > best ? key : best;
          }
        }
      }
    }
  }
  // This block's weights are all requested: its share of the next GEMM's first weights goes
  // to the L2 now (as the row kernel does), then the next kernel may be scheduled.
  if (blockIdx.y == 0) l2_prefetch_part(next, blockIdx.x, gridDim.x);
  pdl_trigger();
  if (argmax_keys) {  // max is order-free: shared atomics, then one global atomic per row
    if (warp == 0 && row_lo && best_lo) atomicMax(&best_s[g], best_lo);
    if (warp == 0 && row_hi && best_hi) atomicMax(&best_s[g + 8], best_hi);
    __syncthreads();
    if (threadIdx.x < mr && best_s[threadIdx.x]) atomicMax(argmax_keys + m0 + threadIdx.x, best_s[threadIdx.x]);
  }
}

template <int kMode, int kEpi, bool kOne>
void launch_one(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
            unsigned long long* keys, bf16* silu_out, int64_t ld_silu, L2Prefetch next, cudaStream_t stream) {
  auto kernel = gemm_mma_kernel<kMode, kEpi, kOne>;
  thread_local int optin = 0, sms = 0;
  if (optin == 0) {
    int dev = 0;
    DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  // Rows per block: up to 16, as many as the shared memory holds (K = 9728 takes 11).
  const size_t row_bytes = static_cast<size_t>(K + kPad) * sizeof(bf16);
  const int fit = static_cast<int>((static_cast<size_t>(optin) - 1024) / row_bytes);
  if (fit < 1) throw Error("CUDA MMA GEMM: K = " + std::to_string(K) + " does not fit one row in shared memory");
  const int rows = std::min({kMaxRows, fit, M});
  const int row_groups = (M + rows - 1) / rows;
  const size_t smem = static_cast<size_t>(rows) * row_bytes;
  raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  int per_sm = 0;
  DSINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  per_sm = std::max(per_sm, 1);
  // One resident wave per row group, each block walking an equal share of the 8-feature tiles.
  const int tiles = (N + 7) / 8;
  const int cap = std::max(1, per_sm * sms / std::max(1, std::min(row_groups, per_sm * sms)));
  const int per_block = (tiles + cap - 1) / cap;
  const dim3 grid((tiles + per_block - 1) / per_block, row_groups);
  launch_pdl(PdlSite::Gemv, kernel, grid, dim3(kThreads), smem, stream, in, W, N, K, Y, ldy, M, rows, accumulate ? 1 : 0,
             keys, silu_out, ld_silu, next);
  DSINFER_CUDA_LAUNCHED("gemm_mma_kernel");
}

template <int kMode, int kEpi>
void launch(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
            unsigned long long* keys, bf16* silu_out, int64_t ld_silu, L2Prefetch next, cudaStream_t stream) {
  if (M == 1) launch_one<kMode, kEpi, true>(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
  else launch_one<kMode, kEpi, false>(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
}

}  // namespace

bool gemm_mma_supported(const GemmInput& in, const bf16* W, int K) {
  const int elems16 = in.kind == GemmInput::Bf16 ? 8 : 4;
  bool ok = K % kChunk == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0 && in.ldx % elems16 == 0 &&
            reinterpret_cast<uintptr_t>(in.x) % 16 == 0;
  if (in.kind == GemmInput::RmsNorm) ok = ok && reinterpret_cast<uintptr_t>(in.norm_w) % 16 == 0;
  return ok;
}

void gemm_mma(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
              unsigned long long* keys, bf16* silu_out, int64_t ld_silu, L2Prefetch next, cudaStream_t stream) {
  const bool silu = silu_out != nullptr;
  switch (in.kind) {
    case GemmInput::Bf16:
      if (silu) launch<GemmInput::Bf16, kEpiSilu>(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
      else launch<GemmInput::Bf16, kEpiY>(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
      break;
    case GemmInput::RmsNorm:
      if (silu) launch<GemmInput::RmsNorm, kEpiSilu>(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
      else launch<GemmInput::RmsNorm, kEpiY>(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
      break;
    case GemmInput::SiluMul:
      if (silu) throw Error("CUDA GEMM: the SwiGLU epilogue takes BF16 or RMSNorm rows");
      launch<GemmInput::SiluMul, kEpiY>(in, W, N, K, Y, ldy, M, accumulate, keys, silu_out, ld_silu, next, stream);
      break;
  }
}

}  // namespace dsinfer::cuda
