// dsinfer CUDA backend: what a CUDA target model lends to code that runs next to it on the
// same device (the GPU drafter, cuda_drafter.h): its device copies of the embedding and the
// LM head (a DeepSpec drafter's frozen copies are byte-identical to them, so it reads the
// target's instead of uploading its own), the device ordinal and the GEMM mode.
// CudaQwen3Model implements it; a drafter finds it with dynamic_cast on the Model.
#pragma once
#include "backend/cuda/cuda_kernels.h"

namespace dsinfer::cuda {

class CudaTarget {
 public:
  virtual ~CudaTarget() = default;
  virtual const bf16* device_embedding() const = 0;  // [V, H] BF16
  virtual const bf16* device_lm_head() const = 0;    // [V, H] BF16 (the embedding when tied)
  virtual int device_ordinal() const = 0;
  // The target's --cuda-gemm mode: true = the fixed-order row kernel (batch-invariant).
  virtual bool gemm_batch_invariant() const = 0;
  // The target's --cuda-graphs setting: code beside it replays CUDA graphs only when on.
  virtual bool graphs_enabled() const = 0;
};

}  // namespace dsinfer::cuda
