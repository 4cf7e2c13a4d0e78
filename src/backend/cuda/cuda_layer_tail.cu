// dsinfer CUDA backend: the fused layer tail for one-row forwards (see cuda_layer_tail.h for
// what it computes, why, and why its bits are the row GEMM kernel's).
//
// Data flow per phase (o, gate/up, down, then the next layer's QKV when asked):
//   every block stages the phase's input row in shared memory as BF16 (the RMSNorm or a copy),
//   each warp walks its feature pairs (its first batch of weights already in flight), the
//   epilogue writes its outputs (x += for o and down, SwiGLU to act, qkv), the warp issues its
//   first weight batch of the next phase, and the grid meets at a barrier.
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemv_impl.cuh"
#include "backend/cuda/cuda_layer_tail.h"

namespace dsinfer::cuda {

namespace {

// A block has LayerTailArgs::warps warps (4 to 16); the RMSNorm's sum of squares always runs
// on its first kNormThreads threads (4 warps), in the row kernel's order.
constexpr int kMaxThreads = 512;
constexpr int kNormWarps = detail::kNormThreads / 32;
constexpr int kOutPerWarp = 2;         // a feature pair per warp, as the row kernel
constexpr int kUnroll = 4;             // 16-byte chunks per lane per batch, as the row kernel

using detail::add_squares;
using detail::load_weight;
using detail::silu_mul;
using detail::stage8;
using detail::unpack8;

enum Input { kBf16Row, kRmsNormRow };
enum Epilogue { kAccumulate, kSilu, kStore };

// A phase: N outputs (features) from K inputs through W [N, K]; pair j (features 2j, 2j + 1)
// belongs to warp j % warps_used, warps_used the fewest warps that keep the busiest warp's
// pair count (so the pairs spread evenly). Computed where used, from the kernel's constant
// parameters, so that no phase's description holds registers through the others.
struct Phase {
  const bf16* W;
  int N, K, warps_used;
};

__device__ __forceinline__ Phase make_phase(const bf16* W, int N, int K) {
  const int total_warps = static_cast<int>(gridDim.x * (blockDim.x >> 5));
  const int pairs = N / kOutPerWarp;
  const int per = (pairs + total_warps - 1) / total_warps;  // pairs of the busiest warp
  return Phase{W, N, K, (pairs + per - 1) / per};
}

// This warp's first batch of a phase: chunks lane, lane + 32, ... of its first pair's rows
// (the row kernel's load_batch).
__device__ __forceinline__ void first_batch(uint4 (&wv)[kUnroll][kOutPerWarp], Phase ph, int wid, int lane, bool ef,
                                            unsigned long long policy) {
  // Defined on every path: otherwise the last phase's values would flow into this one (as
  // far as the compiler can tell) and hold their registers through the barrier.
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int o = 0; o < kOutPerWarp; ++o) wv[u][o] = make_uint4(0, 0, 0, 0);
  if (wid >= ph.warps_used) return;
  const int n0 = wid * kOutPerWarp, chunks = ph.K / 8;
#pragma unroll
  for (int o = 0; o < kOutPerWarp; ++o) {
    const uint4* w4 = reinterpret_cast<const uint4*>(ph.W + static_cast<int64_t>(n0 + o) * ph.K);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (lane + u * 32 < chunks) wv[u][o] = load_weight(w4 + lane + u * 32, ef, policy);
  }
}

// v, hidden from the optimiser: what a phase derives from it is computed in that phase, not
// hoisted to the kernel's start and held in registers through the phases before (98 against
// 120 registers for the whole kernel).
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

// Every thread of every block arrives, then every thread goes on; writes before are visible
// after (release / acquire at the GPU scope). A block that waits more than a second traps:
// some block never became resident (a CUDA error, not a hang).
__device__ void grid_barrier(unsigned* ctr, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(ctr, 1u);
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (unsigned i = 1;; ++i) {
      unsigned v;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
      if (v >= target) break;
      if ((i & 1023u) == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > 1000000000ull) __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// The phase's input row as BF16 in As: the row kernel's one-row staging, reading through the
// L2 (the row may have been written by another block of this kernel).
// kStageUnroll: loads in flight per thread while staging (the row kernel has 4; the values
// and the sum order do not depend on it, the registers do: for the whole kernel 98 with 1, and
// 2 needs more than the 512-thread launch bound's 128 (a few spills); 4 needed 207).
template <int kIn, int kStageUnroll>
__device__ __forceinline__ void stage_row(const void* src, const float* norm_w, int K, float eps, bf16* As,
                                          float* red) {
  const int n8 = K / 8, nthreads = static_cast<int>(blockDim.x);
  if constexpr (kIn == kBf16Row) {
    const uint4* x8 = static_cast<const uint4*>(src);
    for (int c0 = threadIdx.x; c0 < n8; c0 += nthreads * kStageUnroll) {
      uint4 v[kStageUnroll];
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u)
        if (c0 + u * nthreads < n8) v[u] = __ldcg(x8 + c0 + u * nthreads);
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u)
        if (c0 + u * nthreads < n8) reinterpret_cast<uint4*>(As)[c0 + u * nthreads] = v[u];
    }
  } else {
    const float4* x4 = static_cast<const float4*>(src);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // 1 / rms: sums strided over the first 128 threads (float4 groups in order), a warp xor
    // tree, those warps in order (the row kernel's order).
    if (warp < kNormWarps) {
      float ss = 0.0f;
      const int n4 = K / 4;
      for (int c0 = threadIdx.x; c0 < n4; c0 += detail::kNormThreads * kStageUnroll) {
        float4 v[kStageUnroll];
#pragma unroll
        for (int u = 0; u < kStageUnroll; ++u)
          if (c0 + u * detail::kNormThreads < n4) v[u] = __ldcg(x4 + c0 + u * detail::kNormThreads);
#pragma unroll
        for (int u = 0; u < kStageUnroll; ++u)
          if (c0 + u * detail::kNormThreads < n4) ss = add_squares(v[u], ss);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) red[warp] = ss;
    }
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < kNormWarps; ++w) tot += red[w];
    const float inv = 1.0f / sqrtf(tot / static_cast<float>(K) + eps);
    const float4* y4 = reinterpret_cast<const float4*>(norm_w);
    for (int c0 = threadIdx.x; c0 < n8; c0 += nthreads * kStageUnroll) {
      float4 a[kStageUnroll][2], b[kStageUnroll][2];
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u) {
        const int c = c0 + u * nthreads;
        if (c < n8) {
          a[u][0] = __ldcg(x4 + 2 * c);
          a[u][1] = __ldcg(x4 + 2 * c + 1);
          b[u][0] = __ldg(y4 + 2 * c);
          b[u][1] = __ldg(y4 + 2 * c + 1);
        }
      }
#pragma unroll
      for (int u = 0; u < kStageUnroll; ++u) {
        const int c = c0 + u * nthreads;
        if (c < n8) reinterpret_cast<uint4*>(As)[c] = stage8<true>(a[u], b[u], inv);
      }
    }
  }
  __syncthreads();
}

