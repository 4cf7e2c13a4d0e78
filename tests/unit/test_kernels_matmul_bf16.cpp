// dsinfer tests: matmul's Bf16Dot precision (x rounded to BF16, vdpbf16ps accumulation).
//
// Checks, for every Bf16Dot path this CPU can run (scalar, AVX2 emulation, AVX-512F
// emulation, native AVX512_BF16):
//  - the specification helpers of matmul_internal.h against the vdpbf16ps instruction
//    itself, lane by lane, including the underflow range (when the CPU has it);
//  - every path bit-identical to the specification, written out here from those helpers,
//    over many shapes (K around the 32-element chunk, rows around the tile panels, m
//    around the 4-row blocks, thread splits), and in the underflow range;
//  - batch invariance: row i alone equals row i in any batch, with any thread split;
//  - subnormal x and W count as zero; NaN and Inf propagate;
//  - accuracy against a double-precision reference with x rounded to BF16;
//  - F32/F16 weights ignore the setting; the setting and DSINFER_MATMUL select it.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"

namespace dsinfer {
namespace {

using matmul_detail::Path;
using matmul_detail::path_name;

constexpr MatmulPrecision kBf16 = MatmulPrecision::Bf16Dot;

std::vector<Path> paths() {
  std::vector<Path> v;
  for (Path p : {Path::Scalar, Path::Avx2, Path::Avx512, Path::Avx512Bf16})
    if (static_cast<int>(p) <= static_cast<int>(matmul_detail::hardware_path())) v.push_back(p);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// BF16 weights at a chosen misalignment (the kernels must cope with any byte offset).
struct Bf16Weights {
  std::vector<unsigned char> storage;
  WeightView view;
  const uint16_t* at(int64_t row) const {
    return reinterpret_cast<const uint16_t*>(static_cast<const char*>(view.data) + row * view.cols * 2);
  }
  uint16_t get(int64_t row, int64_t k) const {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(view.data) + (row * view.cols + k) * 2, 2);
    return h;
  }
};

template <class Gen>
Bf16Weights make_weights(int64_t rows, int64_t cols, size_t misalign, Gen&& gen) {
  Bf16Weights t;
  const size_t n = static_cast<size_t>(rows * cols);
  // Exactly the matrix, no slack after it: a read past W's end would touch the guard of an
  // ASan build (and the masked tail loads must not need slack).
  t.storage.assign(n * 2 + misalign, 0);
  unsigned char* base = t.storage.data() + misalign;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = gen(i);
    std::memcpy(base + 2 * i, &h, 2);
  }
  t.view = WeightView{base, DType::BF16, rows, cols};
  return t;
}

Bf16Weights random_weights(int64_t rows, int64_t cols, size_t misalign, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  return make_weights(rows, cols, misalign, [&](size_t) { return f32_to_bf16(nd(rng)); });
}

std::vector<float> random_x(int64_t m, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (auto& v : x) v = ud(rng);
  return x;
}

// A float of random sign and mantissa with exponent in [lo, hi] (normal range).
float random_in_binades(std::mt19937& rng, int lo, int hi) {
  std::uniform_int_distribution<int> e(lo, hi);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const float v = std::ldexp(mant(rng), e(rng));
  return (rng() & 1) ? -v : v;
}

// The canonical Bf16Dot dot product of one x row and one W row (matmul_internal.h),
// written from the specification helpers, independently of the kernels.
float spec_dot(const float* x, const uint16_t* w_unaligned, int64_t K) {
  using namespace matmul_detail;
  const int64_t K32 = (K + 31) / 32 * 32;
  const auto xv = [&](int64_t k) { return k < K ? bf16_to_f32(x_to_bf16(x[k])) : 0.0f; };
  const auto wv = [&](int64_t k) {
    if (k >= K) return 0.0f;
    uint16_t h;
    std::memcpy(&h, reinterpret_cast<const char*>(w_unaligned) + 2 * k, 2);
    return flush_subnormal(bf16_to_f32(h));
  };
  float p[16] = {};
  for (int64_t c = 0; c < K32; c += 32)
    for (int l = 0; l < 16; ++l) {
      p[l] = bf16_dot_step(p[l], xv(c + 2 * l + 1), wv(c + 2 * l + 1));
      p[l] = bf16_dot_step(p[l], xv(c + 2 * l), wv(c + 2 * l));
    }
  return reduce16_ftz(p);
}

std::vector<float> spec_matmul(const std::vector<float>& x, int64_t m, const Bf16Weights& t) {
  const int64_t N = t.view.rows, K = t.view.cols;
  std::vector<float> y(static_cast<size_t>(m * N));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < N; ++j) y[i * N + j] = spec_dot(x.data() + i * K, t.at(j), K);
  return y;
}

