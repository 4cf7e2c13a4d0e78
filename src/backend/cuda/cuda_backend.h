// dsinfer CUDA backend: the public entry points, usable from code built without CUDA
// headers (the CLI and the tests include only this file, and only when the build defines
// DSINFER_HAS_CUDA, i.e. CMake's DSINFER_CUDA=ON).
//
// Data flow: load_qwen3_cuda() reads a Qwen3 checkpoint on the host (the same WeightStore
// and shape checks as the CPU model), converts every matrix to BF16 and uploads it once;
// the returned Model runs forward() on the GPU (qwen3_cuda.cpp) over a device KV cache
// (cuda_kv_cache.h) and copies back only what the caller asked for: logit rows, argmax ids
// (forward_argmax) or captured hidden states.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"

namespace dsinfer {

struct CudaModelOptions {
  int device = 0;
  // true: every GEMM runs a fixed-order kernel (cuda_gemm.h), so a row's result never
  // depends on the batch (greedy speculation == plain greedy). false: cuBLAS with its own
  // heuristics (faster prefill; rows may change with the batch shape).
  bool batch_invariant = true;
  // Which fixed-order GEMM (batch_invariant): true, the tensor-core kernel (cuda_gemm_mma.h:
  // a verify block of 16 rows of the 4B shape costs about 2.7 decode steps against 4.6,
  // plain decoding of the embedded target at 128 requests +55-70 %; batch-1 decode of the 4B
  // shape 5 % slower; docs/PERFORMANCE.md, session 20); false, the
  // CUDA-core row kernel (--cuda-gemm rows). Process-wide: the GEMM shape is global
  // (gemv_shape()), set when a model loads, so every model of a process should agree.
  // DSINFER_CUDA_GEMV_MMA=0 / 1 over this field.
  bool tensor_core_gemm = true;
  // Replay captured CUDA graphs for forward calls of up to 256 rows (bucketed shapes).
  bool use_graphs = true;
  // A forward of exactly one row (batch-1 decode) runs as one persistent kernel
  // (cuda_persistent_decode.h) with the bits of the layered kernels; batch-invariant mode
  // only, with the row kernel (tensor_core_gemm false: it repeats the row kernel's arithmetic).
  // Off by default: on the H200 it measured slower than the layered kernels so far
  // (docs/PERFORMANCE.md); DSINFER_CUDA_PERSISTENT=1 turns it on (=0 off) over this field.
  bool persistent_decode = false;
  // A forward of exactly one row runs the q/k step (RMSNorm + RoPE of q and k, K/V into the
  // cache) inside attention's kernel (attention_rows_fold_qk): same bits, one launch fewer
  // per layer. DSINFER_CUDA_FOLD_QK=0 / 1 over this field.
  bool fold_qk_decode = true;
  // A forward of exactly one row runs each layer's o, gate/up and down projections and the
  // next layer's QKV projection as one kernel with grid barriers (cuda_layer_tail.h), the
  // row kernel's bits (tensor_core_gemm false, batch_invariant true). 0: off; 1 or 2: on,
  // with that many staging loads in flight per thread (98 registers, or 128 with a few spills). Off by default
  // until measured on the GPU; DSINFER_CUDA_FUSED_TAIL=0 / 1 / 2 over this field.
  int fused_layer_tail = 0;
  // Its warps per block (4, 8, 12 or 16; DSINFER_CUDA_FUSED_TAIL_WARPS over it): the grid
  // barriers wait for every block, so fewer, larger blocks make cheaper barriers.
  int fused_layer_tail_warps = 4;
  // Share of the device's free memory (read when the cache is made) a KV cache may take;
  // a cache asked for with max_tokens <= 0 takes exactly this share (--cache-prealloc-ratio).
  double cache_prealloc_ratio = 0.9;
};

// "" when a CUDA device is usable; otherwise one line saying why not (no driver, no GPU).
std::string cuda_unavailable_reason();
// e.g. "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"; throws Error when no device.
std::string cuda_device_description(int device = 0);
// Device-to-device copy bandwidth in GB/s counting bytes read plus bytes written (median of
// `reps` copies of `bytes` bytes each, timed with CUDA events).
double cuda_copy_bandwidth_gbs(uint64_t bytes = 2ull << 30, int reps = 20, int device = 0);

// Loads a Qwen3 (Qwen3ForCausalLM) checkpoint onto the GPU. Throws Error naming the
// file/field at fault, or the CUDA call that failed.
std::unique_ptr<Model> load_qwen3_cuda(const std::string& model_dir, const CudaModelOptions& opts = {});
// Tensor parallelism on the GPU (issue 10): the Qwen3 checkpoint split over `ranks` rank
// models (model/tensor_parallel.h: each holds its heads and features in device memory, its
// KV caches its KV heads), run together on one thread each (model/tensor_parallel_group.h,
// dense and paged caches, so the batched engine serves it), their o and down outputs summed
// in rank order after every layer.
//  - HostMemory: every rank on opts.device, the sums through host memory, CUDA graphs off.
//    It proves the split's GPU forward on a machine with one GPU; it is not fast.
//  - Nccl: rank r on GPU opts.device + r, the sums as an NCCL all-gather and a sum in rank
//    order on each GPU (cuda_nccl.h: the same bits as HostMemory, and capturable, so graphs
//    stay on). Built, never run: no multi-GPU machine has been lent yet.
enum class TensorParallelTransport { HostMemory, Nccl };
std::unique_ptr<Model> load_qwen3_cuda_tensor_parallel(const std::string& model_dir, int ranks,
                                                       const CudaModelOptions& opts = {},
                                                       TensorParallelTransport transport = TensorParallelTransport::HostMemory);
// Loads a DeepSeek-V4 (DeepseekV4ForCausalLM) checkpoint onto the GPU (deepseek_v4_cuda.cpp):
// weights as stored (F32/BF16, FP8/FP4 dequantised inside the kernels), the decoding state in
// device memory. Uses opts.device, use_graphs and cache_prealloc_ratio; its kernels are
// batch-invariant by construction (batch_invariant is ignored).
std::unique_ptr<Model> load_deepseek_v4_cuda(const std::string& model_dir, const CudaModelOptions& opts = {});
// The CUDA model for the checkpoint's architecture (Qwen3 or DeepSeek-V4); Error otherwise.
std::unique_ptr<Model> load_model_cuda(const std::string& model_dir, const CudaModelOptions& opts = {});
// The sites that launch with programmatic dependent launch (DSINFER_CUDA_PDL, cuda_check.h),
// e.g. "gemv,attn,qk" or "off": one word for benchmarks' device line.
std::string cuda_pdl_summary();

// Forwards that ran as the persistent decode kernel so far (0 for a model that is not a
// CUDA Qwen3 model): tests check that the path they compare actually ran.
int64_t cuda_persistent_decode_calls(const Model& model);
// Forwards that ran the fused layer tail so far (same purpose).
int64_t cuda_fused_tail_calls(const Model& model);

}  // namespace dsinfer
