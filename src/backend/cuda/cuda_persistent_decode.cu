// dsinfer CUDA backend: the persistent decode kernel (see cuda_persistent_decode.h for what
// it computes, why, and the bit-identity rules it keeps).
//
// Block layout: warps 0 .. 7 consume (GEMV pairs, the RMSNorm staging, attention of one
// head), warp 8 produces (its lane 0 streams weight tiles). A GEMV's N outputs are cut into
// feature pairs; the pairs are dealt out to the blocks in equal contiguous shares (the odd
// ones rotate from op to op, so no block gets all of them); a block's share is walked in
// groups of 8 pairs (one per consumer warp), each group in K-chunks of kc elements (a
// multiple of 256, so a lane's chunks stay in the row kernel's order across K-chunks): a
// tile is the group's 16 row segments of one K-chunk, one cp.async.bulk per segment, and
// all eight warps work on every tile (a long row no longer leaves one warp per tile). Ring
// protocol per slot: `full` (count 1 + the tile's bytes) completes when the copy landed;
// `empty` (count 8) completes when every consumer warp is done with the tile. Every warp
// steps through every tile (waits, arrives) even without a pair in it, so no warp is ever
// more than one phase of a slot ahead (mbarrier waits are by phase parity).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_attention_impl.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemv_impl.cuh"
#include "backend/cuda/cuda_persistent_decode.h"

