// dsinfer kernels: matmul entry point, precision setting, thread split, and the portable
// scalar kernels.
//
// matmul() validates the WeightView, picks the kernel for isa_level() and the precision,
// (for Bf16Dot) rounds x to BF16 into a scratch buffer, and hands blocks of output
// features (rows of W) to the thread pool. Every thread computes whole dot products
// (never a slice of the k reduction), so the split cannot change any bit of y; see
// matmul_internal.h for the canonical reduction orders that all kernels follow. The scalar
// kernels here are the executable form of those specifications: 16 explicit partial sums
// updated with std::fma (never a*b+c, which GCC may or may not contract into an fma
// depending on flags; in C++ mode it does so by default even with -std=c++20).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/env.h"
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

void x_to_bf16_scalar(const float* x, int64_t m, int64_t K, uint16_t* xb, int64_t ldx) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t k = 0; k < K; ++k) xb[i * ldx + k] = x_to_bf16(x[i * K + k]);
    std::fill(xb + i * ldx + K, xb + (i + 1) * ldx, uint16_t{0});
  }
}

void bf16_rows_scalar(const uint16_t* xb, int64_t ldx, int64_t m, const WeightView& w, int64_t j0,
                      int64_t j1, float* y, int64_t ldy) {
  const int64_t K = w.cols;
  std::vector<float> wrow(static_cast<size_t>(ldx), 0.0f);  // zero padding beyond K
  for (int64_t j = j0; j < j1; ++j) {
    row_to_f32(w, j, wrow.data());
    for (int64_t k = 0; k < K; ++k) wrow[k] = flush_subnormal(wrow[k]);
    for (int64_t i = 0; i < m; ++i) {
      const uint16_t* xi = xb + i * ldx;
      float p[kLanes] = {};
      for (int64_t k = 0; k < ldx; k += kBf16Chunk)
        for (int l = 0; l < kLanes; ++l) {
          const int64_t odd = k + 2 * l + 1, even = k + 2 * l;
          p[l] = bf16_dot_step(p[l], bf16_to_f32(xi[odd]), wrow[odd]);
          p[l] = bf16_dot_step(p[l], bf16_to_f32(xi[even]), wrow[even]);
        }
      y[i * ldy + j] = reduce16_ftz(p);
    }
  }
}

IsaLevel hardware_isa_level() {
  const auto& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return IsaLevel::Scalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq)) return IsaLevel::Avx2;
  return IsaLevel::Avx512;
}

bool amx_usable() {
  static const bool ok = [] {
    const auto& f = cpu_features();
    if (!env_switch("DSINFER_AMX", true)) return false;
#if defined(__x86_64__)
    return hardware_isa_level() == IsaLevel::Avx512 && f.avx512bf16 && f.amx && f.amx_bf16 && amx_os_enabled();
#else
    (void)f;
    return false;
#endif
  }();
  return ok;
}

Path hardware_path() {
  if (hardware_isa_level() == IsaLevel::Avx512 && cpu_features().avx512bf16)
    return amx_usable() ? Path::Amx : Path::Avx512Bf16;
  return static_cast<Path>(hardware_isa_level());
}

Path path_for(IsaLevel isa) {
  return isa == IsaLevel::Avx512 ? Path::Amx : static_cast<Path>(isa);  // lowered by runnable_path
}

Path runnable_path(Path p) {
  return static_cast<int>(p) > static_cast<int>(hardware_path()) ? hardware_path() : p;
}

const char* path_name(Path p) {
  switch (p) {
    case Path::Scalar: return "scalar";
    case Path::Avx2: return "avx2";
    case Path::Avx512: return "avx512";
    case Path::Avx512Bf16: return "avx512bf16";
    case Path::Amx: return "amx";
  }
  return "?";
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

namespace {

struct Bf16Kernels {
  XToBf16 convert;
  Bf16RowsKernel rows;
};

Bf16Kernels bf16_kernels(Path path) {
#if defined(__x86_64__)
  switch (path) {
    case Path::Amx:  // for the matrices without an AMX layout (WeightView::amx_panels)
    case Path::Avx512Bf16: return {x_to_bf16_avx512, bf16_rows_avx512bf16};
    case Path::Avx512: return {x_to_bf16_avx512, bf16_rows_avx512};
    case Path::Avx2: return {x_to_bf16_avx2, bf16_rows_avx2};
    case Path::Scalar: break;
  }
#endif
  return {x_to_bf16_scalar, bf16_rows_scalar};
}

// Splits the output features of y[m, rows] into chunks for the pool; run(j0, j1) computes
// y[..][j0..j1).
template <class Run>
void split_rows(int64_t m, const WeightView& w, ThreadPool* pool, int64_t min_macs_per_chunk,
                const Run& run) {
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
        run(j0, j1);
      },
      static_cast<size_t>(grain));
}

// x rounded to BF16, one buffer per calling thread (the pool's workers only read it while
// the call runs), grown to the largest call and reused, 64-byte aligned.
uint16_t* bf16_scratch(size_t n) {
  constexpr size_t kAlign = 32;  // elements = 64 bytes
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < n + kAlign) buf.resize(n + kAlign);
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / 2;
}

}  // namespace

