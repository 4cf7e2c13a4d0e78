// dsinfer CUDA backend: the attention kernel (see cuda_attention.h for the algorithm and
// why its result is batch-invariant).
#include <cmath>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_impl.cuh"
#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

namespace {

constexpr int kWarps = kAttnWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxD = detail::kAttnMaxD;
constexpr int kStamps = kAttnProfileStamps;

// One block per (row, q head); the arithmetic is detail::attend_row_head
// (cuda_attention_impl.cuh), shared with the persistent decode kernel.
template <int kPairs, bool kVec, bool kPaged>
__global__ void __launch_bounds__(kThreads)
    attention_kernel(const float* __restrict__ q, KVLayerView kv, const int32_t* __restrict__ slot,
                     const int32_t* __restrict__ pos, int NH, int NKVH, int D, float scale, bf16* __restrict__ out,
                     L2Prefetch prefetch) {
  __shared__ detail::AttnShared sh;
  pdl_trigger();
  l2_prefetch_part(prefetch, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y);
  // slot / pos (and the block tables) come from the host before the forward's first kernel:
  // readable before the wait, so the first tile's table lookup is issued before it too.
  const int r = blockIdx.y, h = blockIdx.x;
  const int s = slot[r];
  bf16* o = out + (static_cast<int64_t>(r) * NH + h) * D;
  if (s < 0) {
    pdl_wait();
    for (int d = threadIdx.x; d < D; d += kThreads) o[d] = __float2bfloat16(0.0f);
    return;
  }
  const float* qr = q + (static_cast<int64_t>(r) * NH + h) * D;
  detail::attend_row_head<kPairs, kVec, kPaged>(
      kv, s, pos[r] + 1, h / (NH / NKVH), D, scale, o, sh, threadIdx.x,
      [&] {
        for (int d = threadIdx.x; d < D; d += kThreads) sh.qs[d] = qr[d];
      },
      [] { __syncthreads(); }, -1, nullptr, nullptr, [] { pdl_wait(); });
}

// attention_kernel with the q/k step in its prologue (attention_rows_fold_qk).
template <int kPairs, bool kPaged>
__global__ void __launch_bounds__(kThreads)
    attention_fold_qk_kernel(const float* __restrict__ qkv, const float* __restrict__ q_norm,
                             const float* __restrict__ k_norm, float eps, const float* __restrict__ cos_t,
                             const float* __restrict__ sin_t, KVLayerView kv, const int32_t* __restrict__ slot,
                             const int32_t* __restrict__ pos, int NH, int NKVH, int D, float scale,
                             bf16* __restrict__ out, unsigned long long* __restrict__ timing) {
  unsigned long long* stamp = timing && blockIdx.y == 0 && threadIdx.x == 0 ? timing + kStamps * blockIdx.x : nullptr;
  auto now = [] {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  if (stamp) stamp[0] = now();
  __shared__ detail::AttnShared sh;
  __shared__ __align__(16) bf16 fresh_kv[2 * kMaxD];  // the new K row, then V row (BF16, as cached)
  pdl_trigger();
  // slot / pos come from the host before the forward's first kernel: readable before the wait.
  const int r = blockIdx.y, h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s = slot[r], p = pos[r];
  bf16* o = out + (static_cast<int64_t>(r) * NH + h) * D;
  if (s < 0) {
    pdl_wait();
    for (int d = threadIdx.x; d < D; d += kThreads) o[d] = __float2bfloat16(0.0f);
    return;
  }
  const int kvh = h / (NH / NKVH), half = D / 2;
  const float* row = qkv + static_cast<int64_t>(r) * (NH + 2 * NKVH) * D;
  const float* c = cos_t + static_cast<int64_t>(r) * half;
  const float* sn = sin_t + static_cast<int64_t>(r) * half;
  auto cs = [&](int i, float* cv, float* sv) {
    *cv = c[i];
    *sv = sn[i];
  };
  // The first tile of old keys is loaded before the wait (those rows were in the cache
  // before the kernel began); the q/k step runs in stage_q, after the wait, and leaves the
  // new K/V rows (position p) in shared memory too, from where the warp holding key p takes
  // them after the barrier.
  detail::attend_row_head<kPairs, true, kPaged>(
      kv, s, p + 1, kvh, D, scale, o, sh, threadIdx.x,
      [&] {
        // The q/k step's constants (the row's RoPE entry, the head's norm weights: 128-byte
        // lines) are asked into the L1 before the wait, without waiting for them (a load
        // here would hold the warp behind the previous GEMM's DRAM stream: session 24), so
        // that after the wait the QKV row is the step's only round trip to the L2.
        if (warp < 2) {
          const int half_lines = (half * 4 + 127) / 128, w_lines = (D * 4 + 127) / 128;
          const float* w = warp == 0 ? q_norm : k_norm;
          const char* line = nullptr;
          if (lane < half_lines) line = reinterpret_cast<const char*>(c) + 128 * lane;
          else if (lane < 2 * half_lines) line = reinterpret_cast<const char*>(sn) + 128 * (lane - half_lines);
          else if (lane < 2 * half_lines + w_lines) line = reinterpret_cast<const char*>(w) + 128 * (lane - 2 * half_lines);
          if (line) asm volatile("prefetch.global.L1 [%0];" ::"l"(line));
        }
        pdl_wait();
        if (stamp) stamp[1] = now();
        if (warp == 0) {
          const float* src = row + static_cast<int64_t>(h) * D;
          detail::qk_norm_rope_head([&](int i) { return src[i]; }, q_norm, eps, D, cs, sh.qs, nullptr, lane);
          if (stamp) stamp[2] = now();
        } else if (warp == 1) {
          const float* src = row + static_cast<int64_t>(NH + kvh) * D;
          bf16* dst = kv.k + kv_row_offset(kv, s, kvh, p, D);
          detail::qk_norm_rope_head([&](int i) { return src[i]; }, k_norm, eps, D, cs, nullptr, fresh_kv, lane);
          __syncwarp();
          for (int i = lane; i < D; i += 32) dst[i] = fresh_kv[i];
        } else if (warp == 2) {
          const float* src = row + static_cast<int64_t>(NH + NKVH + kvh) * D;
          bf16* dst = kv.v + kv_row_offset(kv, s, kvh, p, D);
          for (int i = lane; i < D; i += 32) {
            const bf16 v = __float2bfloat16(src[i]);
            fresh_kv[D + i] = v;
            dst[i] = v;
          }
        }
      },
      [] { __syncthreads(); }, p, fresh_kv, stamp ? stamp + 4 : nullptr);
  if (stamp) stamp[3] = now();
}

template <int kPairs, bool kPaged>
void launch_layout(dim3 grid, cudaStream_t stream, const float* q, KVLayerView kv, const int32_t* slot,
                   const int32_t* pos, int NH, int NKVH, int D, float scale, bf16* out, L2Prefetch pf) {
  if (D % 8 == 0)
    launch_pdl(PdlSite::Attention, attention_kernel<kPairs, true, kPaged>, grid, dim3(kThreads), 0, stream, q, kv, slot, pos, NH, NKVH, D,
               scale, out, pf);
  else
    launch_pdl(PdlSite::Attention, attention_kernel<kPairs, false, kPaged>, grid, dim3(kThreads), 0, stream, q, kv, slot, pos, NH, NKVH, D,
               scale, out, pf);
}

template <int kPairs>
void launch(dim3 grid, cudaStream_t stream, const float* q, KVLayerView kv, const int32_t* slot, const int32_t* pos,
            int NH, int NKVH, int D, float scale, bf16* out, L2Prefetch pf) {
  if (kv.table) launch_layout<kPairs, true>(grid, stream, q, kv, slot, pos, NH, NKVH, D, scale, out, pf);
  else launch_layout<kPairs, false>(grid, stream, q, kv, slot, pos, NH, NKVH, D, scale, out, pf);
}

template <int kPairs>
void launch_fold(dim3 grid, cudaStream_t stream, const float* qkv, const float* q_norm, const float* k_norm, float eps,
                 const float* cos_t, const float* sin_t, KVLayerView kv, const int32_t* slot, const int32_t* pos,
                 int NH, int NKVH, int D, float scale, bf16* out, unsigned long long* timing) {
  if (kv.table)
    launch_pdl(PdlSite::Attention, attention_fold_qk_kernel<kPairs, true>, grid, dim3(kThreads), 0, stream, qkv, q_norm, k_norm, eps, cos_t,
               sin_t, kv, slot, pos, NH, NKVH, D, scale, out, timing);
  else
    launch_pdl(PdlSite::Attention, attention_fold_qk_kernel<kPairs, false>, grid, dim3(kThreads), 0, stream, qkv, q_norm, k_norm, eps, cos_t,
               sin_t, kv, slot, pos, NH, NKVH, D, scale, out, timing);
}

}  // namespace

void attention_rows_fold_qk(const float* qkv, const float* q_norm, const float* k_norm, float eps, const float* cos_t,
                            const float* sin_t, KVLayerView kv, const int32_t* slot, const int32_t* pos, int T, int NH,
                            int NKVH, int D, float scale, bf16* out, cudaStream_t stream, unsigned long long* timing) {
  if (T <= 0) return;
  if (D > kMaxD || D % 8 != 0 || NKVH <= 0 || NH % NKVH != 0)
    throw Error("CUDA attention (q/k folded): head_dim " + std::to_string(D) + " / heads " + std::to_string(NH) +
                " / kv heads " + std::to_string(NKVH) + " not supported (head_dim a multiple of 8, <= 256)");
  const dim3 grid(NH, T);
  if (D <= 64) launch_fold<1>(grid, stream, qkv, q_norm, k_norm, eps, cos_t, sin_t, kv, slot, pos, NH, NKVH, D, scale, out, timing);
  else if (D <= 128) launch_fold<2>(grid, stream, qkv, q_norm, k_norm, eps, cos_t, sin_t, kv, slot, pos, NH, NKVH, D, scale, out, timing);
  else launch_fold<4>(grid, stream, qkv, q_norm, k_norm, eps, cos_t, sin_t, kv, slot, pos, NH, NKVH, D, scale, out, timing);
  DSINFER_CUDA_LAUNCHED("attention_fold_qk_kernel");
}

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
