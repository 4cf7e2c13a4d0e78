// Shared by the CUDA test files (built only with DSINFER_CUDA): skip a test cleanly when the
// binary has the CUDA backend but the machine has no usable GPU (CI), naming why.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/cuda_backend.h"

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    const std::string why_no_gpu = ::dsinfer::cuda_unavailable_reason();           \
    if (!why_no_gpu.empty()) GTEST_SKIP() << "CUDA build, but " << why_no_gpu;     \
  } while (0)
