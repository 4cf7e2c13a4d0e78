// dsinfer CUDA backend: causal GQA attention of new rows against the device KV cache, for
// decode (one row per sequence) and for multi-token verify/prefill blocks alike.
//
// Every row carries its own (slot, position): by the time attention runs, the layer's K/V
// of all new rows are already in the cache (qk_norm_rope_store), so row r attends to keys
// [0, pos[r]] of its slot — causal within a block and over the cached prefix at once, with
// no notion of "entries". One block of kAttnWarps warps per (row, q head); the row's n keys
// are cut into kAttnWarps contiguous ranges of chunk = roundup8(ceil(n / kAttnWarps)) keys,
// one per warp (a function of n alone; multiples of 8 spread a short row over every warp). A
// warp walks its range in tiles of 32 keys, each four sub-tiles of 8: the four lanes of a
// quad score one key of a sub-tile, each a sequential dot over its quarter of head_dim (16-byte
// chunks part, part + 4, ...), and add their partial dots in a fixed xor tree (times scale);
// an online softmax over the tile (xor-shuffle max, the lane's sub-tiles then an xor tree for
// the sum) carries max and sum, and the V rows are added in key order (lanes over dimension
// pairs). The warps' (max, sum, V sum) are then combined in warp order. No step's order
// depends on other rows, so a row's output does not depend on the batch (batch invariance),
// and a verify row equals the decode row at the same position. At decode (one row, a few
// hundred keys) this is a short chain: one load round trip per 32-key tile per warp, four
// independent 1/4-length dot chains per lane, no block barrier inside the loop.
// Paged caches (the batched engine's pool, cuda_paged_kv_cache.h): the same kernel reads
// each key's row through the slot's block table (KVLayerView::table); decode rows and
// variable-length causal verify blocks of many sequences share one launch, and the bits are
// those of the dense layout (same arithmetic, same order; only the addresses differ).
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

constexpr int kAttnWarps = 8;

// q f32 [T, NH * D]; out bf16 [T, NH * D]. Rows with slot < 0 get zeros. D <= 256, even.
// prefetch: weights the blocks ask the L2 for at their start (cuda_kernels.h, L2Prefetch).
void attention_rows(const float* q, KVLayerView kv, const int32_t* slot, const int32_t* pos, int T, int NH, int NKVH,
                    int D, float scale, bf16* out, cudaStream_t stream, L2Prefetch prefetch = {});

// The q/k step folded into attention, for forwards whose rows all belong to different
// slots (a batch-1 decode step; the caller guarantees it): the block of (row r, q head h)
// RMS-norms and rotates its q head from the QKV GEMM's output qkv [T, (NH + 2 NKVH) * D] (F32)
// into shared memory, writes its KV head's new K row (normed, rotated, BF16) and V row into
// the cache (every q-head block of a KV head writes the same bits), and then attends as
// attention_rows does. cos_t / sin_t: rope_table's rows. Same functions, same bits as
// qk_norm_rope_store + attention_rows, one launch fewer per layer.
void attention_rows_fold_qk(const float* qkv, const float* q_norm, const float* k_norm, float eps, const float* cos_t,
                            const float* sin_t, KVLayerView kv, const int32_t* slot, const int32_t* pos, int T, int NH,
                            int NKVH, int D, float scale, bf16* out, cudaStream_t stream,
                            unsigned long long* timing = nullptr);
// timing (profiling, DSINFER_CUDA_ATTN_PROFILE): per block of row 0, kAttnProfileStamps
// %globaltimer stamps (ns) taken by thread 0: entry, after the PDL wait, q staged, done,
// then after the prologue barrier, first tile's scores, first tile's V sums, the combine
// barrier.
constexpr int kAttnProfileStamps = 8;

}  // namespace dsinfer::cuda