// Runs every path (twice: one thread, and two threads with chunks forced small) and
// compares with `want` bit for bit.
void expect_paths_match(const std::vector<float>& x, int64_t m, const Bf16Weights& t, const std::vector<float>& want,
                        ThreadPool& pool2, const std::string& what) {
  ThreadPool pool1(1);
  for (Path path : paths())
    for (ThreadPool* pool : {&pool1, &pool2}) {
      std::vector<float> y(want.size(), -7.0f);
      matmul_detail::matmul_path(path, kBf16, x.data(), m, t.view, y.data(), pool, pool == &pool1 ? matmul_detail::kMinMacsPerChunk : 1);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_TRUE(same_bits(y[i], want[i])) << what << " path=" << path_name(path) << " threads=" << pool->size()
                                              << " at " << i << ": " << y[i] << " vs spec " << want[i];
    }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void hw_dpbf16(const float* acc, const uint16_t* a,
                                                                         const uint16_t* b, float* out) {
  const __m512 r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
  _mm512_storeu_ps(out, r);
}
#endif

// The specification's step() is the instruction, lane for lane: random normal values, and
// values whose products and sums straddle FLT_MIN (exact products below FLT_MIN, flushes
// to signed zeros, the unbounded-exponent rounding at the threshold).
TEST(MatmulBf16, SpecStepMatchesVdpbf16ps) {
#if defined(__x86_64__)
  if (static_cast<int>(matmul_detail::hardware_path()) < static_cast<int>(Path::Avx512Bf16))
    GTEST_SKIP() << "CPU lacks AVX512_BF16";
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Range 2 picks from values that hit the corners: signed zeros, products of exactly
  // FLT_MIN or half of it, sums just below FLT_MIN on either side of the rounding point.
  const float acc_corner[] = {0.0f, -0.0f, FLT_MIN, -FLT_MIN, 1.5f * FLT_MIN, -1.5f * FLT_MIN, 1.0f};
  const float ab_corner[] = {0.0f, -0.0f, 1.0f, -1.0f, 0x1p-63f, -0x1p-63f, 0x1p-64f, 0x1.8p-75f,
                             -0x1.8p-75f, 0x1p-75f, -0x1p-75f, 0x1p-76f, 0x1p-77f, 0x1p-51f};
  const auto pick = [&](const auto& set) { return set[rng() % (sizeof(set) / sizeof(set[0]))]; };
  int64_t lanes = 0;
  for (int range = 0; range < 3; ++range)
    for (int it = 0; it < 20000; ++it) {
      alignas(64) float acc[16], out[16];
      alignas(64) uint16_t a[32], b[32];
      for (int i = 0; i < 16; ++i) {
        if (range == 0) acc[i] = nd(rng) * 4;
        else if (range == 1) acc[i] = (rng() % 4 == 0) ? 0.0f : random_in_binades(rng, -126, -123);
        else acc[i] = pick(acc_corner);
      }
      for (int i = 0; i < 32; ++i) {
        const auto gen = [&] {
          return f32_to_bf16(range == 0 ? nd(rng) : range == 1 ? random_in_binades(rng, -75, -50) : pick(ab_corner));
        };
        a[i] = gen();
        b[i] = gen();
      }
      hw_dpbf16(acc, a, b, out);
      for (int l = 0; l < 16; ++l, ++lanes) {
        float p = matmul_detail::bf16_dot_step(acc[l], bf16_to_f32(a[2 * l + 1]), bf16_to_f32(b[2 * l + 1]));
        p = matmul_detail::bf16_dot_step(p, bf16_to_f32(a[2 * l]), bf16_to_f32(b[2 * l]));
        ASSERT_TRUE(same_bits(p, out[l])) << "range " << range << " lane " << l << ": acc " << std::hexfloat << acc[l]
                                          << " spec " << p << " hw " << out[l];
      }
    }
  EXPECT_EQ(lanes, 3 * 20000 * 16);
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

TEST(MatmulBf16, PathsMatchSpecManyShapes) {
  ThreadPool pool(2);
  const int64_t k_list[] = {1, 7, 31, 32, 33, 64, 320, 896, 1000};
  const int64_t m_all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 64};
  uint32_t seed = 1;
  for (int64_t K : k_list) {
    // Every row count 1..50 (W panels of 1..12 rows plus partial ones) at a few m; a few
    // row counts at every m.
    for (int64_t rows = 1; rows <= 50; ++rows) {
      const bool all_m = rows == 1 || rows == 7 || rows == 13 || rows == 24 || rows == 50;
      Bf16Weights t = random_weights(rows, K, rows % 3, seed++);
      for (int64_t m : m_all) {
        if (!all_m && m != 1 && m != 5 && m != 9) continue;
        auto x = random_x(m, K, seed++);
        expect_paths_match(x, m, t, spec_matmul(x, m, t), pool,
                           "K=" + std::to_string(K) + " rows=" + std::to_string(rows) + " m=" + std::to_string(m));
        if (HasFatalFailure()) return;
      }
    }
  }
  // A tall matrix (the 12M target's lm_head shape, and a ragged K).
  for (int64_t K : {int64_t{320}, int64_t{33}}) {
    Bf16Weights t = random_weights(8192, K, 1, seed++);
    for (int64_t m : {1, 4, 9}) {
      auto x = random_x(m, K, seed++);
      expect_paths_match(x, m, t, spec_matmul(x, m, t), pool, "rows=8192 K=" + std::to_string(K) + " m=" + std::to_string(m));
      if (HasFatalFailure()) return;
    }
  }
}

// Products and partial sums around FLT_MIN: the paths must flush exactly as the hardware.
TEST(MatmulBf16, PathsMatchSpecInUnderflowRange) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  // Products of 2^-130 .. 2^-122 with random signs: lanes and sums cross FLT_MIN = 2^-126.
  for (int64_t K : {int64_t{32}, int64_t{100}, int64_t{320}}) {
    Bf16Weights t = make_weights(37, K, 1, [&](size_t) { return f32_to_bf16(random_in_binades(rng, -65, -62)); });
    std::vector<float> x(static_cast<size_t>(9 * K));
    for (auto& v : x) v = random_in_binades(rng, -65, -62);
    const auto want = spec_matmul(x, 9, t);
    int flushed = 0;
    for (float v : want) flushed += v == 0.0f;
    EXPECT_GT(flushed, 0) << "the data should reach the underflow range";
    expect_paths_match(x, 9, t, want, pool, "underflow K=" + std::to_string(K));
  }
}

