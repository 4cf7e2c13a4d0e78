// dsinfer CUDA backend: causal GQA attention of new rows against the device KV cache, for
// decode (one row per sequence) and for multi-token verify/prefill blocks alike.
//
// Every row carries its own (slot, position): by the time attention runs, the layer's K/V
// of all new rows are already in the cache (qk_norm_rope_store), so row r attends to keys
// [0, pos[r]] of its slot — causal within a block and over the cached prefix at once, with
// no notion of "entries". One block of 128 threads per (row, q head): keys are taken in
// tiles of 256 (score = sequential dot over head_dim by one thread per key, times
// scale), an online softmax carries max and sum across tiles; for the weighted sum of V,
// warp w takes keys w, w + 4, ... of each tile (lanes over dimension pairs) and the four
// warp sums are added in warp order at the end. The order depends only on the row's
// position, so a row's output does not depend on the batch (batch invariance), and a
// verify row equals the decode row at the same position.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

// q f32 [T, NH * D]; out bf16 [T, NH * D]. Rows with slot < 0 get zeros. D <= 256, even.
void attention_rows(const float* q, KVLayerView kv, const int32_t* slot, const int32_t* pos, int T, int NH, int NKVH,
                    int D, float scale, bf16* out, cudaStream_t stream);

}  // namespace dsinfer::cuda
