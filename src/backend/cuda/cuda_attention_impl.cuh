// dsinfer CUDA backend: the per-(row, head) device code of the q/k step and of attention,
// shared by the layered kernels (cuda_kernels.cu, cuda_attention.cu) and the persistent
// decode kernel (cuda_persistent_decode.cu). One copy of the arithmetic is what makes a
// decode row of the persistent kernel bit-identical to the same row of a verify block run
// by the layered kernels (greedy speculation == plain greedy). Device code only; include
// from .cu files.
//
// rope_cos_sin: the RoPE table entry (rope_table's formula, cuda_kernels.h).
// qk_norm_rope_head: one warp RMS-norms one head of D values over D (lane-strided sums, xor
//   tree), rotates it (rotate-half) and writes it as F32 (q) and/or BF16 (k into the cache).
// attend_row_head: kAttnWarps warps attend one (row, q head) over keys [0, n_keys) of the
//   cache (algorithm: cuda_attention.h), the q row already staged in shared memory.
#pragma once
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda::detail {

constexpr int kAttnMaxD = 256;

__device__ __forceinline__ float attn_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float attn_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// cos/sin of position pos at frequency inv_freq, times attention_factor af.
__device__ __forceinline__ void rope_cos_sin(int pos, float inv_freq, float af, float* c, float* s) {
  const float ang = static_cast<float>(pos) * inv_freq;
  *c = static_cast<float>(cos(static_cast<double>(ang))) * af;
  *s = static_cast<float>(sin(static_cast<double>(ang))) * af;
}

// One warp: src (D values, read through load(i)) RMS-normed with w and rotated; cs(i, &c, &s)
// gives the rotation of dimension pair (i, i + D/2). q_dst (F32) and k_dst (BF16) may each be
// null.
template <class Load, class CosSin>
__device__ __forceinline__ void qk_norm_rope_head(Load load, const float* __restrict__ w, float eps, int D, CosSin cs,
                                                  float* q_dst, bf16* k_dst, int lane) {
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) {
    const float v = load(i);
    ss = fmaf(v, v, ss);
  }
  ss = attn_warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  const int half = D / 2;
  for (int i = lane; i < half; i += 32) {
    float c, sn;
    cs(i, &c, &sn);
    const float x1 = w[i] * (load(i) * inv), x2 = w[i + half] * (load(i + half) * inv);
    const float a = x1 * c - x2 * sn;
    const float b = x2 * c + x1 * sn;
    if (q_dst) {
      q_dst[i] = a;
      q_dst[i + half] = b;
    }
    if (k_dst) {
      k_dst[i] = __float2bfloat16(a);
      k_dst[i + half] = __float2bfloat16(b);
    }
  }
}

// Keys per warp of a row of n keys in attend_row_head: a multiple of 8, a function of n alone
// (warp w owns keys [w chunk, (w + 1) chunk)).
__device__ __forceinline__ int attn_chunk(int n_keys) { return ((n_keys + kAttnWarps - 1) / kAttnWarps + 7) & ~7; }

// Shared memory of attend_row_head.
struct AttnShared {
  alignas(16) float qs[kAttnMaxD];  // 16-byte aligned: the scores read it as float4
  float wm[kAttnWarps], wl[kAttnWarps];
  float wacc[kAttnWarps][kAttnMaxD];
};

