// dsinfer CUDA backend: the drafter's own kernels (see cuda_drafter_kernels.h). Formulas
// follow the target's kernels (cuda_kernels.cu, cuda_attention.cu): the same RMSNorm, the
// same rotate-half RoPE, the same online softmax; reductions in a fixed order per row.
#include <cfloat>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_drafter_kernels.h"

namespace dsinfer::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxD = 256;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum in a fixed order (blockDim.x a multiple of 32); every thread gets it.
__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}
__device__ __forceinline__ int32_t id_from_key(unsigned long long key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<unsigned>(key & 0xffffffffu));
}

// Offset of store row `row` of (layer l, K (0) or V (1), kv head g) in a sequence buffer.
__device__ __forceinline__ int64_t seg_offset(int l, int kv, int g, int NKV, int cap, int row, int D) {
  return ((static_cast<int64_t>(l) * 2 + kv) * NKV + g) * cap * D + static_cast<int64_t>(row) * D;
}

// One warp per (row, layer, head); heads per layer: [0, NQ) q, then NKV k, then NKV v.
__global__ void qkv_store_kernel(const float* __restrict__ src, int64_t ld, int T, int layers, int64_t layer_stride,
                                 int first_layer, int NQ, int NKV, int D, const float* __restrict__ q_norm,
                                 const float* __restrict__ k_norm, float eps, const float* __restrict__ cos_t,
                                 const float* __restrict__ sin_t, DraftRowDst dst, float* __restrict__ q_out) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int per_layer = NQ + 2 * NKV;
  const int idx = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int r = blockIdx.x;
  if (idx >= layers * per_layer || r >= T) return;
  bf16* buf = reinterpret_cast<bf16*>(dst.base[r]);
  if (!buf) return;  // a padding row (a commit graph's rows past the real ones): no q, k or v
  const int ll = idx / per_layer, head = idx % per_layer, l = first_layer + ll;
  const float* s = src + r * ld + ll * layer_stride + static_cast<int64_t>(head) * D;
  const int cap = dst.cap[r], row = dst.dst[r];
  if (head >= NQ + NKV) {  // v: straight to the buffer
    bf16* d = buf + seg_offset(l, 1, head - NQ - NKV, NKV, cap, row, D);
    for (int i = lane; i < D; i += 32) d[i] = __float2bfloat16(s[i]);
    return;
  }
  const bool is_q = head < NQ;
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) ss = fmaf(s[i], s[i], ss);
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  const float* w = (is_q ? q_norm : k_norm) + static_cast<int64_t>(l) * D;
  const int half = D / 2;
  const float* c = cos_t + static_cast<int64_t>(r) * half;
  const float* sn = sin_t + static_cast<int64_t>(r) * half;
  float* qd = is_q ? q_out + static_cast<int64_t>(r) * NQ * D + static_cast<int64_t>(head) * D : nullptr;
  bf16* kd = is_q ? nullptr : buf + seg_offset(l, 0, head - NQ, NKV, cap, row, D);
  for (int i = lane; i < half; i += 32) {
    const float x1 = w[i] * (s[i] * inv), x2 = w[i + half] * (s[i + half] * inv);
    const float a = x1 * c[i] - x2 * sn[i];
    const float b = x2 * c[i] + x1 * sn[i];
    if (is_q) {
      qd[i] = a;
      qd[i + half] = b;
    } else {
      kd[i] = __float2bfloat16(a);
      kd[i + half] = __float2bfloat16(b);
    }
  }
}