// Row i of y must not depend on m, on its neighbours in the batch, on the thread count or
// chunking, nor on whether the m == 1 or m > 1 path ran.
TEST(MatmulBf16, BatchInvariance) {
  ThreadPool p1(1), p2(2), p3(3);
  ThreadPool* pools[] = {&p1, &p2, &p3};
  const int64_t rows = 203, cols = 1037, total = 37;  // cols: 32 full chunks + a 13-wide tail
  Bf16Weights t = random_weights(rows, cols, 3, 99);
  auto x = random_x(total, cols, 5);
  for (Path path : paths()) {
    std::vector<float> alone(static_cast<size_t>(total * rows));
    for (int64_t i = 0; i < total; ++i)
      matmul_detail::matmul_path(path, kBf16, x.data() + i * cols, 1, t.view, alone.data() + i * rows, &p1);
    const int64_t batches[][2] = {{0, 37}, {0, 2}, {5, 8}, {3, 16}, {17, 3}, {36, 1}, {1, 13}, {20, 17}};
    for (ThreadPool* pool : pools)
      for (int64_t min_macs : {int64_t{1}, int64_t{20000}, matmul_detail::kMinMacsPerChunk})
        for (auto& b : batches) {
          const int64_t i0 = b[0], m = b[1];
          std::vector<float> y(static_cast<size_t>(m * rows));
          matmul_detail::matmul_path(path, kBf16, x.data() + i0 * cols, m, t.view, y.data(), pool, min_macs);
          ASSERT_EQ(std::memcmp(y.data(), alone.data() + i0 * rows, y.size() * 4), 0)
              << path_name(path) << " threads=" << pool->size() << " batch=[" << i0 << "," << i0 + m << ")";
        }
  }
}

