// dsinfer CUDA backend: Y[M, N] (+)= A[M, K] · W[N, K]ᵀ with BF16 W (stored PyTorch-style
// [out, in], row-major, as uploaded by the model), F32 accumulation and F32 Y, where A is
// the BF16 rounding of one of three inputs (GemmInput):
//   Bf16     A = X (already BF16);
//   RmsNorm  A = bf16(w * (x * inv_rms(x))) of F32 rows x (optionally gathered through a
//            row index): the layer's RMSNorm fused into the GEMM;
//   SiluMul  A = bf16(silu(g) * u) of F32 rows [g | u] (width 2K): SwiGLU fused in.
// Fusing the row-wise producers into the GEMM saves a kernel (and a round trip of the
// activations) per use, which matters at batch 1 where each kernel is a few microseconds.
//
// Two implementations behind one call:
//  - Invariant (default): our own row kernel. A block stages up to 4 rows of A in shared
//    memory (the input transform done once per block, rounded to BF16); each warp owns two
//    output features; lane l sums the 8-element chunks c = l, l + 32, ... of the K
//    dimension in increasing order (sequential FMAs), then a fixed xor-shuffle tree adds the
//    32 lane sums; an RMSNorm's sum of squares is a fixed block reduction of the row alone.
//    That order depends on K alone, never on M, on the row group or on the grid, so a row's
//    output is bit-identical whatever else shares the call: greedy speculation == plain
//    greedy. At M = 1 it is a streaming GEMV (each weight byte read once, 16-byte loads,
//    8 to 16 in flight per lane): a resident grid (one wave, each block walking an equal
//    share of the feature groups after staging its A rows once), the first weight loads
//    issued before the A staging and before the PDL wait (cuda_check.h), the next batch
//    always in flight while the current one is used.
// argmax_keys (optional): per row, the max over features of a 64-bit key ordering by logit
// and then by lower feature index (torch.argmax's rule), for a greedy LM head whose logits
// need not leave the device; the row kernel folds it into its epilogue with atomicMax
// (order-independent), the cuBLAS path runs a separate kernel. Zero the keys first; the
// feature is 0xffffffff - (key & 0xffffffff) (argmax_from_key).
//  - cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F, default algorithm) after a separate kernel
//    that writes A: fast for large M, but its algorithm (tiles, split-K) is chosen per
//    shape, so a row's bits can change with M.
// next (row kernel only): weights of the next GEMM that each block asks the L2 for once its
// own weight loads are all issued (cuda_kernels.h, L2Prefetch; a hint, no result changes).
// The handle's workspace is fixed at creation so that calls can be captured in CUDA graphs.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

struct GemmInput {
  enum Kind { Bf16, RmsNorm, SiluMul };
  Kind kind = Bf16;
  const void* x = nullptr;           // bf16 rows (Bf16) or f32 rows (RmsNorm, SiluMul)
  int64_t ldx = 0;                   // row stride in elements
  const float* norm_w = nullptr;     // RmsNorm: weight [K]
  const int32_t* row_index = nullptr;  // RmsNorm: source row of output row r (nullptr: r)
  float eps = 1e-6f;

  static GemmInput bf16_rows(const bf16* x, int64_t ldx) { return {Bf16, x, ldx, nullptr, nullptr, 0.0f}; }
  static GemmInput rmsnorm_rows(const float* x, int64_t ldx, const float* w, float eps, const int32_t* rows = nullptr) {
    return {RmsNorm, x, ldx, w, rows, eps};
  }
  static GemmInput silu_mul_rows(const float* gu, int64_t ldx) { return {SiluMul, gu, ldx, nullptr, nullptr, 0.0f}; }
};