// One block of kWarps warps per (q head, row). Warp w owns keys [w * chunk, (w + 1) * chunk)
// of the item's n keys (chunk a function of n alone); lane j scores key t0 + j of a 32-key
// tile (sequential dot over D), an online softmax carries (max, sum), V rows are added in
// key order (lane owns dimensions lane, lane + 32, ...); the warps are combined in order.
// KP = ceil(D / 32) (1, 2, 4 or 8: a template, so the loops below unroll): each lane's key
// row is loaded whole before its dot, and V rows kVGroup keys at a time before their adds,
// so a tile waits for its memory about twice instead of once per key (the kernel was
// latency-bound: 50 us of a 0.24 ms drafter pass on the H200); the arithmetic, and so every
// bit, is that of one key at a time.
constexpr int kVGroup = 8;
template <int KP>
__global__ void __launch_bounds__(kThreads)
    block_attention_kernel(const float* __restrict__ q, const int32_t* __restrict__ item,
                           const unsigned long long* __restrict__ base, const int32_t* __restrict__ cap_of,
                           const int32_t* __restrict__ key_begin, const int32_t* __restrict__ n_keys_of, int layer,
                           int NQ, int NKV, int D, float scale, bf16* __restrict__ out) {
  __shared__ float qs[kMaxD];
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ float wacc[kWarps][kMaxD];
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, r = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int it = item[r];
  const int cap = cap_of[it], kb = key_begin[it], n = n_keys_of[it];
  const int g = h / (NQ / NKV);
  const bf16* buf = reinterpret_cast<const bf16*>(base[it]);
  const bf16* K = buf + seg_offset(layer, 0, g, NKV, cap, kb, D);
  const bf16* V = buf + seg_offset(layer, 1, g, NKV, cap, kb, D);
  const float* qr = q + (static_cast<int64_t>(r) * NQ + h) * D;
  for (int d = threadIdx.x; d < D; d += kThreads) qs[d] = qr[d];
  __syncthreads();
  const int chunk = ((n + kWarps - 1) / kWarps + 31) & ~31;
  const int k0 = warp * chunk, k1 = min(n, k0 + chunk);
  const int half = D / 2;
  float acc[KP];
#pragma unroll
  for (int i = 0; i < KP; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int t0 = k0; t0 < k1; t0 += 32) {
    const int j = t0 + lane;
    const bool valid = j < k1;
    float dot = 0.0f;
    if (valid) {
      const __nv_bfloat162* kj = reinterpret_cast<const __nv_bfloat162*>(K + static_cast<int64_t>(j) * D);
      // 32 pairs (64 elements) of the row in flight at a time.
      constexpr int kPairs = 16 * KP, kChunk = kPairs < 32 ? kPairs : 32;
#pragma unroll
      for (int c0 = 0; c0 < kPairs; c0 += kChunk) {
        __nv_bfloat162 kr[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
          if (c0 + i < half) kr[i] = kj[c0 + i];
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
          if (c0 + i < half) {
            const float2 f = __bfloat1622float2(kr[i]);
            dot = fmaf(qs[2 * (c0 + i)], f.x, dot);
            dot = fmaf(qs[2 * (c0 + i) + 1], f.y, dot);
          }
      }
    }
    const float sc = valid ? dot * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(sc));
    const float corr = expf(m - m_new);
    const float p = valid ? expf(sc - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int i = 0; i < KP; ++i) acc[i] *= corr;
    const int tn = min(32, k1 - t0);
    for (int u0 = 0; u0 < tn; u0 += kVGroup) {
      float vv[kVGroup][KP];
#pragma unroll
      for (int u = 0; u < kVGroup; ++u) {
        const bf16* vr = V + static_cast<int64_t>(t0 + u0 + u) * D;
#pragma unroll
        for (int i = 0; i < KP; ++i)
          vv[u][i] = u0 + u < tn && lane + 32 * i < D ? __bfloat162float(vr[lane + 32 * i]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kVGroup; ++u) {
        const float pj = __shfl_sync(0xffffffffu, p, (u0 + u) & 31);
        if (u0 + u < tn) {
#pragma unroll
          for (int i = 0; i < KP; ++i)
            if (lane + 32 * i < D) acc[i] = fmaf(pj, vv[u][i], acc[i]);
        }
      }
    }
    m = m_new;
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < KP; ++i)
    if (lane + 32 * i < D) wacc[warp][lane + 32 * i] = acc[i];
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
  bf16* o = out + (static_cast<int64_t>(r) * NQ + h) * D;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float num = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) num += wacc[w][d] * f[w];
    o[d] = __float2bfloat16(num * inv);
  }
}

__global__ void conf_hdot_kernel(const float* __restrict__ x, int64_t H, const int32_t* __restrict__ rows,
                                 const float* __restrict__ fn, float eps, const float* __restrict__ w_h,
                                 float* __restrict__ hdot) {
  __shared__ float red[32];
  pdl_trigger();
  pdl_wait();
  const float* xr = x + static_cast<int64_t>(rows[blockIdx.x]) * H;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
  float d = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) d = fmaf(w_h[i], fn[i] * (xr[i] * inv), d);
  d = block_sum(d, red);
  if (threadIdx.x == 0) hdot[blockIdx.x] = d;
}

// One block of 64 threads per item.
__global__ void markov_step_kernel(int k, int R, const int32_t* __restrict__ anchors,
                                   const unsigned long long* __restrict__ keys, int32_t* __restrict__ ids,
                                   const bf16* __restrict__ w1, int rank, bf16* __restrict__ e,
                                   const float* __restrict__ hdot, const float* __restrict__ w_e, float conf_b,
                                   float* __restrict__ z) {
  __shared__ float red[32];
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x;
  const int32_t prev = k == 0 ? anchors[i] : id_from_key(keys[static_cast<int64_t>(k - 1) * R + i]);
  if (k > 0 && threadIdx.x == 0) ids[static_cast<int64_t>(k - 1) * R + i] = prev;
  float d = 0.0f;
  if (w1) {
    const bf16* row = w1 + static_cast<int64_t>(prev) * rank;
    for (int j = threadIdx.x; j < rank; j += blockDim.x) {
      e[static_cast<int64_t>(i) * rank + j] = row[j];
      if (w_e) d = fmaf(w_e[j], __bfloat162float(row[j]), d);
    }
  }
  if (z) {
    d = block_sum(d, red);
    if (threadIdx.x == 0) z[static_cast<int64_t>(k) * R + i] = hdot[static_cast<int64_t>(k) * R + i] + d + conf_b;
  }
}

