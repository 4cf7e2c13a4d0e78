// dsinfer CUDA backend: a decoder layer's tail after attention as ONE kernel for a one-row
// forward (a batch-1 decode step): o projection (+= x), post-attention RMSNorm + gate/up +
// SwiGLU, down projection (+= x), and optionally the next layer's input RMSNorm + QKV
// projection, separated by grid barriers instead of kernel boundaries.
//
// Why: at a kernel boundary the next GEMM's blocks become resident only as the previous
// kernel's blocks leave, so its first weight loads, its A staging and its ramp come after the
// previous GEMM's tail (about 2-2.6 µs a GEMM beyond streaming on the H200 4B shape; the o
// projection, whose blocks are resident while attention runs, only 0.7 µs: PERFORMANCE.md,
// sessions 24-25). Here every block stays resident, and each warp issues its first weight
// batch of the next phase before it arrives at the barrier, so the DRAM keeps streaming
// through the phase change.
//
// Bits: every output is the row GEMM kernel's one-row instance's (cuda_gemm.cu): a feature
// pair per warp, lane l over 16-byte chunks l, l + 32, ..., the same FMA chain and xor tree,
// the same RMSNorm sum order over 128 threads, the same BF16 staging and SwiGLU epilogue.
// Which warp computes a feature changes no bit. So a decode step through this kernel equals
// the same row in a verify block (tests check it).
//
// Activations written inside the kernel (x, act) are read back with ld.cg (the L2), never
// through a possibly stale L1 line. The grid barrier needs every block resident at once: the
// grid is the occupancy limit times the SMs (blocks of LayerTailArgs::warps warps), and the
// kernel lets the next launch start
// (programmatic dependent launch) only after its last barrier, when all its blocks are in.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::cuda {

using bf16 = __nv_bfloat16;

struct LayerTailArgs {
  const bf16* attb = nullptr;  // attention output row [NQ] (the o projection's input)
  const bf16* w_o = nullptr;   // [H, NQ]
  const float* post_norm = nullptr;  // [H]
  const bf16* w_gu = nullptr;  // [2I, H], gate and up interleaved by row
  bf16* act = nullptr;         // [I] silu(gate) * up
  const bf16* w_down = nullptr;  // [H, I]
  const float* next_norm = nullptr;  // the next layer's input norm [H]; null: no QKV phase
  const bf16* w_qkv = nullptr;       // [NQKV, H]
  float* qkv = nullptr;              // [NQKV]
  float* x = nullptr;                // the residual row [H]
  unsigned* barrier = nullptr;       // a counter zeroed before the forward, one per layer
  int H = 0, NQ = 0, I = 0, NQKV = 0;
  float eps = 1e-6f;
  bool evict_first = true;           // weight loads with the L2 evict-first policy
  int stage_unroll = 1;              // staging loads in flight per thread: 1 (98 registers) or 2 (128, spills)
  // Warps per block: 4, 8, 12 or 16. Every block of the grid arrives at each barrier, so fewer,
  // larger blocks make cheaper barriers (16 warps at 98 registers: one block per SM).
  int warps = 4;
  // Profiling (DSINFER_CUDA_FUSED_TAIL_PROFILE): thread 0 of block b writes kLayerTailStamps
  // %globaltimer stamps (ns) at timing[b * kLayerTailStamps + k]: past the PDL wait, then
  // for each phase (o, gate/up, down, QKV) its work done and, but for the last, its barrier
  // passed. Null: no stamps.
  unsigned long long* timing = nullptr;
};
constexpr int kLayerTailStamps = 8;

// Whether the fused tail can run these shapes (every K a multiple of 8, 16-byte aligned rows
// and weights, the staged row in shared memory).
bool layer_tail_supported(const LayerTailArgs& a);

// One launch (programmatic dependent launch after attention); returns its grid (blocks).
// Throws Error on an unsupported shape.
int layer_tail_one_row(const LayerTailArgs& a, cudaStream_t stream);

}  // namespace dsinfer::cuda
