// dsinfer CUDA backend: the row-wise kernels of the Qwen3 forward (everything but the GEMMs
// and attention). Each launcher enqueues one kernel on `stream` and checks the launch.
//
// Data flow of one layer (qwen3_cuda.cpp): x f32 [T, H] --rmsnorm_rows--> h bf16 --GEMM-->
// qkv f32 [T, (NQ + 2 NKV)] --qk_norm_rope_store--> q f32 [T, NQ] + K/V (bf16) written into
// the device cache at each row's (slot, position) --attention--> ... --GEMM += x-->
// rmsnorm_rows --GEMM--> gate|up f32 [T, 2I] --silu_mul_rows--> act bf16 --GEMM += x.
//
// Batch invariance: every kernel computes a row (or a (row, head)) with a reduction order
// fixed by the row's own sizes; the number of rows only sets the grid.
// Formulas follow the CPU kernels (src/kernels/cpu/rmsnorm.cpp, rope.cpp, silu_mul.cpp):
// y = w * (x * (1 / sqrt(mean(x^2) + eps))); RoPE cos/sin of the F32 angle pos * inv_freq
// evaluated in double; silu(g) * u = g / (1 + exp(-g)) * u.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::cuda {

using bf16 = __nv_bfloat16;

// x[r, :] = table[tokens[r], :] as F32.
void embed_rows(const bf16* table, int64_t H, const int32_t* tokens, int T, float* x, cudaStream_t stream);

// y[r, :] = bf16(w * (x[src(r), :] * inv_rms)), src(r) = row_index ? row_index[r] : r.
void rmsnorm_rows(const float* x, int64_t x_stride, const int32_t* row_index, int rows, int n, const float* w,
                  float eps, bf16* y, int64_t y_stride, cudaStream_t stream);

// cos/sin [T, half], scaled by attention_factor (as kernels/cpu/rope.h's rope_tables).
void rope_table(const float* inv_freq, int half, const int32_t* pos, int T, float attention_factor, float* cos_t,
                float* sin_t, cudaStream_t stream);

// Device KV cache geometry of one layer, BF16. Dense (table == nullptr):
// [slots][kv_heads][max_tokens][head_dim], position p of slot s in row p of the slot. Paged
// (table != nullptr, cuda_paged_kv_cache.h): [blocks][kv_heads][block_size][head_dim],
// position p of slot s in block table[s * table_stride + p / block_size], row p % block_size.
struct KVLayerView {
  bf16* k = nullptr;
  bf16* v = nullptr;
  int64_t slot_stride = 0;  // elements between slots (dense) or between blocks (paged)
  int64_t head_stride = 0;  // elements between KV heads of one slot / block
  const int32_t* table = nullptr;  // device block tables [slots][table_stride], or nullptr
  int table_stride = 0;
  int block_size = 0;
};

// A byte range of constant data (weights) that a kernel asks the L2 to fetch while it runs
// (bulk L2 prefetch, sm_90: cp.async.bulk.prefetch.L2): at batch-1 decode the latency-bound
// kernels (q/k norm, attention) and every GEMV's ramp-up and tail leave the DRAM idle, so
// the next GEMV's first weights are fetched then and it starts on L2 hits. A hint: nothing
// waits for it, and it changes no result. bytes is rounded down to 16 (the instruction's
// granule); p must be 16-byte aligned (weights are).
struct L2Prefetch {
  const void* p = nullptr;
  unsigned long long bytes = 0;
};

#ifdef __CUDACC__
// The part `part` of `parts` equal shares of pf, one 16 KB bulk prefetch per thread of the
// calling block at a time. Fire and forget: the block may exit before the data arrives.
__device__ __forceinline__ void l2_prefetch_part(const L2Prefetch& pf, int part, int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (pf.bytes < 16 || parts <= 0) return;
  constexpr unsigned long long kChunk = 16384;
  const unsigned long long bytes = pf.bytes & ~15ull;
  const unsigned long long chunks = (bytes + kChunk - 1) / kChunk;
  const unsigned long long per = (chunks + parts - 1) / parts;
  const unsigned long long c1 = min(chunks, (part + 1) * per);
  for (unsigned long long c = part * per + threadIdx.x; c < c1; c += blockDim.x) {
    const unsigned long long off = c * kChunk;
    const unsigned size = static_cast<unsigned>(min(kChunk, bytes - off));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(pf.p) + off), "r"(size)
                 : "memory");
  }
#else
  (void)pf;
  (void)part;
  (void)parts;
#endif
}