__global__ void keys_to_ids_kernel(const unsigned long long* __restrict__ keys, int n, int32_t* __restrict__ ids) {
  pdl_trigger();
  pdl_wait();
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) ids[j] = id_from_key(keys[j]);
}

}  // namespace

void draft_qkv_store(const float* src, int64_t ld, int T, int layers, int64_t layer_stride, int first_layer, int NQ,
                     int NKV, int D, int L_total, const float* q_norm, const float* k_norm, float eps,
                     const float* cos_t, const float* sin_t, DraftRowDst dst, float* q_out, cudaStream_t stream) {
  if (T <= 0) return;
  (void)L_total;
  const int warps = 4, n = layers * (NQ + 2 * NKV);
  dim3 grid(T, (n + warps - 1) / warps);
  launch_pdl(PdlSite::Small, qkv_store_kernel, grid, dim3(32 * warps), 0, stream, src, ld, T, layers, layer_stride,
             first_layer, NQ, NKV, D, q_norm, k_norm, eps, cos_t, sin_t, dst, q_out);
  DSINFER_CUDA_LAUNCHED("draft qkv_store_kernel");
}

void draft_block_attention(const float* q, int T, const int32_t* item, const unsigned long long* base,
                           const int32_t* cap, const int32_t* key_begin, const int32_t* n_keys, int layer, int L_total,
                           int NQ, int NKV, int D, float scale, bf16* out, cudaStream_t stream) {
  if (T <= 0) return;
  (void)L_total;
  if (D > kMaxD || D % 2 != 0 || NKV <= 0 || NQ % NKV != 0)
    throw Error("CUDA drafter attention: head_dim " + std::to_string(D) + " / heads " + std::to_string(NQ) +
                " / kv heads " + std::to_string(NKV) + " not supported (head_dim even and <= 256, heads a multiple of kv heads)");
  const dim3 grid(NQ, T);
  if (D <= 32)
    launch_pdl(PdlSite::Small, block_attention_kernel<1>, grid, dim3(kThreads), 0, stream, q, item, base, cap, key_begin,
               n_keys, layer, NQ, NKV, D, scale, out);
  else if (D <= 64)
    launch_pdl(PdlSite::Small, block_attention_kernel<2>, grid, dim3(kThreads), 0, stream, q, item, base, cap, key_begin,
               n_keys, layer, NQ, NKV, D, scale, out);
  else if (D <= 128)
    launch_pdl(PdlSite::Small, block_attention_kernel<4>, grid, dim3(kThreads), 0, stream, q, item, base, cap, key_begin,
               n_keys, layer, NQ, NKV, D, scale, out);
  else
    launch_pdl(PdlSite::Small, block_attention_kernel<8>, grid, dim3(kThreads), 0, stream, q, item, base, cap, key_begin,
               n_keys, layer, NQ, NKV, D, scale, out);
  DSINFER_CUDA_LAUNCHED("draft block_attention_kernel");
}

void draft_conf_hdot(const float* x, int64_t H, const int32_t* rows, int n, const float* final_norm, float eps,
                     const float* w_h, float* hdot, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(PdlSite::Small, conf_hdot_kernel, dim3(n), dim3(256), 0, stream, x, H, rows, final_norm, eps, w_h, hdot);
  DSINFER_CUDA_LAUNCHED("draft conf_hdot_kernel");
}

void draft_markov_step(int k, int R, const int32_t* anchors, const unsigned long long* keys, int32_t* ids,
                       const bf16* w1, int rank, bf16* e, const float* hdot, const float* w_e, float conf_b, float* z,
                       cudaStream_t stream) {
  if (R <= 0) return;
  launch_pdl(PdlSite::Small, markov_step_kernel, dim3(R), dim3(64), 0, stream, k, R, anchors, keys, ids, w1, rank, e, hdot,
             w_e, conf_b, z);
  DSINFER_CUDA_LAUNCHED("draft markov_step_kernel");
}

void draft_keys_to_ids(const unsigned long long* keys, int n, int32_t* ids, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(PdlSite::Small, keys_to_ids_kernel, dim3((n + 255) / 256), dim3(256), 0, stream, keys, n, ids);
  DSINFER_CUDA_LAUNCHED("draft keys_to_ids_kernel");
}

}  // namespace dsinfer::cuda
