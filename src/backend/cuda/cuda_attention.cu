// dsinfer CUDA backend: the attention kernel (see cuda_attention.h for the algorithm and
// why its result is batch-invariant).
#include <cmath>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 256;
constexpr int kMaxD = 256;

__device__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float m = red[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);
  return m;
}

__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kWarps; ++w) s += red[w];
  return s;
}

__global__ void __launch_bounds__(kThreads)
    attention_kernel(const float* __restrict__ q, KVLayerView kv, const int32_t* __restrict__ slot,
                     const int32_t* __restrict__ pos, int NH, int NKVH, int D, float scale, bf16* __restrict__ out) {
  __shared__ float qs[kMaxD];
  __shared__ float sc[kTile];
  __shared__ float red[32];
  __shared__ float part[kWarps][kMaxD];
  const int r = blockIdx.y, h = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s = slot[r];
  bf16* o = out + (static_cast<int64_t>(r) * NH + h) * D;
  if (s < 0) {
    for (int d = threadIdx.x; d < D; d += kThreads) o[d] = __float2bfloat16(0.0f);
    return;
  }
  const int n_keys = pos[r] + 1;
  const int kvh = h / (NH / NKVH);
  const bf16* K = kv.k + s * kv.slot_stride + kvh * kv.head_stride;
  const bf16* V = kv.v + s * kv.slot_stride + kvh * kv.head_stride;
  const float* qr = q + (static_cast<int64_t>(r) * NH + h) * D;
  for (int d = threadIdx.x; d < D; d += kThreads) qs[d] = qr[d];
  __syncthreads();

  // V accumulation: warp w owns keys w, w + kWarps, ... of every tile; lane l owns the
  // dimension pairs (2p, 2p + 1) for p = l, l + 32, ... (D <= 256: at most 4 pairs).
  constexpr int kPairs = kMaxD / 64;
  float acc[2 * kPairs];
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const bool vec = (D % 8) == 0;
  for (int t0 = 0; t0 < n_keys; t0 += kTile) {
    const int tn = min(kTile, n_keys - t0);
    // Scores: one key per thread, sequential dot over D (loads unrolled to overlap).
    for (int j = threadIdx.x; j < tn; j += kThreads) {
      const bf16* kj = K + static_cast<int64_t>(t0 + j) * D;
      float dot = 0.0f;
      if (vec) {
        const uint4* k4 = reinterpret_cast<const uint4*>(kj);
#pragma unroll 8
        for (int c = 0; c < D / 8; ++c) {
          const uint4 kv8 = k4[c];
          const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&kv8);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __bfloat1622float2(p[e]);
            dot = fmaf(qs[c * 8 + 2 * e], f.x, dot);
            dot = fmaf(qs[c * 8 + 2 * e + 1], f.y, dot);
          }
        }
      } else {
        for (int i = 0; i < D; ++i) dot = fmaf(qs[i], __bfloat162float(kj[i]), dot);
      }
      sc[j] = dot * scale;
    }
    __syncthreads();
    float tmax = -INFINITY;
    for (int j = threadIdx.x; j < tn; j += kThreads) tmax = fmaxf(tmax, sc[j]);
    tmax = block_max(tmax, red);
    const float m_new = fmaxf(m, tmax);
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float psum = 0.0f;
    for (int j = threadIdx.x; j < tn; j += kThreads) {
      const float p = expf(sc[j] - m_new);
      sc[j] = p;
      psum += p;
    }
    psum = block_sum(psum, red);  // its barriers also publish sc[]
    l = l * corr + psum;
#pragma unroll
    for (int i = 0; i < 2 * kPairs; ++i) acc[i] *= corr;
#pragma unroll 16  // many V rows in flight: this loop is latency-bound at batch 1
    for (int j = warp; j < tn; j += kWarps) {
      const float p = sc[j];
      const __nv_bfloat162* vj = reinterpret_cast<const __nv_bfloat162*>(V + static_cast<int64_t>(t0 + j) * D);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const int pr = lane + 32 * i;
        if (2 * pr < D) {
          const float2 v = __bfloat1622float2(vj[pr]);
          acc[2 * i] = fmaf(p, v.x, acc[2 * i]);
          acc[2 * i + 1] = fmaf(p, v.y, acc[2 * i + 1]);
        }
      }
    }
    m = m_new;
    __syncthreads();  // sc[] is rewritten by the next tile
  }
  // The warps' partial sums, added in warp order.
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int pr = lane + 32 * i;
    if (2 * pr < D) {
      part[warp][2 * pr] = acc[2 * i];
      part[warp][2 * pr + 1] = acc[2 * i + 1];
    }
  }
  __syncthreads();
  const float inv = 1.0f / l;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += part[w][d];
    o[d] = __float2bfloat16(sum * inv);
  }
}

}  // namespace

void attention_rows(const float* q, KVLayerView kv, const int32_t* slot, const int32_t* pos, int T, int NH, int NKVH,
                    int D, float scale, bf16* out, cudaStream_t stream) {
  if (T <= 0) return;
  if (D > kMaxD || D % 2 != 0 || NKVH <= 0 || NH % NKVH != 0)
    throw Error("CUDA attention: head_dim " + std::to_string(D) + " / heads " + std::to_string(NH) + " / kv heads " +
                std::to_string(NKVH) + " not supported (head_dim even and <= 256, heads a multiple of kv heads)");
  dim3 grid(NH, T);
  attention_kernel<<<grid, kThreads, 0, stream>>>(q, kv, slot, pos, NH, NKVH, D, scale, out);
  DSINFER_CUDA_LAUNCHED("attention_kernel");
}

}  // namespace dsinfer::cuda
