// dsinfer CUDA backend: the invariant GEMM on tensor cores (cuda_gemm_mma.cu), reached through
// gemm_rows / gemm_rows_silu when GemvShape::mma is on (DSINFER_CUDA_GEMV_MMA=1; experimental,
// off by default). Same interface as the row kernel; different rounding (its own fixed k order),
// the same for every row count.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_gemm.h"

namespace dsinfer::cuda {

// K a multiple of 64 and the 16-byte alignments of the vector path.
bool gemm_mma_supported(const GemmInput& in, const bf16* W, int K);
// Y (+)= A·Wᵀ (silu_out null) or the SwiGLU epilogue into silu_out, as gemm_rows / gemm_rows_silu.
void gemm_mma(const GemmInput& in, const bf16* W, int N, int K, float* Y, int64_t ldy, int M, bool accumulate,
              unsigned long long* keys, bf16* silu_out, int64_t ld_silu, cudaStream_t stream);

}  // namespace dsinfer::cuda