class Gemm {
 public:
  explicit Gemm(bool batch_invariant);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  bool batch_invariant() const { return invariant_; }
  // ldy: row stride of Y. accumulate: Y += A·Wᵀ instead of Y = A·Wᵀ. scratch: room for
  // M * K BF16 values, used by the cuBLAS path to materialise A (may be null for Bf16).
  void run(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
           bf16* scratch, cudaStream_t stream, unsigned long long* argmax_keys = nullptr, L2Prefetch next = {});
  // The gate/up projection with SwiGLU as its epilogue: W's rows are (gate_0, up_0, gate_1,
  // up_1, ...) (N = 2I, interleaved at upload) and act[m, i] = bf16(silu(gate_i) * up_i)
  // (row stride ld_act), the same value the SiluMul input computes from [gate | up] rows.
  // gu_scratch: F32 room for M x N (the cuBLAS path writes the pairs there first).
  void run_silu(const GemmInput& in, const bf16* W, int N, int K, bf16* act, int64_t ld_act, int M, float* gu_scratch,
                bf16* scratch, cudaStream_t stream, L2Prefetch next = {});

 private:
  bool invariant_;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

// The invariant row kernel alone (tests call it directly).
void gemm_rows(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
               cudaStream_t stream, unsigned long long* argmax_keys = nullptr, L2Prefetch next = {});
// The row kernel with the SwiGLU epilogue (Gemm::run_silu's invariant path).
void gemm_rows_silu(const GemmInput& in, const bf16* W, int N, int K, bf16* act, int64_t ld_act, int M,
                    cudaStream_t stream, L2Prefetch next = {});
// The row kernel's launch shape: warps per block (4 or 8), a cap on resident blocks per SM
// (0: as many as fit) and how feature pairs are dealt to warps (grouped: a block takes
// adjacent pairs; interleaved: spread over every resident block, for balance when pairs are
// few). Each feature's dot product is one warp's, in the same lane order whatever the shape,
// so the shape changes no bit (tests check it); it changes how often a block stages A (once
// per block), how many loads each SM keeps in flight and how evenly SMs are loaded. Read
// once from DSINFER_CUDA_GEMV_WARPS / _BLOCKS_PER_SM / _INTERLEAVE / _ONE_ROW;
// set_gemv_shape() replaces it for launches (and graph captures) that follow.
// one_row_kernel (default on): a launch of one row (a decode step) runs the instance built
// for one row (fewer registers, no loops over absent rows) rather than the 4-row one; no bit
// changes.
struct GemvShape {
  int warps = 4;
  int blocks_per_sm = 0;
  bool interleave = false;
  bool one_row_kernel = true;
  // Weight loads carry the L2 evict-first policy (DSINFER_CUDA_GEMV_EVICT_FIRST=0 turns it
  // off): the weights stream through the L2 without pushing out what is read again (the K/V
  // rows attention reads, the activations). 4B batch-1 decode on the H200: 374.1 against
  // 367.9 tokens/s (docs/PERFORMANCE.md, session 18).
  bool evict_first_weights = true;
  // Verify blocks of up to 16 rows of a matrix of at most this many bytes run one row per
  // block too (DSINFER_CUDA_GEMV_ONE_ROW_MB, default 8): such a matrix stays in the L2, so
  // its row groups share one DRAM read, and each block's chain (stage A, dot, reduce) is the
  // short one-row one. The embedded target's verify forward of 8 rows: 0.222 against 0.304
  // ms; for the 4B shape's 21-31 MB matrices it measured mixed (docs/PERFORMANCE.md,
  // session 19). No bit changes (tests check it).
  uint64_t one_row_max_bytes = uint64_t{8} << 20;
  // Every GEMM on tensor cores (cuda_gemm_mma.h) instead of the row kernel. Off in a
  // default-made shape (the row kernel's own tests); a model sets it when it loads
  // (CudaModelOptions::tensor_core_gemm, default on; DSINFER_CUDA_GEMV_MMA over it).
  bool mma = false;
};
GemvShape gemv_shape();
void set_gemv_shape(GemvShape shape);
inline int32_t argmax_from_key(unsigned long long key) { return static_cast<int32_t>(0xffffffffu - (key & 0xffffffffu)); }
inline void gemm_rows(const bf16* X, int64_t ldx, const bf16* W, int N, int K, float* Y, int64_t ldy, int M,
                      bool accumulate, cudaStream_t stream) {
  gemm_rows(GemmInput::bf16_rows(X, ldx), W, N, K, Y, ldy, M, accumulate, stream);
}

}  // namespace dsinfer::cuda