// Subnormal x (including one that f32_to_bf16 alone would round up to FLT_MIN) and
// subnormal W elements count as zero, on every path. Each is paired with a large factor
// (2^100 .. 2^120) so that, unflushed, its product would show in a sum of order 1.
TEST(MatmulBf16, SubnormalInputsFlushed) {
  const int64_t K = 77, rows = 4, m = 2;  // K: two full chunks and a 13-wide tail
  Bf16Weights t = random_weights(rows, K, 0, 11);
  Bf16Weights t_zeroed = random_weights(rows, K, 0, 11);
  auto x = random_x(m, K, 12);
  const auto set_w = [&](Bf16Weights& tw, int64_t j, int64_t k, float v) {
    const uint16_t h = f32_to_bf16(v);
    std::memcpy(const_cast<void*>(static_cast<const void*>(tw.at(j) + k)), &h, 2);
  };
  const auto set_w_bits = [&](Bf16Weights& tw, int64_t j, int64_t k, uint16_t h) {
    std::memcpy(const_cast<void*>(static_cast<const void*>(tw.at(j) + k)), &h, 2);
  };
  // Subnormal x against large W (row 1 of x has zeros there).
  const struct {
    int64_t k;
    float x, w;
  } xs[] = {{5, 0x1p-130f, 0x1p100f}, {40, -FLT_MIN * (1.0f - 0x1p-20f), 0x1p120f}, {70, -0x1p-140f, 0x1p110f}};
  auto x_zeroed = x;
  for (const auto& e : xs) {
    x[e.k] = e.x;
    x_zeroed[e.k] = std::copysign(0.0f, e.x);
    x[K + e.k] = x_zeroed[K + e.k] = 0.0f;
    for (int64_t j = 0; j < rows; ++j) {
      set_w(t, j, e.k, e.w);
      set_w(t_zeroed, j, e.k, e.w);
    }
  }
  // Subnormal W (row j at column 10 + j, other rows zero there) against x = 2^120.
  const uint16_t w_sub[rows] = {0x0001, 0x8001, 0x007f, 0x8040};
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t k = 10 + j;
    x[k] = x[K + k] = x_zeroed[k] = x_zeroed[K + k] = 0x1p120f;
    for (int64_t r = 0; r < rows; ++r) {
      set_w_bits(t, r, k, r == j ? w_sub[j] : uint16_t{0});
      set_w_bits(t_zeroed, r, k, r == j ? static_cast<uint16_t>(w_sub[j] & 0x8000) : uint16_t{0});
    }
  }
  // DAZ keeps the sign, so the flushed inputs are exactly the zeroed ones.
  const auto want = spec_matmul(x_zeroed, m, t_zeroed);
  EXPECT_EQ(std::memcmp(want.data(), spec_matmul(x, m, t).data(), want.size() * 4), 0);
  ThreadPool pool(2);
  expect_paths_match(x, m, t, want, pool, "subnormals");
  // The same data through the F32 path does see the subnormals (the test has teeth).
  std::vector<float> f32(want.size()), f32_zeroed(want.size());
  matmul_detail::matmul_path(Path::Scalar, MatmulPrecision::F32, x.data(), m, t.view, f32.data(), &pool);
  matmul_detail::matmul_path(Path::Scalar, MatmulPrecision::F32, x_zeroed.data(), m, t_zeroed.view, f32_zeroed.data(), &pool);
  for (int64_t j = 0; j < rows; ++j) EXPECT_NE(f32[j], f32_zeroed[j]) << "row " << j;
}