void matmul_path(Path path, MatmulPrecision prec, const float* x, int64_t m, const WeightView& w,
                 float* y, ThreadPool* pool, int64_t min_macs_per_chunk) {
  validate(w, m);
  if (m == 0 || w.rows == 0) return;
  if (w.cols == 0) {
    std::fill(y, y + m * w.rows, 0.0f);
    return;
  }
  path = runnable_path(path);
  if (!pool) pool = &ThreadPool::global();
  const int64_t rows = w.rows;
  if (prec == MatmulPrecision::Bf16Dot && w.dtype == DType::BF16) {
    const Bf16Kernels k = bf16_kernels(path);
    const int64_t ldx = (w.cols + kBf16Chunk - 1) / kBf16Chunk * kBf16Chunk;
    uint16_t* xb = bf16_scratch(static_cast<size_t>(m * ldx));
    k.convert(x, m, w.cols, xb, ldx);
#if defined(__x86_64__)
    // AMX for the matrices packed for it (WeightStore packs by shape when amx_usable()),
    // for every m alike; an unpacked matrix takes the vdpbf16ps kernel below, also for
    // every m.
    if (path == Path::Amx && w.amx_panels) {
      split_rows(m, w, pool, min_macs_per_chunk, [&](int64_t j0, int64_t j1) { amx_rows(xb, ldx, m, w, j0, j1, y, rows); });
      return;
    }
#endif
    split_rows(m, w, pool, min_macs_per_chunk,
               [&](int64_t j0, int64_t j1) { k.rows(xb, ldx, m, w, j0, j1, y, rows); });
    return;
  }
  // Path::Avx512Bf16 and Path::Amx are IsaLevel::Avx512 for F32 (the lowering above keeps
  // them valid ISAs).
  const RowsKernel kernel =
      rows_kernel(path >= Path::Avx512Bf16 ? IsaLevel::Avx512 : static_cast<IsaLevel>(path));
  split_rows(m, w, pool, min_macs_per_chunk, [&](int64_t j0, int64_t j1) { kernel(x, m, w, j0, j1, y, rows); });
}

void matmul_isa(IsaLevel isa, MatmulPrecision prec, const float* x, int64_t m, const WeightView& w,
                float* y, ThreadPool* pool, int64_t min_macs_per_chunk) {
  matmul_path(path_for(isa), prec, x, m, w, y, pool, min_macs_per_chunk);
}

}  // namespace matmul_detail

namespace {

// -1 until set_matmul_precision() is called.
std::atomic<int> g_precision_set{-1};

MatmulPrecision precision_from_env() {
  static const MatmulPrecision p = [] {
    const char* v = std::getenv("DSINFER_MATMUL");
    if (!v || std::strcmp(v, "f32") == 0) return MatmulPrecision::F32;
    check(std::strcmp(v, "bf16") == 0, std::string("DSINFER_MATMUL must be f32 or bf16, not '") + v + "'");
    return MatmulPrecision::Bf16Dot;
  }();
  return p;
}

}  // namespace

void set_matmul_precision(MatmulPrecision p) { g_precision_set.store(static_cast<int>(p), std::memory_order_relaxed); }

MatmulPrecision matmul_precision() {
  const int p = g_precision_set.load(std::memory_order_relaxed);
  return p >= 0 ? static_cast<MatmulPrecision>(p) : precision_from_env();
}

const char* matmul_precision_name(MatmulPrecision p) { return p == MatmulPrecision::Bf16Dot ? "bf16" : "f32"; }

void matmul(const float* x, int64_t m, const WeightView& w, float* y, ThreadPool* pool) {
  matmul_detail::matmul_isa(isa_level(), matmul_precision(), x, m, w, y, pool);
}

bool amx_wants(const WeightView& w) {
#if defined(__x86_64__)
  return matmul_precision() == MatmulPrecision::Bf16Dot && isa_level() == IsaLevel::Avx512 &&
         matmul_detail::amx_usable() && w.dtype == DType::BF16 && w.rows > 0 && w.cols > 0 &&
         w.cols % matmul_detail::kBf16Chunk == 0;
#else
  (void)w;
  return false;
#endif
}

const char* bf16_matmul_kernel_name() {
  return matmul_detail::path_name(matmul_detail::runnable_path(matmul_detail::path_for(isa_level())));
}

int64_t amx_pack_elems(const WeightView& w) {
  return matmul_detail::amx_packed_elems(w.rows, w.cols);
}

void amx_pack(const WeightView& w, uint16_t* out) {
  check(w.dtype == DType::BF16 && w.cols % matmul_detail::kBf16Chunk == 0,
        "amx_pack: needs a BF16 matrix with a multiple of 32 columns");
  matmul_detail::amx_pack_weights(w, out);
}

void weight_row_to_f32(const WeightView& w, int64_t row, float* out) {
  matmul_detail::validate(w, 1);
  check(row >= 0 && row < w.rows, "weight_row_to_f32: row " + std::to_string(row) + " out of range [0, " +
                                      std::to_string(w.rows) + ")");
  matmul_detail::row_to_f32(w, row, out);
}

}  // namespace dsinfer
