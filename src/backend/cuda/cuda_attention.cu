// dsinfer CUDA backend: the attention kernel (see cuda_attention.h for the algorithm and
// why its result is batch-invariant).
#include <cmath>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

namespace {

constexpr int kWarps = kAttnWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxD = 256;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// kPairs: dimension pairs per lane (D <= 64 * kPairs). kVec: D % 8 == 0 (16-byte K loads).
// kPaged: keys through the block tables (KVLayerView::table): lane j looks up key t0 + j's
// row, and the V rows of a tile take their offsets from the lanes by shuffle. Same
// arithmetic in the same order as the dense layout, so the same bits.
template <int kPairs, bool kVec, bool kPaged>
__global__ void __launch_bounds__(kThreads)
    attention_kernel(const float* __restrict__ q, KVLayerView kv, const int32_t* __restrict__ slot,
                     const int32_t* __restrict__ pos, int NH, int NKVH, int D, float scale, bf16* __restrict__ out,
                     L2Prefetch prefetch) {
  __shared__ float qs[kMaxD];
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ float wacc[kWarps][kMaxD];
  pdl_trigger();
  l2_prefetch_part(prefetch, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y);
  pdl_wait();
  const int r = blockIdx.y, h = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s = slot[r];
  bf16* o = out + (static_cast<int64_t>(r) * NH + h) * D;
  if (s < 0) {
    for (int d = threadIdx.x; d < D; d += kThreads) o[d] = __float2bfloat16(0.0f);
    return;
  }
  // Warp w owns keys [k0, k1): the w-th of kWarps contiguous ranges of `chunk` keys, chunk a
  // function of the row's length alone.
  const int n_keys = pos[r] + 1;
  const int chunk = ((n_keys + kWarps - 1) / kWarps + 31) & ~31;
  const int k0 = warp * chunk, k1 = min(n_keys, k0 + chunk);
  const int kvh = h / (NH / NKVH);
  // Dense: key j's row at base + j * D. Paged: at row_off, lane j's lookup of key t0 + j.
  const int64_t base = kPaged ? 0 : s * kv.slot_stride + kvh * kv.head_stride;
  const bf16* K = kv.k + base;
  const bf16* V = kv.v + base;
  int64_t row_off = 0;
  // Offset of key t0 + u's row (from lane u in the paged layout; every lane calls it).
  auto key_row = [&](int t0, int u) -> int64_t {
    if constexpr (kPaged) return __shfl_sync(0xffffffffu, row_off, u);
    else return static_cast<int64_t>(t0 + u) * D;
  };
  const float* qr = q + (static_cast<int64_t>(r) * NH + h) * D;

  // One tile: lane j's K row (key t0 + j) and the lane's dimension pairs of the V rows of
  // keys t0 .. t0 + 31, all loads issued together (one memory round trip per tile; the
  // first tile's go out before q is staged). D = 256 keeps the V loads of the second half
  // of the tile for its V loop (registers).
  constexpr int kChunks = 8 * kPairs;
  constexpr int kVKeys = kPairs <= 2 ? 32 : 16;
  uint4 kr[kChunks];
  uint32_t vr[kVKeys][kPairs];
  auto load_tile = [&](int t0) {
    const int j = t0 + lane;
    if constexpr (kPaged) row_off = j < k1 ? kv_row_offset(kv, s, kvh, j, D) : 0;
    if constexpr (kVec) {
      if (j < k1) {
        const uint4* k4 = reinterpret_cast<const uint4*>(K + (kPaged ? row_off : static_cast<int64_t>(j) * D));
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          if (c < D / 8) kr[c] = k4[c];
      }
    }
#pragma unroll
    for (int u = 0; u < kVKeys; ++u) {
      const int64_t off = key_row(t0, u);
#pragma unroll
      for (int i = 0; i < kPairs; ++i)
        if (t0 + u < k1 && 2 * (lane + 32 * i) < D) vr[u][i] = reinterpret_cast<const uint32_t*>(V + off)[lane + 32 * i];
    }
  };
  if (k0 < k1) load_tile(k0);
  for (int d = threadIdx.x; d < D; d += kThreads) qs[d] = qr[d];
  __syncthreads();

  float m = -INFINITY, l = 0.0f;
  float acc[2 * kPairs];
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) acc[i] = 0.0f;
  for (int t0 = k0; t0 < k1; t0 += 32) {
    if (t0 != k0) load_tile(t0);
    // Scores: lane j takes key t0 + j, a sequential dot over D.
    const int j = t0 + lane;
    const bool valid = j < k1;
    float dot = 0.0f;
    if (valid) {
      if constexpr (kVec) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          if (c < D / 8) {
            const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&kr[c]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 f = __bfloat1622float2(p2[e]);
              dot = fmaf(qs[c * 8 + 2 * e], f.x, dot);
              dot = fmaf(qs[c * 8 + 2 * e + 1], f.y, dot);
            }
          }
      } else {
        const bf16* kj = K + (kPaged ? row_off : static_cast<int64_t>(j) * D);
        for (int i = 0; i < D; ++i) dot = fmaf(qs[i], __bfloat162float(kj[i]), dot);
      }
    }
    const float sc = valid ? dot * scale : -INFINITY;
    // Online softmax over the tile (lane 0's key is always valid: the max is finite).
    const float m_new = fmaxf(m, warp_max(sc));
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    const float p = valid ? expf(sc - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int i = 0; i < 2 * kPairs; ++i) acc[i] *= corr;
    // V: keys t0 .. t0 + 31 in order (lane l owns the dimension pairs l, l + 32, ...).
    const int tn = min(32, k1 - t0);
