// dsinfer CUDA backend: the invariant GEMM on tensor cores (cuda_gemm_mma.cu), reached through
// gemm_rows / gemm_rows_silu when GemvShape::mma is on (a model's default: --cuda-gemm
// invariant; --cuda-gemm rows or DSINFER_CUDA_GEMV_MMA=0 for the row kernel). Same interface as
// the row kernel; different rounding (its own fixed k order), the same for every row count.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_gemm.h"

namespace dsinfer::cuda {

// K a multiple of 64 and the 16-byte alignments of the vector path.
bool gemm_mma_supported(const GemmInput& in, const bf16* W, int K);
// Y (+)= A·Wᵀ (silu_out null) or the SwiGLU epilogue into silu_out, as gemm_rows / gemm_rows_silu;
// next: the following GEMM's first weights, prefetched to the L2 as each block finishes.
void gemm_mma(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
              unsigned long long* keys, bf16* silu_out, int64_t ld_silu, L2Prefetch next, cudaStream_t stream);

}  // namespace dsinfer::cuda
