// dsinfer CUDA backend: NCCL loaded at run time (see cuda_nccl.h).
#include "backend/cuda/cuda_nccl.h"

#include <dlfcn.h>

#include <mutex>

#include "core/error.h"

namespace dsinfer::cuda {

namespace {

// The few entry points used, with NCCL's C signatures (ncclComm_t is a pointer, ncclResult_t
// and ncclDataType_t are ints: nccl.h), so no NCCL header is needed to build.
using NcclResult = int;
constexpr NcclResult kNcclSuccess = 0;
constexpr int kNcclFloat32 = 7;

struct NcclLib {
  void* handle = nullptr;
  std::string why;
  NcclResult (*comm_init_all)(void** comms, int ndev, const int* devlist) = nullptr;
  NcclResult (*comm_destroy)(void* comm) = nullptr;
  NcclResult (*all_gather)(const void* send, void* recv, size_t count, int dtype, void* comm, cudaStream_t stream) = nullptr;
  const char* (*error_string)(NcclResult r) = nullptr;
};

NcclLib& nccl() {
  static NcclLib lib;
  static std::once_flag once;
  std::call_once(once, [] {
    lib.handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib.handle) {
      const char* e = dlerror();
      lib.why = std::string("libnccl.so.2 not found (") + (e ? e : "dlopen failed") + ")";
      return;
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(lib.handle, name);
      if (!p && lib.why.empty()) lib.why = std::string("libnccl.so.2 has no ") + name;
      return p;
    };
    lib.comm_init_all = reinterpret_cast<decltype(lib.comm_init_all)>(sym("ncclCommInitAll"));
    lib.comm_destroy = reinterpret_cast<decltype(lib.comm_destroy)>(sym("ncclCommDestroy"));
    lib.all_gather = reinterpret_cast<decltype(lib.all_gather)>(sym("ncclAllGather"));
    lib.error_string = reinterpret_cast<decltype(lib.error_string)>(sym("ncclGetErrorString"));
  });
  return lib;
}

void check_nccl(NcclResult r, const char* what) {
  if (r == kNcclSuccess) return;
  const NcclLib& lib = nccl();
  throw Error(std::string("NCCL: ") + what + " failed: " + (lib.error_string ? lib.error_string(r) : "error") + " (" +
              std::to_string(r) + ")");
}

}  // namespace

std::string nccl_unavailable_reason() { return nccl().why; }

NcclGroup::NcclGroup(const std::vector<int>& devices) {
  const std::string why = nccl_unavailable_reason();
  if (!why.empty()) throw Error("tensor parallelism over GPUs needs NCCL: " + why);
  if (devices.empty()) throw Error("NCCL group: no devices");
  comms_.assign(devices.size(), nullptr);
  check_nccl(nccl().comm_init_all(comms_.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll");
}

NcclGroup::~NcclGroup() {
  for (void* c : comms_)
    if (c) nccl().comm_destroy(c);
}

void NcclGroup::all_gather(int rank, const float* send, float* recv, size_t n, cudaStream_t stream) {
  if (rank < 0 || rank >= ranks()) throw Error("NCCL group: rank " + std::to_string(rank) + " out of range");
  check_nccl(nccl().all_gather(send, recv, n, kNcclFloat32, comms_[static_cast<size_t>(rank)], stream), "ncclAllGather");
}

}  // namespace dsinfer::cuda