// This warp's pairs of a phase (the row kernel's dot loop and epilogue for one row), with its
// first batch already in wv. The caller then issues the next phase's first batch, before the
// barrier.
template <int kEpi>
__device__ __forceinline__ void run_pairs(Phase ph, const bf16* As, uint4 (&wv)[kUnroll][kOutPerWarp], int wid, int lane,
                                          float* y, bf16* silu_out, bool ef, unsigned long long policy) {
  const int chunks = ph.K / 8;
  const int pairs = ph.N / kOutPerWarp;
  if (wid < ph.warps_used) {
#pragma unroll 1
    for (int j = wid; j < pairs; j += ph.warps_used) {
      const int n0 = j * kOutPerWarp;
      float acc[kOutPerWarp];
#pragma unroll
      for (int o = 0; o < kOutPerWarp; ++o) acc[o] = 0.0f;
#pragma unroll 1
      for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
        // The next batch: the next chunks of this pair, the first chunks of this warp's next
        // pair, or (after its last pair) nothing; the next phase's first batch is issued
        // after the loop.
        uint4 nx[kUnroll][kOutPerWarp];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int o = 0; o < kOutPerWarp; ++o) nx[u][o] = make_uint4(0, 0, 0, 0);
        const bool more_here = c0 + 32 * kUnroll < chunks;
        const int nn = more_here ? n0 : n0 + ph.warps_used * kOutPerWarp;
        const int nc = more_here ? c0 + 32 * kUnroll : lane;
        if (nn < ph.N) {
#pragma unroll
          for (int o = 0; o < kOutPerWarp; ++o) {
            const uint4* w4 = reinterpret_cast<const uint4*>(ph.W + static_cast<int64_t>(nn + o) * ph.K);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
              if (nc + u * 32 < chunks) nx[u][o] = load_weight(w4 + nc + u * 32, ef, policy);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = c0 + u * 32;
          if (c < chunks) {
            float wf[kOutPerWarp][8];
#pragma unroll
            for (int o = 0; o < kOutPerWarp; ++o) unpack8(wv[u][o], wf[o]);
            float a[8];
            unpack8(*reinterpret_cast<const uint4*>(As + c * 8), a);
#pragma unroll
            for (int o = 0; o < kOutPerWarp; ++o) acc[o] = detail::dot8(a, wf[o], acc[o]);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int o = 0; o < kOutPerWarp; ++o) wv[u][o] = nx[u][o];
      }
      float v[kOutPerWarp];
#pragma unroll
      for (int o = 0; o < kOutPerWarp; ++o) {
        v[o] = acc[o];
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) v[o] += __shfl_xor_sync(0xffffffffu, v[o], s);
      }
      if (lane == 0) {
        if constexpr (kEpi == kSilu) {
          silu_out[n0 / 2] = __float2bfloat16(silu_mul(v[0], v[1]));
        } else {
#pragma unroll
          for (int o = 0; o < kOutPerWarp; ++o) {
            float* p = y + n0 + o;
            *p = kEpi == kAccumulate ? __ldcg(p) + v[o] : v[o];
          }
        }
      }
    }
  }
}