namespace dsinfer::cuda {

namespace {

constexpr int kConsumers = kAttnWarps;  // attention needs exactly these warps
constexpr int kConsumerThreads = 32 * kConsumers;
constexpr int kThreads = kConsumerThreads + 32;
constexpr int kMaxSlots = 8;
constexpr int kMinSlotBytes = 48 * 1024;
using detail::kNormThreads;  // the row kernel's RMSNorm reduction (cuda_gemv_impl.cuh)

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory"); }
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every consumer of every block gets here before any goes on; writes before are visible
// after (release / acquire at the GPU scope). Activations written inside the kernel are then
// read with ld.cg (L2), never through a possibly stale L1 line.
__device__ void grid_barrier(unsigned* ctr, unsigned target, unsigned long long* arrived) {
  consumers_sync();
  if (threadIdx.x == 0) {
    if (arrived) *arrived = global_ns();  // profiling: when this block's consumers got here
    __threadfence();
    atomicAdd(ctr, 1u);
    const unsigned long long t0 = global_ns();
    for (unsigned i = 1;; ++i) {
      unsigned v;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
      if (v >= target) break;
      if ((i & 1023u) == 0 && global_ns() - t0 > 1000000000ull) __trap();  // a block never came: not resident
    }
    __threadfence();
  }
  consumers_sync();
}

using detail::argmax_key;
using detail::add_squares;
using detail::silu_mul;
using detail::unpack8;

// This block's share [j0, j1) of `pairs` feature pairs; the remainder's extra pairs go to the
// blocks from `rot` on (rot then moves past them, so the next op starts where this one ended).
struct Share {
  int j0, j1;
};
__device__ __forceinline__ Share block_share(int pairs, int& rot) {
  const int G = gridDim.x;
  const int per = pairs / G, extra = pairs % G;
  const int b = (static_cast<int>(blockIdx.x) - rot + G) % G;
  Share s;
  s.j0 = b * per + min(b, extra);
  s.j1 = s.j0 + per + (b < extra ? 1 : 0);
  rot = (rot + extra) % G;
  return s;
}
constexpr int kGroup = kConsumers;  // pairs per tile: one per consumer warp

struct RingState {
  unsigned char* ring;
  int slot_bytes, slots;
  int kc;  // elements of a K-chunk: a multiple of 256 (32 lanes x 8), so lanes keep their order
  uint64_t* full;
  uint64_t* empty;
};

// Producer: lane 0 of the last warp copies every tile of every GEMV op of this block, in the
// consumers' order, as soon as its slot is free.
__device__ void produce(const PersistentOp* __restrict__ ops, int n_ops, const RingState& r) {
  unsigned t = 0;
  int rot = 0;
  for (int i = 0; i < n_ops; ++i) {
    if (ops[i].kind != PersistentOp::Gemv) continue;
    const bf16* W = ops[i].W;
    const int K = ops[i].K;
    const Share sh = block_share(ops[i].N / 2, rot);
    for (int g = sh.j0; g < sh.j1; g += kGroup) {
      const int np = min(kGroup, sh.j1 - g);
      for (int k0 = 0; k0 < K; k0 += r.kc, ++t) {
        const int kc = min(r.kc, K - k0);
        const int slot = static_cast<int>(t % r.slots);
        if (t >= static_cast<unsigned>(r.slots)) mbar_wait(&r.empty[slot], ((t / r.slots) - 1) & 1);
        const unsigned seg = static_cast<unsigned>(kc) * 2u;  // bytes of one row's chunk
        mbar_expect_tx(&r.full[slot], seg * 2u * static_cast<unsigned>(np));
        unsigned char* dst = r.ring + static_cast<size_t>(slot) * r.slot_bytes;
        for (int rr = 0; rr < 2 * np; ++rr)
          bulk_copy(dst + static_cast<size_t>(rr) * seg, W + (static_cast<int64_t>(2) * g + rr) * K + k0, seg, &r.full[slot]);
      }
    }
  }
}

// Consumers: one GEMV op. A is staged into As (BF16) as the row kernel stages it; then the
// block's pairs, tile by tile.
__device__ void gemv(const PersistentOp& op, const PersistentParams& p, const RingState& r, bf16* As, float* red,
                     unsigned& t, int& rot) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = op.K, K8 = K / 8;
  uint4* A4 = reinterpret_cast<uint4*>(As);
  if (op.input == PersistentOp::InRmsNorm) {
    const float4* x4 = reinterpret_cast<const float4*>(p.x);
    if (tid < kNormThreads) {
      // Thread t sums float4 groups t, t + 128, ... in order; xor tree; warps 0..3 in order.
      float ss = 0.0f;
      for (int c = tid; c < K / 4; c += kNormThreads) {
        const float4 v = __ldcg(x4 + c);
        ss = add_squares(v, ss);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) red[warp] = ss;
    }
    consumers_sync();
    float ss = 0.0f;
    for (int w = 0; w < kNormThreads / 32; ++w) ss += red[w];
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(K) + p.eps);
    const float4* w4 = reinterpret_cast<const float4*>(op.norm_w);
    for (int c = tid; c < K8; c += kConsumerThreads) {
      const float4 a0 = __ldcg(x4 + 2 * c), a1 = __ldcg(x4 + 2 * c + 1);
      const float4 b0 = __ldg(w4 + 2 * c), b1 = __ldg(w4 + 2 * c + 1);
      const float xs[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float ys[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      __nv_bfloat162 o[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float lo = ys[2 * j] * (xs[2 * j] * inv);
        const float hi = ys[2 * j + 1] * (xs[2 * j + 1] * inv);
        o[j] = __floats2bfloat162_rn(lo, hi);
      }
      A4[c] = *reinterpret_cast<const uint4*>(o);
    }
  } else {
    const uint4* in4 = reinterpret_cast<const uint4*>(op.in_bf16);
    for (int c = tid; c < K8; c += kConsumerThreads) A4[c] = __ldcg(in4 + c);
  }
  consumers_sync();

  const Share sh = block_share(op.N / 2, rot);
  unsigned long long best = 0ull;
  for (int g = sh.j0; g < sh.j1; g += kGroup) {
    const int np = min(kGroup, sh.j1 - g);
    const bool mine = warp < np;  // this warp's pair: g + warp
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int k0 = 0; k0 < K; k0 += r.kc, ++t) {
      const int kc = min(r.kc, K - k0);
      // Every warp waits for every tile, with or without a pair in it: a parity wait only
      // tells apart adjacent phases, so a warp that skipped a tile could otherwise pass on a
      // phase two behind (and the producer could lap it).
      const int slot = static_cast<int>(t % r.slots);
      mbar_wait(&r.full[slot], (t / r.slots) & 1);
      if (mine) {
        const bf16* tile = reinterpret_cast<const bf16*>(r.ring + static_cast<size_t>(slot) * r.slot_bytes);
        const uint4* w0 = reinterpret_cast<const uint4*>(tile + static_cast<int64_t>(2 * warp) * kc);
        const uint4* w1 = reinterpret_cast<const uint4*>(tile + static_cast<int64_t>(2 * warp + 1) * kc);
        const uint4* a4 = A4 + k0 / 8;
        // Lane l: chunks l, l + 32, ... of this K-chunk; k0 is a multiple of 256, so across
        // K-chunks the lane sums the row kernel's chunks l, l + 32, ... in the same order.
#pragma unroll 2
        for (int c = lane; c < kc / 8; c += 32) {
          float a[8], f0[8], f1[8];
          unpack8(a4[c], a);
          unpack8(w0[c], f0);
          unpack8(w1[c], f1);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            acc0 = fmaf(a[e], f0[e], acc0);
            acc1 = fmaf(a[e], f1[e], acc1);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&r.empty[slot], 1);
    }
    if (!mine) continue;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      acc0 += __shfl_xor_sync(0xffffffffu, acc0, s);
      acc1 += __shfl_xor_sync(0xffffffffu, acc1, s);
    }
    if (lane == 0) {
      const int n = 2 * (g + warp);
      switch (op.output) {
        case PersistentOp::OutSet:
          op.y[n] = acc0;
          op.y[n + 1] = acc1;
          break;
        case PersistentOp::OutAdd:
          op.y[n] = __ldcg(op.y + n) + acc0;
          op.y[n + 1] = __ldcg(op.y + n + 1) + acc1;
          break;
        case PersistentOp::OutSilu: op.act[n / 2] = __float2bfloat16(silu_mul(acc0, acc1)); break;
        default:  // OutHead
          op.y[n] = acc0;
          op.y[n + 1] = acc1;
          if (p.keys) {
            const unsigned long long k0 = argmax_key(acc0, n), k1 = argmax_key(acc1, n + 1);
            best = k0 > best ? k0 : best;
            best = k1 > best ? k1 : best;
          }
      }
    }
  }
  if (op.output == PersistentOp::OutHead && p.keys && lane == 0 && best) atomicMax(p.keys, best);
}

// Consumers of blocks h < NH (and h + grid, ...): the q/k step and attention of q head h.
template <int kPairs>
__device__ void attention(const PersistentOp& op, const PersistentParams& p, detail::AttnShared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int s = *p.slot, pos = *p.pos, D = p.D, NH = p.NH, NKVH = p.NKVH;
  const float* qkv = p.qkv;
  auto cs = [&](int i, float* c, float* sn) { detail::rope_cos_sin(pos, p.inv_freq[i], p.attention_factor, c, sn); };
  for (int h = blockIdx.x; h < NH; h += gridDim.x) {
    const int kvh = h / (NH / NKVH);
    // Each of a KV head's q-head blocks writes its (same) K/V row: no block waits on another.
    if (warp == 0) {
      const float* src = qkv + static_cast<int64_t>(h) * D;
      detail::qk_norm_rope_head([&](int i) { return __ldcg(src + i); }, op.q_norm, p.eps, D, cs, sh.qs, nullptr, lane);
    } else if (warp == 1) {
      const float* src = qkv + static_cast<int64_t>(NH + kvh) * D;
      detail::qk_norm_rope_head([&](int i) { return __ldcg(src + i); }, op.k_norm, p.eps, D, cs, nullptr,
                                op.kv.k + kv_row_offset(op.kv, s, kvh, pos, D), lane);
    } else if (warp == 2) {
      const float* src = qkv + static_cast<int64_t>(NH + NKVH + kvh) * D;
      bf16* dst = op.kv.v + kv_row_offset(op.kv, s, kvh, pos, D);
      for (int i = lane; i < D; i += 32) dst[i] = __float2bfloat16(__ldcg(src + i));
    }
    consumers_sync();  // q staged, this block's K/V row written
    bf16* o = p.attb + static_cast<int64_t>(h) * D;
    if (op.kv.table)
      detail::attend_row_head<kPairs, true, true>(op.kv, s, pos + 1, kvh, D, p.scale, o, sh, tid, [] {}, consumers_sync);
    else
      detail::attend_row_head<kPairs, true, false>(op.kv, s, pos + 1, kvh, D, p.scale, o, sh, tid, [] {}, consumers_sync);
  }
}

template <int kPairs>
// 9 warps: the SM's four register files take warps round-robin, one holds 3 warps, so 168
// registers per thread at most (more compiles but never launches).
__global__ void __launch_bounds__(kThreads, 1)
    persistent_decode_kernel(const PersistentOp* __restrict__ ops, int n_ops, PersistentParams p, int slot_bytes,
                             int slots, int kc) {
  extern __shared__ __align__(128) unsigned char dyn[];
  __shared__ __align__(8) uint64_t full[kMaxSlots], empty[kMaxSlots];
  __shared__ float red[kNormThreads / 32];
  __shared__ detail::AttnShared attn_sh;
  RingState r{dyn, slot_bytes, slots, kc, full, empty};
  bf16* As = reinterpret_cast<bf16*>(dyn + static_cast<size_t>(slots) * slot_bytes);
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  if (warp == kConsumers) {
    if ((threadIdx.x & 31) == 0) produce(ops, n_ops, r);
    return;
  }
  unsigned t = 0, target = 0;
  int rot = 0;
  const int tid = threadIdx.x;
  unsigned long long* tm = p.timing;
  if (tm && tid == 0 && blockIdx.x == 0) tm[0] = global_ns();
  for (int i = 0; i < n_ops; ++i) {
    const PersistentOp op = ops[i];
    if (op.kind == PersistentOp::Embed) {
      const bf16* row = p.embed + static_cast<int64_t>(*p.token) * p.H;
      for (int c = blockIdx.x * kConsumerThreads + tid; c < p.H; c += gridDim.x * kConsumerThreads)
        p.x[c] = __bfloat162float(row[c]);
    } else if (op.kind == PersistentOp::Attention) {
      attention<kPairs>(op, p, attn_sh);
    } else {
      gemv(op, p, r, As, red, t, rot);
    }
    unsigned long long* arrived = tm ? tm + 1 + n_ops + static_cast<int64_t>(i) * gridDim.x + blockIdx.x : nullptr;
    if (i + 1 < n_ops) {
      target += gridDim.x;
      grid_barrier(p.barrier, target, arrived);
    } else if (arrived) {
      consumers_sync();
      if (tid == 0) *arrived = global_ns();
    }
    if (tm && tid == 0 && blockIdx.x == 0) tm[1 + i] = global_ns();
    if (op.capture >= 0) {  // x after this op; nobody writes x before the next barrier
      float* dst = p.cap + static_cast<int64_t>(op.capture) * p.H;
      for (int c = blockIdx.x * kConsumerThreads + tid; c < p.H; c += gridDim.x * kConsumerThreads)
        dst[c] = __ldcg(p.x + c);
    }
  }
}

struct Plan {
  int slot_bytes = 0, slots = 0, dyn = 0;
  int kc = 0;  // K-chunk (elements) of a tile of kGroup pairs
};

// The ring for the largest K (cached per kernel instance: launches are captured in graphs).
int min_slot_bytes() {
  static int v = -1;
  if (v < 0) {
    v = kMinSlotBytes;
    if (const char* e = std::getenv("DSINFER_CUDA_PERSISTENT_SLOT_KB")) {
      char* end = nullptr;
      const long kb = std::strtol(e, &end, 10);
      if (end == e || *end != '\0' || kb < 8 || kb > 112)
        throw Error(std::string("DSINFER_CUDA_PERSISTENT_SLOT_KB must be a whole number of KB in [8, 112], not '") + e + "'");
      v = static_cast<int>(kb) * 1024;
    }
  }
  return v;
}

template <int kPairs>
Plan plan_for(int max_k, const char** why) {
  static int cached_k = -1;
  static Plan cached;
  static const char* cached_why = nullptr;
  if (cached_k == max_k) {
    if (why && cached_why) *why = cached_why;
    return cached;
  }
  static int optin = 0, sms = 0;
  if (optin == 0) {
    int dev = 0;
    DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  cudaFuncAttributes fa{};
  DSINFER_CUDA_CHECK(cudaFuncGetAttributes(&fa, persistent_decode_kernel<kPairs>));
  Plan pl;
  const int a_bytes = ((max_k * 2 + 127) / 128) * 128;
  const int budget = optin - static_cast<int>(fa.sharedSizeBytes) - a_bytes;
  // A tile: kGroup pairs (2 kGroup rows) x a K-chunk of kc elements, kc a multiple of 256.
  pl.slot_bytes = ((std::max(min_slot_bytes(), 4 * kGroup * 256) + 127) / 128) * 128;
  pl.kc = (pl.slot_bytes / (4 * kGroup)) / 256 * 256;
  pl.slots = std::min(kMaxSlots, budget / pl.slot_bytes);
  if (pl.slots < 2) {
    cached_why = "the activation row and two ring slots do not fit the shared memory";
    if (why) *why = cached_why;
    pl.slots = 0;
  } else {
    pl.dyn = pl.slots * pl.slot_bytes + a_bytes;
  }
  cached_k = max_k;
  cached = pl;
  return pl;
}

template <int kPairs>
void launch(const PersistentOp* ops, int n_ops, int max_k, const PersistentParams& p, cudaStream_t stream) {
  const Plan pl = plan_for<kPairs>(max_k, nullptr);
  if (pl.slots == 0) throw Error("persistent decode: shape not supported (K = " + std::to_string(max_k) + ")");
  auto kernel = persistent_decode_kernel<kPairs>;
  static int sms = 0;
  raise_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<size_t>(pl.dyn));
  if (sms == 0) {
    int dev = 0;
    DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int per_sm = 0;
    DSINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, pl.dyn));
    if (per_sm < 1) throw Error("persistent decode: the kernel cannot be resident on an SM");
  }
  DSINFER_CUDA_CHECK(cudaMemsetAsync(p.barrier, 0, sizeof(unsigned), stream));
  kernel<<<sms, kThreads, pl.dyn, stream>>>(ops, n_ops, p, pl.slot_bytes, pl.slots, pl.kc);
  DSINFER_CUDA_LAUNCHED("persistent_decode_kernel");
}

}  // namespace