// Against a double-precision reference of the same inputs with x rounded to BF16: the F32
// accumulation error bound (K/16 sequential steps per lane, a 4-level tree) holds, and the
// result stays within BF16 rounding of x (2^-8 relative to sum |x·w|) of the exact x.
TEST(MatmulBf16, AccuracyAgainstDoubleReference) {
  ThreadPool pool(2);
  for (int64_t K : {int64_t{7}, int64_t{33}, int64_t{320}, int64_t{1000}}) {
    const int64_t rows = 29, m = 6;
    Bf16Weights t = random_weights(rows, K, 0, static_cast<uint32_t>(K));
    auto x = random_x(m, K, static_cast<uint32_t>(K + 1));
    for (Path path : paths()) {
      std::vector<float> y(static_cast<size_t>(m * rows));
      matmul_detail::matmul_path(path, kBf16, x.data(), m, t.view, y.data(), &pool);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < rows; ++j) {
          double ref = 0, exact = 0, abs_sum = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double wk = bf16_to_f32(t.get(j, k)), xk = x[i * K + k];
            ref += static_cast<double>(bf16_to_f32(f32_to_bf16(x[i * K + k]))) * wk;
            exact += xk * wk;
            abs_sum += std::fabs(xk * wk);
          }
          const double got = y[i * rows + j];
          const double f32_bound = (static_cast<double>(K) / 16 + 5) * std::ldexp(1.0, -24) * abs_sum * 1.02 + 1e-30;
          ASSERT_LE(std::fabs(got - ref), f32_bound) << path_name(path) << " K=" << K << " i=" << i << " j=" << j;
          ASSERT_LE(std::fabs(got - exact), std::ldexp(1.0, -8) * abs_sum + f32_bound)
              << path_name(path) << " K=" << K << " i=" << i << " j=" << j;
        }
    }
  }
}

TEST(MatmulBf16, SpecialValuesPropagate) {
  ThreadPool pool(1);
  const int64_t K = 45, rows = 3;  // one full chunk and a 13-wide tail
  for (Path path : paths()) {
    Bf16Weights t = random_weights(rows, K, 0, 4);
    auto x = random_x(1, K, 8);
    std::vector<float> y(rows);
    const auto run = [&] { matmul_detail::matmul_path(path, kBf16, x.data(), 1, t.view, y.data(), &pool); };
    x[3] = INFINITY;  // full chunk: +-inf (or NaN if the signs of the products differ)
    run();
    for (float v : y) EXPECT_TRUE(std::isinf(v) || std::isnan(v)) << path_name(path);
    x[3] = 1.0f;
    x[40] = NAN;  // tail chunk
    run();
    for (float v : y) EXPECT_TRUE(std::isnan(v)) << path_name(path);
    x[40] = 1.0f;
    x[0] = x[1] = FLT_MAX;  // rounds to +inf in BF16
    run();
    for (float v : y) EXPECT_TRUE(std::isinf(v) || std::isnan(v)) << path_name(path);
    x[0] = x[1] = 1.0f;
    const uint16_t nan_w = 0x7fc1;  // NaN in W row 1 only
    std::memcpy(const_cast<void*>(static_cast<const void*>(t.at(1) + 20)), &nan_w, 2);
    run();
    EXPECT_FALSE(std::isnan(y[0]));
    EXPECT_TRUE(std::isnan(y[1])) << path_name(path);
    EXPECT_FALSE(std::isnan(y[2]));
  }
}