// kAttnWarps warps (tid = 0 .. 32 * kAttnWarps - 1) attend one (row, q head): keys [0,
// n_keys) of slot s, KV head kvh; sh.qs holds the q row once stage_q() has run and sync()
// (a barrier over exactly these warps) has passed; the output row (D values, BF16) goes to o.
// kPairs: dimension pairs per lane (D <= 64 * kPairs). kVec: D % 8 == 0 (16-byte K loads).
// kPaged: keys through the block tables (KVLayerView::table): lane j looks up key t0 + j's
// row, and the V rows of a tile take their offsets from the lanes by shuffle. Same
// arithmetic in the same order as the dense layout, so the same bits.
// fresh (>= 0): a key whose K/V rows stage_q() itself writes; the first tile's loads go out
// before stage_q(), so that key's rows are taken again after sync(), from fresh_kv (shared
// memory: its K row then its V row, D BF16 values each, the bits stored in the cache) when
// given, else from the cache (the rest of the tile was in the cache before the kernel began).
struct NoHook {
  __device__ void operator()() const {}
};
// before_loads() runs in every thread after the first tile's block-table lookup is issued
// and before its K/V loads: a kernel whose keys may include rows the kernel before it writes
// waits for it there (pdl_wait), so the lookup overlaps that kernel's tail.
template <int kPairs, bool kVec, bool kPaged, class StageQ, class Sync, class Before = NoHook>
__device__ __forceinline__ void attend_row_head(const KVLayerView& kv, int s, int n_keys, int kvh, int D, float scale,
                                                bf16* __restrict__ o, AttnShared& sh, int tid, StageQ stage_q,
                                                Sync sync, int fresh = -1, const bf16* fresh_kv = nullptr,
                                                unsigned long long* stamp = nullptr, Before before_loads = Before{}) {
  // Profiling (stamp non-null in thread 0 only): %globaltimer after the barrier, the scores,
  // the V sums and the warps' combine barrier.
  auto mark = [&](int k) {
    if (stamp) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      stamp[k] = t;
    }
  };
  constexpr int kWarps = kAttnWarps;
  constexpr int kThreads = 32 * kWarps;
  const int lane = tid & 31, warp = tid >> 5;
  // Scores in quads: lane (kg = lane / 4, part = lane % 4) scores key 8 sb + kg of each 8-key
  // sub-tile sb of a 32-key tile over its quarter of the dimensions (16-byte chunks c = 4 i +
  // part, in i order), and the quad's four partial dots meet in a fixed xor tree.
  const int kg = lane >> 2, part = lane & 3;
  // Warp w owns keys [k0, k1): the w-th of kWarps contiguous ranges of `chunk` keys, chunk a
  // multiple of 8 and a function of the row's length alone (8-key sub-tiles spread a short
  // row over every warp, and a warp skips the sub-tiles past its range).
  const int chunk = attn_chunk(n_keys);
  const int k0 = min(n_keys, warp * chunk), k1 = min(n_keys, k0 + chunk);
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

  // One tile: the lane's quarter of the K rows of keys t0 + kg, t0 + 8 + kg, ... and its
  // dimension pairs of the V rows of keys t0 .. t0 + 31, all loads issued together (one
  // memory round trip per tile; the first tile's go out before q is staged). D = 256 keeps
  // the V loads of the second half of the tile for its V loop (registers).
  constexpr int kSub = 4;                // 8-key sub-tiles per 32-key tile
  constexpr int kPartChunks = 2 * kPairs;  // 16-byte K chunks per lane and key (D <= 64 * kPairs)
  constexpr int kVKeys = kPairs <= 2 ? 32 : 16;
  uint4 kr[kSub][kPartChunks];
  uint32_t vr[kVKeys][kPairs];
  // Paged: the block-table lookup of a tile's keys is a load the K/V loads depend on; the
  // next tile's is issued with this tile's K/V loads (next_off), so from the second tile on
  // a tile costs one memory round trip, not two. Which rows are read is unchanged.
  [[maybe_unused]] int64_t next_off = 0;
  auto lookup = [&](int t0) -> int64_t {
    const int j = t0 + lane;
    return j < k1 ? kv_row_offset(kv, s, kvh, j, D) : 0;
  };
  if constexpr (kPaged)
    if (k0 < k1) next_off = lookup(k0);
  before_loads();
  auto load_tile = [&](int t0) {
    if constexpr (kPaged) {
      row_off = next_off;
      if (t0 + 32 < k1) next_off = lookup(t0 + 32);
    }
    if constexpr (kVec) {
#pragma unroll
      for (int sb = 0; sb < kSub; ++sb) {
        const int64_t off = key_row(t0, 8 * sb + kg);
        if (t0 + 8 * sb + kg < k1) {
          const uint4* k4 = reinterpret_cast<const uint4*>(K + off);
#pragma unroll
          for (int i = 0; i < kPartChunks; ++i)
            if (4 * i + part < D / 8) kr[sb][i] = k4[4 * i + part];
        }
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
  stage_q();
  sync();
  if (fresh >= k0 && fresh < min(k1, k0 + 32)) {  // warp-uniform: the first tile holds the fresh key
    const int u = fresh - k0;
    const int64_t off = key_row(k0, u);
    if constexpr (kVec) {
      // Selects, not a store at index u / 8: that would put kr in local memory.
      const bool mine = kg == (u & 7);
      uint4 fk[kPartChunks];
#pragma unroll
      for (int i = 0; i < kPartChunks; ++i) fk[i] = make_uint4(0, 0, 0, 0);
      if (mine) {
        const uint4* k4 = fresh_kv ? reinterpret_cast<const uint4*>(fresh_kv) : reinterpret_cast<const uint4*>(K + off);
#pragma unroll
        for (int i = 0; i < kPartChunks; ++i)
          if (4 * i + part < D / 8) fk[i] = k4[4 * i + part];
      }
#pragma unroll
      for (int sb = 0; sb < kSub; ++sb) {
        const bool hit = mine && sb == (u >> 3);
#pragma unroll
        for (int i = 0; i < kPartChunks; ++i) kr[sb][i] = hit ? fk[i] : kr[sb][i];
      }
    }
    const uint32_t* v2 = fresh_kv ? reinterpret_cast<const uint32_t*>(fresh_kv + D) : reinterpret_cast<const uint32_t*>(V + off);
#pragma unroll
    for (int uu = 0; uu < kVKeys; ++uu)
      if (uu == u)
#pragma unroll
        for (int i = 0; i < kPairs; ++i)
          if (2 * (lane + 32 * i) < D) vr[uu][i] = v2[lane + 32 * i];
  }
  const float* qs = sh.qs;
  mark(0);

  float m = -INFINITY, l = 0.0f;
  float acc[2 * kPairs];
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) acc[i] = 0.0f;
  for (int t0 = k0; t0 < k1; t0 += 32) {
    if (t0 != k0) load_tile(t0);
    // Scores: sub-tile sb's key t0 + 8 sb + kg, the quad's partial dots (sequential over the
    // lane's chunks) added as (p0 + p1) + (p2 + p3) in every lane of the quad alike.
    float sc[kSub];
#pragma unroll
    for (int sb = 0; sb < kSub; ++sb) {
      sc[sb] = -INFINITY;
      if (t0 + 8 * sb < k1) {  // warp-uniform
        const int j = t0 + 8 * sb + kg;
        [[maybe_unused]] const int64_t off = kVec ? 0 : key_row(t0, 8 * sb + kg);
        float dot = 0.0f;
        if (j < k1) {
          if constexpr (kVec) {
#pragma unroll
            for (int i = 0; i < kPartChunks; ++i) {
              const int c = 4 * i + part;
              if (c < D / 8) {
                const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&kr[sb][i]);
                const float4 qa = reinterpret_cast<const float4*>(qs)[2 * c];
                const float4 qb = reinterpret_cast<const float4*>(qs)[2 * c + 1];
                const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  const float2 f = __bfloat1622float2(p2[e]);
                  dot = fmaf(qv[2 * e], f.x, dot);
                  dot = fmaf(qv[2 * e + 1], f.y, dot);
                }
              }
            }
          } else {
            const bf16* kj = K + off;
            for (int d = part; d < D; d += 4) dot = fmaf(qs[d], __bfloat162float(kj[d]), dot);
          }
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        if (j < k1) sc[sb] = dot * scale;
      }
    }
    if (t0 == k0) mark(1);
    // Online softmax over the tile (key t0 is always valid: the max is finite). The tile's
    // sum: the lane's sub-tiles in order, then an xor tree over the eight keys of a sub-tile.
    float mt = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o2));
    const float m_new = fmaxf(m, mt);
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float p[kSub];
    float ps = 0.0f;