bool persistent_decode_supported(int D, int max_k, int NH, const char** why) {
  if (D % 8 != 0 || D > detail::kAttnMaxD) {
    if (why) *why = "head_dim must be a multiple of 8 and at most 256";
    return false;
  }
  if (max_k % 8 != 0) {
    if (why) *why = "every GEMV's K must be a multiple of 8";
    return false;
  }
  if (NH < 1) return false;
  int dev = 0, major = 0;
  DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
  DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9) {
    if (why) *why = "needs sm_90 (bulk copies, mbarrier transactions)";
    return false;
  }
  const Plan pl = D <= 64 ? plan_for<1>(max_k, why) : D <= 128 ? plan_for<2>(max_k, why) : plan_for<4>(max_k, why);
  return pl.slots > 0;
}

int persistent_decode_grid() {
  int dev = 0, sms = 0;
  DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
  DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

void persistent_decode(const PersistentOp* ops, int n_ops, int max_k, const PersistentParams& p, cudaStream_t stream) {
  if (p.D <= 64) launch<1>(ops, n_ops, max_k, p, stream);
  else if (p.D <= 128) launch<2>(ops, n_ops, max_k, p, stream);
  else launch<4>(ops, n_ops, max_k, p, stream);
}

}  // namespace dsinfer::cuda