// F32 and F16 weights run the F32 path whatever the precision says.
TEST(MatmulBf16, OnlyBf16WeightsAreAffected) {
  ThreadPool pool(1);
  const int64_t rows = 13, K = 70, m = 5;
  auto x = random_x(m, K, 1);
  std::vector<float> wf(static_cast<size_t>(rows * K));
  std::vector<uint16_t> wh(wf.size());
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 0; i < wf.size(); ++i) {
    wf[i] = nd(rng);
    wh[i] = f32_to_f16(wf[i]);
  }
  for (const WeightView& v : {WeightView{wf.data(), DType::F32, rows, K}, WeightView{wh.data(), DType::F16, rows, K}})
    for (Path path : paths()) {
      std::vector<float> a(static_cast<size_t>(m * rows)), b(a.size());
      matmul_detail::matmul_path(path, MatmulPrecision::F32, x.data(), m, v, a.data(), &pool);
      matmul_detail::matmul_path(path, kBf16, x.data(), m, v, b.data(), &pool);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << dtype_name(v.dtype) << " " << path_name(path);
    }
  // ...and BF16 weights do change (x loses 16 bits).
  Bf16Weights t = random_weights(rows, K, 0, 3);
  std::vector<float> a(static_cast<size_t>(m * rows)), b(a.size());
  matmul_detail::matmul_isa(isa_level(), MatmulPrecision::F32, x.data(), m, t.view, a.data(), &pool);
  matmul_detail::matmul_isa(isa_level(), kBf16, x.data(), m, t.view, b.data(), &pool);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(MatmulBf16, DegenerateShapes) {
  ThreadPool pool(2);
  std::vector<float> y(6, 5.0f);
  float x[3] = {1, 2, 3};
  uint16_t w[3] = {0x3f80, 0x3f80, 0x3f80};
  for (Path path : paths()) {
    matmul_detail::matmul_path(path, kBf16, x, 2, WeightView{w, DType::BF16, 3, 0}, y.data(), &pool);
    for (float v : y) EXPECT_EQ(v, 0.0f);
    matmul_detail::matmul_path(path, kBf16, x, 0, WeightView{w, DType::BF16, 3, 1}, nullptr, &pool);
    matmul_detail::matmul_path(path, kBf16, x, 1, WeightView{w, DType::BF16, 1, 3}, y.data(), &pool);
    EXPECT_EQ(y[0], 6.0f);
  }
}

// matmul() follows set_matmul_precision(); the test restores the default it found.
TEST(MatmulBf16, PublicEntryPointFollowsSetting) {
  const MatmulPrecision before = matmul_precision();
  Bf16Weights t = random_weights(50, 70, 0, 1);
  auto x = random_x(3, 70, 2);
  std::vector<float> y(150), ref(150);
  for (MatmulPrecision p : {MatmulPrecision::F32, kBf16}) {
    set_matmul_precision(p);
    EXPECT_EQ(matmul_precision(), p);
    matmul(x.data(), 3, t.view, y.data());
    matmul_detail::matmul_isa(isa_level(), p, x.data(), 3, t.view, ref.data(), nullptr);
    EXPECT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0) << matmul_precision_name(p);
  }
  set_matmul_precision(before);
}

// DSINFER_MATMUL is read once per process; death tests run in a fresh process.
TEST(MatmulBf16DeathTest, EnvironmentSelectsPrecision) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("DSINFER_MATMUL", "bf16", 1);
        std::exit(matmul_precision() == MatmulPrecision::Bf16Dot ? 3 : 4);
      },
      testing::ExitedWithCode(3), "");
  EXPECT_EXIT(
      {
        setenv("DSINFER_MATMUL", "bf16", 1);
        set_matmul_precision(MatmulPrecision::F32);  // code wins over the environment
        std::exit(matmul_precision() == MatmulPrecision::F32 ? 3 : 4);
      },
      testing::ExitedWithCode(3), "");
  EXPECT_EXIT(
      {
        setenv("DSINFER_MATMUL", "fp8", 1);
        try {
          matmul_precision();
        } catch (const Error&) {
          std::exit(3);
        }
        std::exit(4);
      },
      testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace dsinfer
