// dsinfer CUDA backend: capturing a stream's work into a CUDA graph, for the model's
// forwards (qwen3_cuda.cpp) and the GPU drafter's propose passes (cuda_drafter.cpp), which
// both capture a shape at its second sighting and replay it after.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

// Rows a graph shape is padded to (the model's forwards and the drafter's context commits).
// Padding rows cost what real rows do, and a small model's verify forward grows with its
// rows (the embedded target: 8 rows 0.29 ms, 16 0.35, 32 0.41 on the H200), so a batch of 21
// verify rows padded to 32 paid for 11 rows of nothing. Exact up to 8, then multiples of 4
// up to 32, of 8 up to 64, of 32 beyond: at most 24 shapes up to 256 rows.
inline int graph_rows_bucket(int n) {
  if (n <= 8) return n;
  if (n <= 32) return (n + 3) / 4 * 4;
  if (n <= 64) return (n + 7) / 8 * 8;
  return (n + 31) / 32 * 32;
}

// Runs enqueue() with `stream` capturing (thread-local mode: other threads' CUDA calls are
// not affected) and returns the instantiated graph. If enqueue throws, the capture is ended
// and dropped before the exception goes on.
template <typename Enqueue>
cudaGraphExec_t capture_graph(cudaStream_t stream, Enqueue&& enqueue, const char* what) {
  cudaGraph_t g = nullptr;
  DSINFER_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  DSINFER_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) throw_cuda(e, what, __FILE__, __LINE__);
  return exec;
}

}  // namespace dsinfer::cuda