// kProfile: the phase stamps (a.timing) are compiled in only for profiling runs: they cost 26
// registers (124 against 98), so the plain kernel must not carry them.
template <int kSU, bool kProfile>
__global__ void __launch_bounds__(kMaxThreads) layer_tail_kernel(LayerTailArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* As = reinterpret_cast<bf16*>(smem_raw);
  __shared__ float red[kNormWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wid = static_cast<int>(blockIdx.x * (blockDim.x >> 5)) + warp;
  const bool ef = a.evict_first;
  const unsigned long long policy = ef ? detail::evict_first_policy() : 0ull;
  const unsigned nb = gridDim.x;
  // Profiling stamps (thread 0) and, with `done`, after the whole block's work (all warps).
  auto mark = [&](int k, bool done = false) {
    if constexpr (kProfile) {
      if (done) __syncthreads();
      if (threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        a.timing[static_cast<size_t>(blockIdx.x) * kLayerTailStamps + k] = t;
      }
    }
  };

  uint4 wv[kUnroll][kOutPerWarp];
  first_batch(wv, make_phase(a.w_o, a.H, a.NQ), wid, lane, ef, policy);  // constant weights: before the wait
  pdl_wait();                                                            // attention's output is in
  mark(0);

  stage_row<kBf16Row, kSU>(a.attb, nullptr, a.NQ, a.eps, As, red);
  run_pairs<kAccumulate>(make_phase(a.w_o, a.H, a.NQ), As, wv, opaque(wid), opaque(lane), a.x, nullptr, ef, policy);
  first_batch(wv, make_phase(a.w_gu, 2 * a.I, a.H), opaque(wid), opaque(lane), ef, policy);
  mark(1, true);
  grid_barrier(a.barrier, nb);
  mark(2);

  stage_row<kRmsNormRow, kSU>(a.x, a.post_norm, a.H, a.eps, As, red);
  run_pairs<kSilu>(make_phase(a.w_gu, 2 * a.I, a.H), As, wv, opaque(wid), opaque(lane), nullptr, a.act, ef, policy);
  first_batch(wv, make_phase(a.w_down, a.H, a.I), opaque(wid), opaque(lane), ef, policy);
  mark(3, true);
  grid_barrier(a.barrier, 2 * nb);
  mark(4);

  stage_row<kBf16Row, kSU>(a.act, nullptr, a.I, a.eps, As, red);
  run_pairs<kAccumulate>(make_phase(a.w_down, a.H, a.I), As, wv, opaque(wid), opaque(lane), a.x, nullptr, ef, policy);
  if (a.w_qkv == nullptr) {
    mark(5, true);
    pdl_trigger();
    return;
  }
  first_batch(wv, make_phase(a.w_qkv, a.NQKV, a.H), opaque(wid), opaque(lane), ef, policy);
  mark(5, true);
  grid_barrier(a.barrier, 3 * nb);
  mark(6);
  // Every block has passed three barriers, so all are resident: the next launch (the next
  // layer's attention) may take the room this grid frees.
  pdl_trigger();
  stage_row<kRmsNormRow, kSU>(a.x, a.next_norm, a.H, a.eps, As, red);
  run_pairs<kStore>(make_phase(a.w_qkv, a.NQKV, a.H), As, wv, opaque(wid), opaque(lane), a.qkv, nullptr, ef, policy);
  mark(7, true);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool layer_tail_supported(const LayerTailArgs& a) {
  if (a.H <= 0 || a.NQ <= 0 || a.I <= 0) return false;
  if (a.warps < kNormWarps || a.warps * 32 > kMaxThreads || a.warps % kNormWarps) return false;
  if (a.H % 8 || a.NQ % 8 || a.I % 8 || (a.w_qkv && (a.NQKV <= 0 || a.NQKV % 2))) return false;
  for (const void* p : {static_cast<const void*>(a.attb), static_cast<const void*>(a.w_o), static_cast<const void*>(a.post_norm),
                        static_cast<const void*>(a.w_gu), static_cast<const void*>(a.act), static_cast<const void*>(a.w_down),
                        static_cast<const void*>(a.x)})
    if (!p || !aligned16(p)) return false;
  if (a.w_qkv && (!aligned16(a.w_qkv) || !a.next_norm || !aligned16(a.next_norm) || !a.qkv)) return false;
  return a.barrier != nullptr;
}

int layer_tail_one_row(const LayerTailArgs& a, cudaStream_t stream) {
  if (!layer_tail_supported(a))
    throw Error("CUDA fused layer tail: unsupported shapes or alignment (H " + std::to_string(a.H) + ", q features " +
                std::to_string(a.NQ) + ", intermediate " + std::to_string(a.I) + ")");
  const size_t smem = static_cast<size_t>(std::max({a.H, a.NQ, a.I})) * sizeof(bf16);
  auto kernel = a.timing ? (a.stage_unroll >= 2 ? layer_tail_kernel<2, true> : layer_tail_kernel<1, true>)
                         : (a.stage_unroll >= 2 ? layer_tail_kernel<2, false> : layer_tail_kernel<1, false>);
  const int threads = 32 * a.warps;
  raise_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  // Every block must be resident at once (grid barriers): the occupancy limit times the SMs.
  thread_local int sms = 0;
  thread_local std::vector<std::tuple<const void*, size_t, int, int>> grids;  // (kernel, smem, threads) -> grid
  int grid = 0;
  for (const auto& [k, sm, t, g] : grids)
    if (k == reinterpret_cast<const void*>(kernel) && sm == smem && t == threads) grid = g;
  if (grid == 0) {
    int dev = 0, per_sm = 0;
    DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
    if (sms == 0) DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    DSINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    if (per_sm < 1) throw Error("CUDA fused layer tail: no block fits on an SM");
    grid = per_sm * sms;
    grids.emplace_back(reinterpret_cast<const void*>(kernel), smem, threads, grid);
  }
  launch_pdl(PdlSite::Gemv, kernel, dim3(grid), dim3(threads), smem, stream, a);
  DSINFER_CUDA_LAUNCHED("layer_tail_kernel");
  return grid;
}

}  // namespace dsinfer::cuda
