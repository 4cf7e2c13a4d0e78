// dsinfer CLI: the device options shared by generate, bench-model and bench-engine (--device cpu|cuda and
// the CUDA backend's knobs), and building the model on the chosen device. Compiles with or
// without the CUDA backend: without it, --device cuda is refused with one line.
#pragma once
#include <memory>
#include <string>

#include "model/model.h"

namespace CLI {
class App;
}

namespace dsinfer::cli {

struct DeviceArgs {
  std::string device = "cpu";            // cpu | cuda
  std::string cuda_gemm = "invariant";   // invariant (fixed-order, tensor cores) | rows (fixed-order row kernel) | cublas
  std::string cuda_graphs = "on";        // on | off
  double cache_prealloc_ratio = 0.9;     // share of free device memory a KV cache may take
  int tensor_parallel = 1;               // --device cuda: ranks, one GPU each (NCCL); 1 = one GPU
};

// with_cache_prealloc = false leaves --cache-prealloc-ratio to the command (bench-engine
// has its own, which sizes the engine's paged pool).
void add_device_options(CLI::App* sub, DeviceArgs* dest, bool with_cache_prealloc = true);
bool device_is_cuda(const DeviceArgs& a);
// load_model() on the CPU, or the CUDA backend's loader; throws Error (one line) when
// --device cuda is not available in this binary or on this machine.
std::unique_ptr<Model> load_model_on_device(const std::string& model_path, const DeviceArgs& a);
// The same refusal as load_model_on_device, before anything loads (serve checks it before it
// binds its port): throws Error (one line) when --device cuda is not available.
void check_device_available(const DeviceArgs& a);
// One line for the stats output, e.g. "cpu" or "cuda: NVIDIA H200 (...), gemm invariant, graphs on".
std::string device_summary(const DeviceArgs& a);

}  // namespace dsinfer::cli
