// dsinfer CUDA backend: NCCL, the collective library tensor parallelism over GPUs runs on
// (issue 10), loaded at run time (dlopen of libnccl.so.2): the binary does not link it and
// runs without it until a split over several GPUs is asked for; then a missing library is a
// one-line error.
//
// Tensor-parallel ranks need one collective: the sum of every rank's partial [rows, hidden]
// output. It is done as an all-gather (no arithmetic in NCCL) followed by a sum in rank order
// on each GPU (sum_rank_rows, cuda_kernels.h): every rank gets the same bits, the bits of the
// host-memory reduction the one-GPU form uses (HostAllReduce), and a row's sum never depends
// on how many rows share the call. NCCL's own all-reduce picks its algorithm and chunking by
// message size, so a row's summation order would follow the batch, and greedy speculation
// would no longer equal plain greedy decoding.
//
// Ranks live in this process, one thread and one GPU each (ncclCommInitAll over the
// devices), which keeps the engine, its KV bookkeeping and the HTTP server in one address
// space. Built here and never run: no machine with several GPUs was lent so far.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace dsinfer::cuda {

// "" when libnccl.so.2 loads and has the functions used here; else why not (one line).
std::string nccl_unavailable_reason();

class NcclGroup {
 public:
  // One communicator per device (rank r on devices[r]); Error when NCCL is missing or its
  // initialisation fails (naming the NCCL error).
  explicit NcclGroup(const std::vector<int>& devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  int ranks() const { return static_cast<int>(comms_.size()); }
  // Rank r's n floats at send, gathered into recv ([ranks][n], rank order) of every rank, on
  // rank r's stream. Every rank must call it, each from its own thread, with the same n.
  void all_gather(int rank, const float* send, float* recv, size_t n, cudaStream_t stream);

 private:
  std::vector<void*> comms_;  // ncclComm_t
};

}  // namespace dsinfer::cuda
