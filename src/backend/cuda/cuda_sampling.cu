// dsinfer CUDA backend: sampling distributions and speculative verification on the device
// (see cuda_sampling.h for the data flow and how the decisions match the host's).
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemv_impl.cuh"
#include "backend/cuda/cuda_sampling.h"

namespace dsinfer::cuda {

namespace {

constexpr int kT = 1024;  // threads per block (one block per row / item)
constexpr double kFixed = 72057594037927936.0;  // 2^56: fixed-point unit of the top-p masses

// The host's candidate order (sampler.cpp, by_logit): larger logit first, then lower id,
// which is the GEMM's argmax key (cuda_gemv_impl.cuh).
__device__ __forceinline__ unsigned long long skey(float v, int j) { return detail::argmax_key(v, j); }
__device__ __forceinline__ int id_from_key(unsigned long long k) { return static_cast<int>(0xffffffffu - (k & 0xffffffffu)); }

// Fixed-topology block reductions (the same tree every run: reproducible bits). T is double
// (masses) or unsigned long long (fixed-point counts).
template <class T>
__device__ T block_sum(T v, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  T t = lane < (kT >> 5) ? red[lane] : T(0);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;  // every thread (each warp reduces red[] the same way)
}
__device__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < (kT >> 5) ? red[lane] : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

struct SelectShared {
  unsigned long long hist[256];
  unsigned long long need;
  int sel;
};

// The key kappa of the row with  sum_{key > kappa} w < need <= sum_{key >= kappa} w  (keys are
// distinct): an 8-pass radix select from the top byte, with integer weights (counts, or
// fixed-point masses), so the histograms are exact whatever the order of the atomic adds.
template <class Wt>
__device__ unsigned long long radix_select(const float* __restrict__ l, int V, Wt wt, unsigned long long need,
                                           SelectShared& sh) {
  unsigned long long prefix = 0, mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kT) sh.hist[b] = 0ull;
    __syncthreads();
    for (int j = threadIdx.x; j < V; j += kT) {
      const unsigned long long key = skey(l[j], j);
      if ((key & mask) != prefix) continue;
      const unsigned long long w = wt(j, key);
      if (w) atomicAdd(&sh.hist[(key >> shift) & 255ull], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int b = 255;
      for (; b > 0; --b) {
        if (sh.hist[b] >= need) break;
        need -= sh.hist[b];
      }
      sh.sel = b;
      sh.need = need;
    }
    __syncthreads();
    prefix |= static_cast<unsigned long long>(sh.sel) << shift;
    mask |= 255ull << shift;
    need = sh.need;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kT) row_dist_kernel(const float* __restrict__ logits, int64_t ld, int V,
                                                      const int32_t* __restrict__ rows,
                                                      const SampleParamsDev* __restrict__ params,
                                                      RowDist* __restrict__ dist) {
  __shared__ SelectShared sh;
  __shared__ double red_d[32];
  __shared__ unsigned long long red_u[32];
  __shared__ float red_f[32];
  const int i = blockIdx.x;
  const SampleParamsDev P = params[i];
  RowDist d;
  if (!(P.temperature > 0.0f)) {
    if (threadIdx.x == 0) dist[i] = d;
    return;
  }
  const float* l = logits + static_cast<int64_t>(rows[i]) * ld;
  const double inv_t = 1.0 / static_cast<double>(P.temperature);
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += kT) m = fmaxf(m, l[j]);
  m = block_max(m, red_f);
  // The host's max is over the candidates, and the largest logit always is one.
  const double mx = static_cast<double>(m) * inv_t;
  auto e_of = [&](int j) { return exp(static_cast<double>(l[j]) * inv_t - mx); };
  // top-k: candidates are the k largest keys.
  unsigned long long kth = 0;
  if (P.top_k > 0 && P.top_k < V)
    kth = radix_select(l, V, [](int, unsigned long long) { return 1ull; }, static_cast<unsigned long long>(P.top_k), sh);
  double s = 0.0;
  for (int j = threadIdx.x; j < V; j += kT)
    if (skey(l[j], j) >= kth) s += e_of(j);
  const double sum = block_sum(s, red_d);
  unsigned long long thr = kth;
  double kept = sum;
  if (P.top_p < 1.0f) {
    // The smallest prefix of the candidates in key order whose mass e / sum reaches top_p.
    const double scale = kFixed / sum;
    auto w_of = [&](int j, unsigned long long key) -> unsigned long long {
      return key >= kth ? static_cast<unsigned long long>(llrint(e_of(j) * scale)) : 0ull;
    };
    unsigned long long tw = 0;
    for (int j = threadIdx.x; j < V; j += kT) tw += w_of(j, skey(l[j], j));
    const unsigned long long total = block_sum(tw, red_u);
    unsigned long long need = static_cast<unsigned long long>(llrint(static_cast<double>(P.top_p) * kFixed));
    if (need == 0) need = 1;
    if (total >= need) {  // else the host keeps every candidate (its sum never reached top_p)
      thr = radix_select(l, V, w_of, need, sh);
      double k2 = 0.0;
      for (int j = threadIdx.x; j < V; j += kT)
        if (skey(l[j], j) >= thr) k2 += e_of(j);
      kept = block_sum(k2, red_d);
    }
  }
  if (threadIdx.x == 0) {
    d.thr = thr;
    d.mx = mx;
    d.inv_t = inv_t;
    d.kept = kept;
    dist[i] = d;
  }
}

// p_j of a row as the host's sampling_distribution stores it (a float).
__device__ __forceinline__ float prob(const float* __restrict__ l, int j, const RowDist& d) {
  if (skey(l[j], j) < d.thr) return 0.0f;
  return static_cast<float>(exp(static_cast<double>(l[j]) * d.inv_t - d.mx) / d.kept);
}

struct SampleShared {
  double seg[kT];
  double total;
  int found, last;
};

// sample_from(values, u) of sampler.cpp over val(0 .. V-1): the first id (in id order) whose
// running sum passes u * total, else the last nonzero one. Each thread owns a contiguous
// segment; the segment sums are scanned in thread order.
template <class F>
__device__ int block_sample(int V, F val, double u, SampleShared& sh) {
  const int S = (V + kT - 1) / kT;
  const int j0 = threadIdx.x * S, j1 = min(V, j0 + S);
  double s = 0.0;
  for (int j = j0; j < j1; ++j) s += static_cast<double>(val(j));
  sh.seg[threadIdx.x] = s;
  if (threadIdx.x == 0) {
    sh.found = INT_MAX;
    sh.last = -1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double c = 0.0;
    for (int t = 0; t < kT; ++t) {
      const double v = sh.seg[t];
      sh.seg[t] = c;
      c += v;
    }
    sh.total = c;
  }
  __syncthreads();
  const double target = u * sh.total;
  double cum = sh.seg[threadIdx.x];
  int found = INT_MAX, last = -1;
  for (int j = j0; j < j1; ++j) {
    const float x = val(j);
    if (x <= 0.0f) continue;
    last = j;
    cum += static_cast<double>(x);
    if (target < cum) {
      found = j;
      break;
    }
  }
  if (found != INT_MAX) atomicMin(&sh.found, found);
  if (last >= 0) atomicMax(&sh.last, last);
  __syncthreads();
  const int r = sh.found != INT_MAX ? sh.found : max(sh.last, 0);
  __syncthreads();  // sh is reused by the next call
  return r;
}

__global__ void __launch_bounds__(kT) verify_kernel(const float* __restrict__ logits, int64_t ld, int V,
                                                    const unsigned long long* __restrict__ keys,
                                                    const RowDist* __restrict__ dist,
                                                    const VerifyItemDev* __restrict__ items,
                                                    const int32_t* __restrict__ drafts, const float* __restrict__ q,
                                                    const double* __restrict__ uniforms, int32_t* __restrict__ result) {
  __shared__ SampleShared sh;
  __shared__ double red[32];
  const VerifyItemDev it = items[blockIdx.x];
  const int32_t* dr = drafts + it.draft_off;
  if (it.greedy) {  // verify_drafts' greedy rule on the LM head's argmax keys; no uniforms
    if (threadIdx.x == 0) {
      int a = 0;
      while (a < it.n && dr[a] == id_from_key(keys[it.row0 + a])) ++a;
      result[2 * blockIdx.x] = a;
      result[2 * blockIdx.x + 1] = id_from_key(keys[it.row0 + a]);
    }
    return;
  }
  const double* u = uniforms + it.u_off;
  for (int i = 0; i < it.n; ++i) {
    const float* l = logits + static_cast<int64_t>(it.row0 + i) * ld;
    const RowDist D = dist[it.dist0 + i];
    const int d = dr[i];
    const float* qi = it.q_off >= 0 ? q + static_cast<int64_t>(it.q_off + i) * V : nullptr;
    const double qd = qi ? static_cast<double>(qi[d]) : 1.0;
    const double alpha = fmin(1.0, static_cast<double>(prob(l, d, D)) / fmax(qd, 1e-8));
    if (u[i] < alpha) continue;
    // Rejected: the normalised residual max(0, p - q) (as floats, as the host's r[]).
    auto resid = [&](int j) -> float {
      const double qj = qi ? static_cast<double>(qi[j]) : (j == d ? 1.0 : 0.0);
      return static_cast<float>(fmax(0.0, static_cast<double>(prob(l, j, D)) - qj));
    };
    double ms = 0.0;
    for (int j = threadIdx.x; j < V; j += kT) {
      const double qj = qi ? static_cast<double>(qi[j]) : (j == d ? 1.0 : 0.0);
      ms += fmax(0.0, static_cast<double>(prob(l, j, D)) - qj);
    }
    const double mass = block_sum(ms, red);
    const int tok = mass <= 1e-8 ? block_sample(V, [&](int j) { return prob(l, j, D); }, u[i + 1], sh)
                                 : block_sample(V, resid, u[i + 1], sh);
    if (threadIdx.x == 0) {
      result[2 * blockIdx.x] = i;
      result[2 * blockIdx.x + 1] = tok;
    }
    return;
  }
  const float* l = logits + static_cast<int64_t>(it.row0 + it.n) * ld;
  const RowDist D = dist[it.dist0 + it.n];
  const int tok = block_sample(V, [&](int j) { return prob(l, j, D); }, u[it.n], sh);
  if (threadIdx.x == 0) {
    result[2 * blockIdx.x] = it.n;
    result[2 * blockIdx.x + 1] = tok;
  }
}

}  // namespace

void row_dist(const float* logits, int64_t ld, int V, const int32_t* rows, const SampleParamsDev* params, int n_rows,
              RowDist* dist, cudaStream_t stream) {
  if (n_rows <= 0) return;
  row_dist_kernel<<<n_rows, kT, 0, stream>>>(logits, ld, V, rows, params, dist);
  DSINFER_CUDA_LAUNCHED("row_dist_kernel");
}

void verify_items(const float* logits, int64_t ld, int V, const unsigned long long* argmax_keys, const RowDist* dist,
                  const VerifyItemDev* items, int n_items, const int32_t* drafts, const float* q, const double* uniforms,
                  int32_t* result, cudaStream_t stream) {
  if (n_items <= 0) return;
  verify_kernel<<<n_items, kT, 0, stream>>>(logits, ld, V, argmax_keys, dist, items, drafts, q, uniforms, result);
  DSINFER_CUDA_LAUNCHED("verify_kernel");
}

}  // namespace dsinfer::cuda
