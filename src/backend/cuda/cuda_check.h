// dsinfer CUDA backend: turning CUDA runtime and cuBLAS status codes into dsinfer::Error.
// Every CUDA call of the backend goes through one of these, and every kernel launch is
// followed by DSINFER_CUDA_LAUNCHED(), so a failure surfaces as one line naming the call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace dsinfer::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(e) + " (" + file + ":" +
              std::to_string(line) + ")");
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  throw Error(std::string("cuBLAS: ") + what + " failed: status " + std::to_string(static_cast<int>(s)) + " (" +
              file + ":" + std::to_string(line) + ")");
}

}  // namespace dsinfer::cuda

#define DSINFER_CUDA_CHECK(call)                                                        \
  do {                                                                                  \
    cudaError_t dsinfer_e_ = (call);                                                    \
    if (dsinfer_e_ != cudaSuccess) ::dsinfer::cuda::throw_cuda(dsinfer_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define DSINFER_CUBLAS_CHECK(call)                                                      \
  do {                                                                                  \
    cublasStatus_t dsinfer_s_ = (call);                                                 \
    if (dsinfer_s_ != CUBLAS_STATUS_SUCCESS) ::dsinfer::cuda::throw_cublas(dsinfer_s_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: configuration errors show up here, not at the next sync.
#define DSINFER_CUDA_LAUNCHED(name)                                                     \
  do {                                                                                  \
    cudaError_t dsinfer_e_ = cudaGetLastError();                                        \
    if (dsinfer_e_ != cudaSuccess) ::dsinfer::cuda::throw_cuda(dsinfer_e_, name, __FILE__, __LINE__); \
  } while (0)

// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl() may start while
// the kernel before it in the stream is still running; it must call pdl_wait() before it
// reads anything an earlier kernel wrote (or writes anything an earlier kernel reads), and
// every kernel launched so waits (unconditionally, in every thread that touches such data),
// so completion stays transitive down the stream. Before the wait a kernel may only read
// constant data (weights): the decode GEMMs issue their first weight loads there, so the
// weight stream of one layer overlaps the tail of the kernel before. pdl_trigger() lets the
// next kernel be scheduled once every block of this one has called it. Both are no-ops when
// the kernel was launched without the attribute. Which launches use it: DSINFER_CUDA_PDL =
// 1 (all, the default), 0 (none) or a comma list of sites (gemv, attn, qk, small). With every site
// on, session 18 measured every shape fastest or level (4B / 1.7B / 0.6B batch-1 decode
// +4 / +5 / +3 %, the embedded engine's plain decoding +9 % at C = 1: docs/PERFORMANCE.md);
// earlier kernels had lost with it (session 11).
namespace dsinfer::cuda {

// Small: the row-wise kernels around the GEMMs (embedding, RoPE table, bias, BF16 rounding,
// feature gathers) and the drafter's own kernels (q/k store, block attention, Markov step,
// confidence, ids), which used to break the chain at every drafter layer and Markov position.
enum class PdlSite : unsigned { Gemv = 1, Attention = 2, QkStep = 4, Small = 8 };
constexpr unsigned kPdlAllSites = 15;
bool pdl_enabled(PdlSite site);  // cuda_device.cpp: sm_90+ and the site selected (scope, else env)

// While it lives, this thread's launches use exactly `sites` (a PdlSite mask), whatever
// DSINFER_CUDA_PDL says; scopes nest. Tests use it to run one forward under each choice.
class PdlScope {
 public:
  explicit PdlScope(unsigned sites);
  ~PdlScope();
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  int previous_;
};

// Raises `kernel`'s limit of dynamic shared memory to at least `bytes`; never lowers it
// (cuda_device.cpp; thread-safe). The attribute belongs to the kernel, for every thread of
// the process: a limit remembered per thread let one thread set a smaller limit than the one
// another thread had set and was launching against ("invalid argument": tensor-parallel
// ranks on threads, docs/PERFORMANCE.md session 24).
void raise_dynamic_smem(const void* kernel, size_t bytes);

// The OR of the bits of the names in value, a comma list of names (cuda_device.cpp); an
// unknown or empty name throws Error naming var and the names it takes.
struct NamedBit {
  const char* name;
  unsigned bit;
};
unsigned parse_name_list(const char* var, const std::string& value, std::initializer_list<NamedBit> names);

#ifdef __CUDACC__
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... KArgs, typename... Args>
void launch_pdl(PdlSite site, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled(site) ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
  if (e != cudaSuccess) {
    // The launch's shape in the message: the kernel is not named here, its shape tells it.
    const std::string what = "cudaLaunchKernelEx (grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                             std::to_string(grid.z) + ", block " + std::to_string(block.x) + "x" +
                             std::to_string(block.y) + ", dynamic shared memory " + std::to_string(smem) + " bytes" +
                             (cfg.numAttrs ? ", PDL" : "") + ")";
    ::dsinfer::cuda::throw_cuda(e, what.c_str(), __FILE__, __LINE__);
  }
}
#endif  // __CUDACC__

}  // namespace dsinfer::cuda
