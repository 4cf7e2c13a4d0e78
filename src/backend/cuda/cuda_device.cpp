// dsinfer CUDA backend: is there a usable GPU, what is it, and how fast does it copy.
// The copy bandwidth is the roofline's denominator: one large device-to-device copy moves
// each byte twice through device memory (read + write), and both are counted.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "model/config.h"

namespace dsinfer {

std::unique_ptr<Model> load_model_cuda(const std::string& model_dir, const CudaModelOptions& opts) {
  const ModelConfig cfg = load_model_config(model_dir);
  const bool v4 = is_deepseek_v4(cfg);
  if (v4) return load_deepseek_v4_cuda(model_dir, opts);
  return load_qwen3_cuda(model_dir, opts);  // names any other architecture in its error
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
  }
  if (n == 0) return "no CUDA device present";
  return "";
}

std::string cuda_device_description(int device) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error("--device cuda: " + why);
  cudaDeviceProp p{};
  DSINFER_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f", static_cast<double>(p.totalGlobalMem) / (1ull << 30));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + mem + " GiB)";
}

double cuda_copy_bandwidth_gbs(uint64_t bytes, int reps, int device) {
  DSINFER_CUDA_CHECK(cudaSetDevice(device));
  void *a = nullptr, *b = nullptr;
  DSINFER_CUDA_CHECK(cudaMalloc(&a, bytes));
  DSINFER_CUDA_CHECK(cudaMalloc(&b, bytes));
  // Non-zero contents (METHOD.md: never time on zeros).
  DSINFER_CUDA_CHECK(cudaMemset(a, 0x5a, bytes));
  cudaEvent_t e0, e1;
  DSINFER_CUDA_CHECK(cudaEventCreate(&e0));
  DSINFER_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < reps + 3; ++i) {
    DSINFER_CUDA_CHECK(cudaEventRecord(e0));
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice));
    DSINFER_CUDA_CHECK(cudaEventRecord(e1));
    DSINFER_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    DSINFER_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);  // 3 warm-ups
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2] * 1e-3;
  return 2.0 * static_cast<double>(bytes) / med / 1e9;
}

namespace cuda {

void raise_dynamic_smem(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::unordered_map<const void*, size_t> set;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = set[kernel];
  if (bytes <= have) return;
  DSINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  have = bytes;
}

unsigned parse_name_list(const char* var, const std::string& value, std::initializer_list<NamedBit> names) {
  unsigned mask = 0;
  for (size_t b = 0; b <= value.size();) {
    const size_t c = std::min(value.find(',', b), value.size());
    const std::string k = value.substr(b, c - b);
    const NamedBit* hit = nullptr;
    for (const NamedBit& n : names)
      if (k == n.name) hit = &n;
    if (!hit) {
      std::string all;
      for (const NamedBit& n : names) all += (all.empty() ? "" : ", ") + std::string(n.name);
      throw Error(std::string(var) + ": '" + k + "' in '" + value + "' is not one of " + all);
    }
    mask |= hit->bit;
    b = c + 1;
  }
  return mask;
}

namespace {

// DSINFER_CUDA_PDL, read once: 1 (every site, the default), 0 or a list of sites.
unsigned pdl_env() {
  static const unsigned mask = [] {
    const char* e = std::getenv("DSINFER_CUDA_PDL");
    if (!e) return kPdlAllSites;
    const std::string v = e;
    if (v == "0") return 0u;
    if (v == "1") return kPdlAllSites;
    return parse_name_list("DSINFER_CUDA_PDL (0, 1 or a list)", v,
                           {{"gemv", static_cast<unsigned>(PdlSite::Gemv)},
                            {"attn", static_cast<unsigned>(PdlSite::Attention)},
                            {"qk", static_cast<unsigned>(PdlSite::QkStep)},
                            {"small", static_cast<unsigned>(PdlSite::Small)}});
  }();
  return mask;
}

bool pdl_supported() {
  static const bool ok = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return ok;
}

// The sites this thread's launches use while a PdlScope lives (-1: none lives).
thread_local int tl_pdl_scope = -1;

}  // namespace

bool pdl_enabled(PdlSite site) {
  const unsigned mask = tl_pdl_scope >= 0 ? static_cast<unsigned>(tl_pdl_scope) : pdl_env();
  return (mask & static_cast<unsigned>(site)) != 0 && pdl_supported();
}

PdlScope::PdlScope(unsigned sites) : previous_(tl_pdl_scope) { tl_pdl_scope = static_cast<int>(sites & kPdlAllSites); }
PdlScope::~PdlScope() { tl_pdl_scope = previous_; }

}  // namespace cuda

std::string cuda_pdl_summary() {
  if (!cuda::pdl_supported()) return "off (before sm_90)";
  const unsigned m = cuda::pdl_env();
  if (m == 0) return "off";
  std::string out;
  for (auto [bit, name] : {std::pair{cuda::PdlSite::Gemv, "gemv"}, std::pair{cuda::PdlSite::Attention, "attn"},
                           std::pair{cuda::PdlSite::QkStep, "qk"}, std::pair{cuda::PdlSite::Small, "small"}})
    if (m & static_cast<unsigned>(bit)) out += (out.empty() ? "" : ",") + std::string(name);
  return out;
}

}  // namespace dsinfer