// Element offset (into k or v) of the head_dim-long row of (slot s, KV head kvh, position p).
__device__ __forceinline__ int64_t kv_row_offset(const KVLayerView& kv, int s, int kvh, int p, int D) {
  if (kv.table) {
    const int64_t b = kv.table[static_cast<int64_t>(s) * kv.table_stride + p / kv.block_size];
    return b * kv.slot_stride + kvh * kv.head_stride + static_cast<int64_t>(p % kv.block_size) * D;
  }
  return s * kv.slot_stride + kvh * kv.head_stride + static_cast<int64_t>(p) * D;
}
#endif

// qkv f32 [T, (NH + 2 NKVH) * D] (q heads, then k heads, then v heads). Per head: q and k
// are RMS-normed over D with q_norm / k_norm and rotated (rotate-half RoPE at the row's
// position); q goes to q_out f32 [T, NH * D]; k and v go to the cache at (slot[r], pos[r])
// as BF16 (dense or through the block tables, KVLayerView). Rows with slot < 0 (graph
// padding) write q only.
void qk_norm_rope_store(const float* qkv, int T, int NH, int NKVH, int D, const float* q_norm, const float* k_norm,
                        float eps, const float* cos_t, const float* sin_t, const int32_t* slot, const int32_t* pos,
                        float* q_out, KVLayerView kv, cudaStream_t stream, L2Prefetch prefetch = {});

// A kernel that only asks the L2 for a and then b (blocks x 128 threads): the side-stream
// form of the decode step's weight prefetch (qwen3_cuda.cpp), run beside the q/k kernel and
// attention instead of inside them.
void l2_prefetch(L2Prefetch a, L2Prefetch b, int blocks, cudaStream_t stream);

// A kernel that does nothing (DSINFER_CUDA_DIAG_OMIT=add-empty: what one more launch costs in
// a decode step's graph).
void empty_launch(int blocks, int threads, cudaStream_t stream);

// y[r, i] += b[i] for r < rows, i < n (row stride ld).
void add_bias_rows(float* y, int64_t ld, int rows, int n, const float* b, cudaStream_t stream);

// out[i] = sum over r < ranks of parts[r * n + i], added in rank order from 0.0f (the order
// and bits of HostAllReduce): the tensor-parallel sum after an all-gather (cuda_nccl.h).
void sum_rank_rows(const float* parts, int ranks, int64_t n, float* out, cudaStream_t stream);

// act[r, i] = bf16(silu(gu[r, i]) * gu[r, I + i]) (gate then up in one [rows, 2I] matrix).
void silu_mul_rows(const float* gu, int rows, int I, bf16* act, cudaStream_t stream);

// act[r * ld_act + i] = bf16(silu(gu[r, 2i]) * gu[r, 2i + 1]) ((gate, up) pairs interleaved,
// rows of 2I): the cuBLAS path's SwiGLU after the interleaved gate/up projection.
void silu_mul_pairs(const float* gu, int rows, int I, bf16* act, int64_t ld_act, cudaStream_t stream);

// ids[r] = argmax of logits[r, :V] (lowest index on ties, as torch.argmax).
void argmax_rows(const float* logits, int rows, int V, int32_t* ids, cudaStream_t stream);
// The same argmax as the GEMM's 64-bit keys (cuda_gemm.h): keys[r] = key(max, index).
void argmax_keys_rows(const float* logits, int64_t ld, int rows, int V, unsigned long long* keys, cudaStream_t stream);

// Host helpers for tests and the model: F32 <-> BF16 on the device.
void f32_to_bf16_n(const float* x, int64_t n, bf16* y, cudaStream_t stream);

// The paged pool's drafter feature rows (cuda_paged_kv_cache.h), [blocks][block_size][F]
// BF16. Store: row r of src [rows, F] (a forward's captured layers) goes, rounded as
// f32_to_bf16_n, to position pos[r] of slot slot[r] through the block table (row
// table[slot * table_stride + pos / block_size] * block_size + pos % block_size); rows with
// slot < 0 (graph padding) are skipped.
void store_feature_rows(const float* src, int rows, int64_t F, const int32_t* pos, const int32_t* slot,
                        const int32_t* table, int table_stride, int block_size, bf16* plane, cudaStream_t stream);
// The same for one captured layer: row r of src (stride src_ld) fills columns [col0, col0 +
// width) of its plane row (the model stores each captured layer as the forward passes it).
void store_feature_columns(const float* src, int64_t src_ld, int rows, int64_t F, int64_t col0, int64_t width,
                           const int32_t* pos, const int32_t* slot, const int32_t* table, int table_stride,
                           int block_size, bf16* plane, cudaStream_t stream);
// Gather: dst[i, :] = plane row src_rows[i] (block * block_size + offset), for i < n.
void gather_feature_rows(const bf16* plane, int64_t F, const int32_t* src_rows, int n, bf16* dst, cudaStream_t stream);

}  // namespace dsinfer::cuda
