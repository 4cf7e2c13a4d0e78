// dsinfer CLI: --device and the CUDA options (see device_option.h).
#include "cli/device_option.h"

#include <CLI/CLI.hpp>

#include "core/env.h"
#include "core/error.h"
#ifdef DSINFER_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace dsinfer::cli {

void add_device_options(CLI::App* sub, DeviceArgs* dest, bool with_cache_prealloc) {
  sub->add_option("--device", dest->device, "Where the target model runs: cpu, or cuda (binaries built with DSINFER_CUDA=ON)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--cuda-gemm", dest->cuda_gemm,
                  "--device cuda: invariant (fixed-order GEMM on tensor cores, a row never depends on the batch; "
                  "greedy speculation == plain greedy), rows (fixed-order CUDA-core row kernel, also batch-invariant: "
                  "faster batch-1 decode of large models, slower verify blocks and batches) or cublas (cuBLAS "
                  "heuristics, faster prefill, not batch-invariant)")
      ->check(CLI::IsMember({"invariant", "rows", "cublas"}))
      ->capture_default_str();
  sub->add_option("--cuda-graphs", dest->cuda_graphs, "--device cuda: replay CUDA graphs for steps of <= 256 rows")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--tensor-parallel", dest->tensor_parallel,
                  "--device cuda: split the target (Qwen3 dense) over this many GPUs, devices 0 .. N-1, one rank "
                  "each, their partial outputs summed over NCCL after every attention and MLP block; 1: one GPU")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  if (with_cache_prealloc)
    sub->add_option("--cache-prealloc-ratio", dest->cache_prealloc_ratio,
                    "--device cuda: share of free device memory the KV cache may take, (0, 1]")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
}

bool device_is_cuda(const DeviceArgs& a) { return a.device == "cuda"; }

std::unique_ptr<Model> load_model_on_device(const std::string& model_path, const DeviceArgs& a) {
  check_device_available(a);
  if (!device_is_cuda(a)) return load_model(model_path);
  if (a.cache_prealloc_ratio <= 0.0) throw Error("--cache-prealloc-ratio must be in (0, 1]");
#ifdef DSINFER_HAS_CUDA
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error("--device cuda: " + why);
  CudaModelOptions o;
  o.batch_invariant = a.cuda_gemm != "cublas";
  o.tensor_core_gemm = a.cuda_gemm == "invariant";
  o.use_graphs = a.cuda_graphs == "on";
  o.cache_prealloc_ratio = a.cache_prealloc_ratio;
  if (a.tensor_parallel > 1)
    return load_qwen3_cuda_tensor_parallel(model_path, a.tensor_parallel, o, TensorParallelTransport::Nccl);
  return load_model_cuda(model_path, o);
#else
  throw Error("--device cuda: this binary was built without the CUDA backend (configure with -DDSINFER_CUDA=ON)");
#endif
}

void check_device_available(const DeviceArgs& a) {
  if (a.tensor_parallel < 1) throw Error("--tensor-parallel must be >= 1 (got " + std::to_string(a.tensor_parallel) + ")");
  if (a.tensor_parallel > 1 && !device_is_cuda(a))
    throw Error("--tensor-parallel " + std::to_string(a.tensor_parallel) + ": needs --device cuda (one GPU per rank)");
  if (!device_is_cuda(a)) return;
#ifdef DSINFER_HAS_CUDA
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error("--device cuda: " + why);
#else
  throw Error("--device cuda: this binary was built without the CUDA backend (configure with -DDSINFER_CUDA=ON)");
#endif
}

std::string device_summary(const DeviceArgs& a) {
  if (!device_is_cuda(a)) return "cpu";
#ifdef DSINFER_HAS_CUDA
  // The fixed-order GEMM that will run (DSINFER_CUDA_GEMV_MMA over --cuda-gemm, as the model
  // decides at load): part of the SPS(B) cache key (generate's machine string), so a table
  // profiled with one kernel is never reused with the other.
  std::string gemm = a.cuda_gemm;
  if (gemm != "cublas") gemm = env_switch("DSINFER_CUDA_GEMV_MMA", gemm == "invariant") ? "invariant (tensor cores)" : "rows";
  return "cuda: " + cuda_device_description() + ", gemm " + gemm + ", graphs " + a.cuda_graphs + ", pdl " +
         cuda_pdl_summary() +
         (a.tensor_parallel > 1 ? ", tensor parallel " + std::to_string(a.tensor_parallel) + " GPUs (NCCL)" : "");
#else
  return "cuda (unavailable)";
#endif
}

}  // namespace dsinfer::cli
