// dsinfer kernels: matmul entry point, thread split, and the portable scalar kernel.
//
// matmul() validates the WeightView, picks the rows kernel for isa_level(), and hands
// blocks of output features (rows of W) to the thread pool. Every thread computes whole
// dot products (never a slice of the k reduction), so the split cannot change any bit of
// y; see matmul_internal.h for the canonical reduction order that all kernels follow.
// The scalar kernel here is the executable form of that specification: 16 explicit
// partial sums updated with std::fma (never a*b+c, which GCC may or may not contract into
// an fma depending on flags; in C++ mode it does so by default even with -std=c++20).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"

namespace dsinfer {
namespace matmul_detail {

namespace {

// Converts one row of W (any supported dtype) to F32. Lossless for BF16 and F16.
void row_to_f32(const WeightView& w, int64_t row, float* out) {
  const int64_t n = w.cols;
  switch (w.dtype) {
    case DType::F32: {
      std::memcpy(out, static_cast<const char*>(w.data) + row * n * 4, static_cast<size_t>(n) * 4);
      break;
    }
    case DType::BF16: {
      // memcpy per element: the mmapped pointer need not be 2-byte aligned.
      const char* p = static_cast<const char*>(w.data) + row * n * 2;
      for (int64_t k = 0; k < n; ++k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = bf16_to_f32(h);
      }
      break;
    }
    case DType::F16: {
      const char* p = static_cast<const char*>(w.data) + row * n * 2;
      for (int64_t k = 0; k < n; ++k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = f16_to_f32(h);
      }
      break;
    }
    default: break;  // rejected by validate()
  }
}

void validate(const WeightView& w, int64_t m) {
  check(w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16,
        std::string("matmul: unsupported weight dtype ") + dtype_name(w.dtype));
  check(w.rows >= 0 && w.cols >= 0 && m >= 0, "matmul: negative dimension");
  check(w.data != nullptr || w.rows == 0 || w.cols == 0, "matmul: null weight data");
}

}  // namespace

void rows_scalar(const float* x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
                 int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t K16 = K / kLanes * kLanes;
  std::vector<float> wrow(static_cast<size_t>(K));
  for (int64_t j = j0; j < j1; ++j) {
    // Convert the W row once and reuse it for every x row (the same reuse the SIMD
    // kernels get from register blocking).
    row_to_f32(w, j, wrow.data());
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * K;
      float p[kLanes] = {};
      for (int64_t k = 0; k < K16; k += kLanes)
        for (int l = 0; l < kLanes; ++l) p[l] = std::fma(xi[k + l], wrow[k + l], p[l]);
      float acc = reduce16(p);
      for (int64_t k = K16; k < K; ++k) acc = std::fma(xi[k], wrow[k], acc);
      y[i * ldy + j] = acc;
    }
  }
}

IsaLevel hardware_isa_level() {
  const auto& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return IsaLevel::Scalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)) return IsaLevel::Avx2;
  return IsaLevel::Avx512;
}

RowsKernel rows_kernel(IsaLevel isa) {
#if defined(__x86_64__)
  if (static_cast<int>(isa) > static_cast<int>(hardware_isa_level())) isa = hardware_isa_level();
  switch (isa) {
    case IsaLevel::Avx512: return rows_avx512;
    case IsaLevel::Avx2: return rows_avx2;
    case IsaLevel::Scalar: return rows_scalar;
  }
#endif
  return rows_scalar;
}

void matmul_isa(IsaLevel isa, const float* x, int64_t m, const WeightView& w, float* y,
                ThreadPool* pool, int64_t min_macs_per_chunk) {
  validate(w, m);
  if (m == 0 || w.rows == 0) return;
  if (w.cols == 0) {
    std::fill(y, y + m * w.rows, 0.0f);
    return;
  }
  const RowsKernel kernel = rows_kernel(isa);
  if (!pool) pool = &ThreadPool::global();

  // Scheduling unit: 16 rows of W, so that each thread's range starts on a multiple of the
  // kernels' row panels. The grain keeps every chunk at >= 256K multiply-adds (512 KB of
  // BF16 weights, ~15 us, when m == 1), so that a worker's wake-up stays small against the
  // chunk's run time; smaller matrices run on the calling thread alone. A late worker
  // costs little: the caller claims any chunk nobody has started. (Measured: splitting a
  // 1024 x 1024 BF16 matvec over 2 threads at this grain was ~15% faster than not.)
  constexpr int64_t kBlock = 16;
  const int64_t n_blocks = (w.rows + kBlock - 1) / kBlock;
  const int64_t macs_per_block = kBlock * w.cols * m;
  const int64_t grain = std::max<int64_t>(1, (std::max<int64_t>(min_macs_per_chunk, 1) + macs_per_block - 1) / macs_per_block);
  const int64_t rows = w.rows;
  pool->parallel_for(
      static_cast<size_t>(n_blocks),
      [&](size_t b0, size_t b1) {
        const int64_t j0 = static_cast<int64_t>(b0) * kBlock;
        const int64_t j1 = std::min<int64_t>(static_cast<int64_t>(b1) * kBlock, rows);
        kernel(x, m, w, j0, j1, y, rows);
      },
      static_cast<size_t>(grain));
}

}  // namespace matmul_detail

void matmul(const float* x, int64_t m, const WeightView& w, float* y, ThreadPool* pool) {
  matmul_detail::matmul_isa(isa_level(), x, m, w, y, pool);
}

void weight_row_to_f32(const WeightView& w, int64_t row, float* out) {
  matmul_detail::validate(w, 1);
  check(row >= 0 && row < w.rows, "weight_row_to_f32: row " + std::to_string(row) + " out of range [0, " +
                                      std::to_string(w.rows) + ")");
  matmul_detail::row_to_f32(w, row, out);
}

}  // namespace dsinfer
