// dsinfer CUDA backend: the persistent decode kernel. A forward of exactly one row (batch-1
// decode: one sequence, one new token, its logits or argmax wanted) runs as ONE kernel of
// one block per SM instead of six launches per layer.
//
// Why: at batch 1 a Qwen3 layer streams ~200 MB of weights (4B shape) through four GEMVs of
// 5-30 µs, and every launch pays its start, ramp-up and tail, while the q/k step and
// attention (latency-bound, ~18 µs per layer) leave the DRAM idle (docs/PERFORMANCE.md:
// 63 % of the copy roofline with the layered kernels). Here the weights never stop
// streaming: in every block one producer warp copies the block's share of each GEMV's
// weight rows, in the order they will be used, through a ring of shared-memory slots
// (cp.async.bulk + mbarriers), running ahead across phases and layers, bounded only by the
// ring; eight consumer warps compute. Phases are separated by a grid barrier (a global
// counter), which costs the consumers a microsecond or two but not the DRAM.
//
// Data flow of one call (the op list is built once per (cache, captured layers) by the
// model, qwen3_cuda.cpp): embed the token into x (F32) -> per layer [RMSNorm(x) + QKV rows
// -> qkv; blocks 0 .. NH-1: q/k norm + RoPE, K/V into the cache, attention of head h ->
// attb (BF16); o rows: x += ; RMSNorm(x) + gate/up row pairs + SwiGLU -> act (BF16); down
// rows: x += ] -> final RMSNorm + LM head rows -> logits (+ argmax keys); captured layers
// copied from x after their layer.
//
// Bits: every output is computed with the layered kernels' arithmetic in the same order
// (the GEMV: lane l sums 8-element chunks l, l + 32, ... in order, a fixed xor tree, the
// RMSNorm sums of the 128-thread row kernel; q/k and attention: the same device functions,
// cuda_attention_impl.cuh), so a decode row here equals that row in a verify block of the
// layered path (batch invariance; tested bit for bit in test_cuda_model).
//
// Assumes every block is resident at once (grid = SM count, one block per SM by its shared
// memory): the grid barrier would wait forever otherwise; a barrier that waits longer than
// a second traps (a CUDA error, not a hang).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

struct PersistentOp {
  enum Kind : int { Embed, Gemv, Attention };
  enum Input : int { InBf16, InRmsNorm };                 // GEMV A: BF16 rows, or RMSNorm(x) with norm_w
  enum Output : int { OutSet, OutAdd, OutSilu, OutHead };  // y = / y += / act = swiglu / logits + argmax keys
  int kind = Gemv;
  int capture = -1;  // >= 0: after this op, x is copied to cap + capture * H
  // GEMV: y[n] (op)= A · W[n, :] for n < N (W [N, K] BF16, N even; OutSilu: rows interleaved
  // (gate_i, up_i), act[i] = bf16(silu(gate) * up)).
  const bf16* W = nullptr;
  int N = 0, K = 0;
  int input = InBf16;
  const bf16* in_bf16 = nullptr;
  const float* norm_w = nullptr;
  int output = OutSet;
  float* y = nullptr;
  bf16* act = nullptr;
  // Attention: this layer's norms and cache view.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  KVLayerView kv;
};

struct PersistentParams {
  const int32_t* token = nullptr;  // device: the row's token, position and slot
  const int32_t* pos = nullptr;
  const int32_t* slot = nullptr;
  const bf16* embed = nullptr;     // [V, H]
  const float* inv_freq = nullptr; // [D / 2]
  float attention_factor = 1.0f;
  float eps = 1e-6f;
  float scale = 1.0f;
  int H = 0, NH = 0, NKVH = 0, D = 0;
  float* x = nullptr;       // [H] F32 residual
  float* qkv = nullptr;     // [(NH + 2 NKVH) D] F32
  bf16* attb = nullptr;     // [NH D]
  unsigned long long* keys = nullptr;  // argmax key of the logit row (zeroed by the caller), or null
  float* cap = nullptr;     // captured rows [n_cap, H]
  unsigned* barrier = nullptr;  // grid barrier counter (zeroed by the caller before each launch)
  // Profiling (DSINFER_CUDA_PERSISTENT_PROFILE=1), or null: [0] the kernel's start, then per
  // op i: [1 + i] when block 0 left its barrier, [1 + n_ops + i * grid + b] when block b
  // arrived at it (globaltimer ns).
  unsigned long long* timing = nullptr;
};

// Whether the kernel can run this shape on this device (head_dim, the largest K, heads, a
// resident grid); `why` says what does not fit.
bool persistent_decode_supported(int D, int max_k, int NH, const char** why);
// Blocks of the kernel's grid (one per SM).
int persistent_decode_grid();
// Enqueues the kernel: ops (a device array of n_ops) in order, a grid barrier between them.
// DSINFER_CUDA_PERSISTENT_SLOT_KB overrides the ring's smallest slot (48 KB; experiments).
void persistent_decode(const PersistentOp* ops, int n_ops, int max_k, const PersistentParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
