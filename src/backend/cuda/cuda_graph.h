// dsinfer CUDA backend: capturing a stream's work into a CUDA graph, for the model's
// forwards (qwen3_cuda.cpp) and the GPU drafter's propose passes (cuda_drafter.cpp), which
// both capture a shape at its second sighting and replay it after.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {

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