#pragma unroll
    for (int sb = 0; sb < kSub; ++sb) {
      p[sb] = t0 + 8 * sb + kg < k1 ? expf(sc[sb] - m_new) : 0.0f;
      ps += p[sb];
    }
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o2);
    l = l * corr + ps;
#pragma unroll
    for (int i = 0; i < 2 * kPairs; ++i) acc[i] *= corr;
    // V: keys t0 .. t0 + tn - 1 in order (lane l owns the dimension pairs l, l + 32, ...);
    // key u's weight is in lane 4 (u % 8), sub-tile u / 8.
    const int tn = min(32, k1 - t0);
#pragma unroll
    for (int u = 0; u < 32; ++u) {
      if (u < tn) {  // warp-uniform
        const float pj = __shfl_sync(0xffffffffu, p[u >> 3], (u & 7) << 2);
        const int64_t voff = u < kVKeys ? 0 : key_row(t0, u);  // rows past the registers' keys
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
    }
    m = m_new;
    if (t0 == k0) mark(2);
  }
  // The warps' (max, sum, V sum), combined in warp order (warps without keys add nothing).
  if (lane == 0) {
    sh.wm[warp] = m;
    sh.wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int pr = lane + 32 * i;
    if (2 * pr < D) {
      sh.wacc[warp][2 * pr] = acc[2 * i];
      sh.wacc[warp][2 * pr + 1] = acc[2 * i + 1];
    }
  }
  sync();
  mark(3);
  float mx = sh.wm[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, sh.wm[w]);
  float f[kWarps];
  float den = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    f[w] = sh.wl[w] > 0.0f ? expf(sh.wm[w] - mx) : 0.0f;
    den += sh.wl[w] * f[w];
  }
  const float inv = 1.0f / den;
  for (int d = tid; d < D; d += kThreads) {
    float num = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) num += sh.wacc[w][d] * f[w];
    o[d] = __float2bfloat16(num * inv);
  }
}

}  // namespace dsinfer::cuda::detail