#pragma unroll
    for (int u = 0; u < 32; ++u) {
      const float pj = __shfl_sync(0xffffffffu, p, u);
      const int64_t voff = u < kVKeys ? 0 : key_row(t0, u);  // rows past the registers' keys
      if (u < tn)
#pragma unroll
        for (int i = 0; i < kPairs; ++i)
          if (2 * (lane + 32 * i) < D) {
            uint32_t raw;
            if (u < kVKeys) raw = vr[u < kVKeys ? u : 0][i];
            else raw = reinterpret_cast<const uint32_t*>(V + voff)[lane + 32 * i];
            const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw));
            acc[2 * i] = fmaf(pj, v.x, acc[2 * i]);
            acc[2 * i + 1] = fmaf(pj, v.y, acc[2 * i + 1]);
          }
    }
    m = m_new;
  }
  // The warps' (max, sum, V sum), combined in warp order (warps without keys add nothing).
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int pr = lane + 32 * i;
    if (2 * pr < D) {
      wacc[warp][2 * pr] = acc[2 * i];
      wacc[warp][2 * pr + 1] = acc[2 * i + 1];
    }
  }
  __syncthreads();
  float mx = wm[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, wm[w]);
  float f[kWarps];
  float den = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    f[w] = wl[w] > 0.0f ? expf(wm[w] - mx) : 0.0f;
    den += wl[w] * f[w];
  }
  const float inv = 1.0f / den;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float num = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) num += wacc[w][d] * f[w];
    o[d] = __float2bfloat16(num * inv);
  }
}

template <int kPairs, bool kPaged>
void launch_layout(dim3 grid, cudaStream_t stream, const float* q, KVLayerView kv, const int32_t* slot,
                   const int32_t* pos, int NH, int NKVH, int D, float scale, bf16* out, L2Prefetch pf) {
  if (D % 8 == 0)
    launch_pdl(attention_kernel<kPairs, true, kPaged>, grid, dim3(kThreads), 0, stream, q, kv, slot, pos, NH, NKVH, D,
               scale, out, pf);
  else
    launch_pdl(attention_kernel<kPairs, false, kPaged>, grid, dim3(kThreads), 0, stream, q, kv, slot, pos, NH, NKVH, D,
               scale, out, pf);
}

template <int kPairs>
void launch(dim3 grid, cudaStream_t stream, const float* q, KVLayerView kv, const int32_t* slot, const int32_t* pos,
            int NH, int NKVH, int D, float scale, bf16* out, L2Prefetch pf) {
  if (kv.table) launch_layout<kPairs, true>(grid, stream, q, kv, slot, pos, NH, NKVH, D, scale, out, pf);
  else launch_layout<kPairs, false>(grid, stream, q, kv, slot, pos, NH, NKVH, D, scale, out, pf);
}

}  // namespace

void attention_rows(const float* q, KVLayerView kv, const int32_t* slot, const int32_t* pos, int T, int NH, int NKVH,
                    int D, float scale, bf16* out, cudaStream_t stream, L2Prefetch pf) {
  if (T <= 0) return;
  if (D > kMaxD || D % 2 != 0 || NKVH <= 0 || NH % NKVH != 0)
    throw Error("CUDA attention: head_dim " + std::to_string(D) + " / heads " + std::to_string(NH) + " / kv heads " +
                std::to_string(NKVH) + " not supported (head_dim even and <= 256, heads a multiple of kv heads)");
  const dim3 grid(NH, T);
  if (D <= 64) launch<1>(grid, stream, q, kv, slot, pos, NH, NKVH, D, scale, out, pf);
  else if (D <= 128) launch<2>(grid, stream, q, kv, slot, pos, NH, NKVH, D, scale, out, pf);
  else launch<4>(grid, stream, q, kv, slot, pos, NH, NKVH, D, scale, out, pf);
  DSINFER_CUDA_LAUNCHED("attention_kernel");
}

}  // namespace dsinfer::cuda
