// dsinfer tests: matmul kernels (y = x · Wᵀ) in F32 precision, and weight_row_to_f32
// (the Bf16Dot precision is tested in test_kernels_matmul_bf16.cpp).
//
// Checks, for F32/BF16/F16 weights and every ISA path this CPU can run:
//  - accuracy against a double-precision reference (error bound relative to sum |x·w|),
//    over odd shapes (cols not a multiple of 8/16/32, rows = 1, m = 1..37);
//  - unaligned W and x pointers;
//  - batch invariance: row i of y is bit-identical whether computed alone, inside batches
//    of any size and position, with 1, 2 or 3 threads (separate pools, chunking forced
//    small so that the split really happens);
//  - scalar, AVX2 and AVX-512 kernels give identical bits (they share one reduction order;
//    the AVX-512 tiles reduce all their sums at once with a transposed tree, which these
//    comparisons check against the scalar reduce16 for every tile shape).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"

namespace dsinfer {
namespace {

using matmul_detail::hardware_isa_level;
using matmul_detail::matmul_isa;

std::vector<IsaLevel> isas() {
  std::vector<IsaLevel> v{IsaLevel::Scalar};
  if (hardware_isa_level() >= IsaLevel::Avx2) v.push_back(IsaLevel::Avx2);
  if (hardware_isa_level() >= IsaLevel::Avx512) v.push_back(IsaLevel::Avx512);
  return v;
}

// A weight matrix in a byte buffer at a chosen misalignment, plus its exact F32 values.
struct TestWeights {
  std::vector<unsigned char> storage;
  std::vector<float> values;  // [rows, cols], the exact values the stored elements encode
  WeightView view;
};

TestWeights make_weights(DType dt, int64_t rows, int64_t cols, size_t misalign, uint32_t seed) {
  TestWeights t;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(rows * cols);
  const size_t es = dtype_size(dt);
  t.storage.assign(n * es + misalign + 64, 0);
  t.values.resize(n);
  unsigned char* base = t.storage.data() + misalign;
  for (size_t i = 0; i < n; ++i) {
    float f = nd(rng);
    if (dt == DType::F32) {
      std::memcpy(base + 4 * i, &f, 4);
      t.values[i] = f;
    } else if (dt == DType::BF16) {
      uint16_t h = f32_to_bf16(f);
      std::memcpy(base + 2 * i, &h, 2);
      t.values[i] = bf16_to_f32(h);
    } else {
      uint16_t h = f32_to_f16(f);
      std::memcpy(base + 2 * i, &h, 2);
      t.values[i] = f16_to_f32(h);
    }
  }
  t.view = WeightView{base, dt, rows, cols};
  return t;
}

std::vector<float> make_x(int64_t m, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (auto& v : x) v = ud(rng);
  return x;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

// Error bound for an F32 dot product with 16 fma lanes, a 4-level tree and a scalar tail:
// at most K/16 + 4 + 15 roundings on any path, each <= 2^-24 relative to sum |x·w|.
double bound(int64_t K, double abs_sum) {
  return (static_cast<double>(K) / 16 + 20) * std::ldexp(1.0, -24) * abs_sum * 1.01 + 1e-30;
}

void expect_close_to_reference(const std::vector<float>& x, int64_t m, const TestWeights& t,
                               const std::vector<float>& y, const std::string& what) {
  const int64_t N = t.view.rows, K = t.view.cols;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, abs_sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        double p = static_cast<double>(x[i * K + k]) * t.values[j * K + k];
        ref += p;
        abs_sum += std::fabs(p);
      }
      double err = std::fabs(y[i * N + j] - ref);
      ASSERT_LE(err, bound(K, abs_sum)) << what << " i=" << i << " j=" << j << " ref=" << ref
                                        << " got=" << y[i * N + j];
    }
}

TEST(Matmul, MatchesDoubleReferenceOddShapes) {
  ThreadPool pool(2);
  const int64_t rows_list[] = {1, 3, 17, 33};
  const int64_t cols_list[] = {1, 7, 15, 16, 17, 31, 33, 64, 100, 257};
  const int64_t m_list[] = {1, 2, 3, 4, 5, 8, 13, 37};
  for (IsaLevel isa : isas())
    for (DType dt : kDtypes)
      for (int64_t rows : rows_list)
        for (int64_t cols : cols_list) {
          TestWeights t = make_weights(dt, rows, cols, 0, static_cast<uint32_t>(rows * 1000 + cols));
          for (int64_t m : m_list) {
            auto x = make_x(m, cols, static_cast<uint32_t>(m));
            std::vector<float> y(static_cast<size_t>(m * rows), -1.0f);
            matmul_isa(isa, MatmulPrecision::F32, x.data(), m, t.view, y.data(), &pool, 1);
            expect_close_to_reference(x, m, t, y,
                                      std::string(isa_level_name(isa)) + " " + dtype_name(dt) + " rows=" +
                                          std::to_string(rows) + " cols=" + std::to_string(cols) +
                                          " m=" + std::to_string(m));
            if (HasFatalFailure()) return;
          }
        }
}

TEST(Matmul, UnalignedPointers) {
  ThreadPool pool(1);
  for (IsaLevel isa : isas())
    for (DType dt : kDtypes)
      for (size_t mis : {1u, 2u, 3u, 6u, 17u}) {
        const int64_t rows = 21, cols = 75, m = 6;
        TestWeights t = make_weights(dt, rows, cols, mis, 7);
        TestWeights aligned = make_weights(dt, rows, cols, 0, 7);
        // x one float off a 64-byte boundary as well.
        auto xs = make_x(m * cols + 1, 1, 3);
        const float* x = xs.data() + 1;
        std::vector<float> y(static_cast<size_t>(m * rows)), y_al(y.size());
        matmul_isa(isa, MatmulPrecision::F32, x, m, t.view, y.data(), &pool);
        matmul_isa(isa, MatmulPrecision::F32, x, m, aligned.view, y_al.data(), &pool);
        std::vector<float> xv(x, x + m * cols);
        expect_close_to_reference(xv, m, t, y, std::string("unaligned ") + dtype_name(dt));
        for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(same_bits(y[i], y_al[i]));
      }
}

TEST(Matmul, IsaPathsGiveIdenticalBits) {
  auto all = isas();
  if (all.size() < 2) GTEST_SKIP() << "only the scalar path runs on this CPU";
  ThreadPool pool(2);
  const int64_t shapes[][3] = {{1, 1, 1},   {5, 16, 1},    {37, 33, 3},  {64, 100, 9},
                               {19, 257, 37}, {131, 1031, 2}, {40, 1024, 16}, {7, 3072, 5}};
  for (DType dt : kDtypes)
    for (auto& s : shapes) {
      const int64_t rows = s[0], cols = s[1], m = s[2];
      TestWeights t = make_weights(dt, rows, cols, 1, static_cast<uint32_t>(rows + cols));
      auto x = make_x(m, cols, 11);
      std::vector<float> ref(static_cast<size_t>(m * rows));
      matmul_isa(IsaLevel::Scalar, MatmulPrecision::F32, x.data(), m, t.view, ref.data(), &pool, 1);
      for (IsaLevel isa : all) {
        std::vector<float> y(ref.size());
        matmul_isa(isa, MatmulPrecision::F32, x.data(), m, t.view, y.data(), &pool, 1);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_TRUE(same_bits(y[i], ref[i]))
              << isa_level_name(isa) << " " << dtype_name(dt) << " rows=" << rows << " cols=" << cols
              << " m=" << m << " at " << i << ": " << y[i] << " vs scalar " << ref[i];
      }
    }
}

// Row i of y must not depend on m, on its neighbours in the batch, on the thread count or
// chunking, nor on whether the m == 1 or m > 1 path ran.
TEST(Matmul, BatchInvariance) {
  ThreadPool p1(1), p2(2), p3(3);
  ThreadPool* pools[] = {&p1, &p2, &p3};
  const int64_t rows = 203, cols = 1037, total = 37;  // cols: 64 full steps + a 13-wide tail
  for (IsaLevel isa : isas())
    for (DType dt : kDtypes) {
      TestWeights t = make_weights(dt, rows, cols, 3, 99);
      auto x = make_x(total, cols, 5);
      // Reference: every x row alone (matrix-vector path), one thread.
      std::vector<float> alone(static_cast<size_t>(total * rows));
      for (int64_t i = 0; i < total; ++i)
        matmul_isa(isa, MatmulPrecision::F32, x.data() + i * cols, 1, t.view, alone.data() + i * rows, &p1);
      // Batches of various sizes and offsets, various pools, chunks forced small so the
      // three-thread pool splits even the m == 1 calls.
      const int64_t batches[][2] = {{0, 37}, {0, 2}, {5, 8}, {3, 16}, {17, 3}, {36, 1}, {1, 13}, {20, 17}};
      for (ThreadPool* pool : pools)
        for (int64_t min_macs : {int64_t{1}, int64_t{20000}, matmul_detail::kMinMacsPerChunk})
          for (auto& b : batches) {
            const int64_t i0 = b[0], m = b[1];
            std::vector<float> y(static_cast<size_t>(m * rows));
            matmul_isa(isa, MatmulPrecision::F32, x.data() + i0 * cols, m, t.view, y.data(), pool, min_macs);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < rows; ++j)
                ASSERT_TRUE(same_bits(y[i * rows + j], alone[(i0 + i) * rows + j]))
                    << isa_level_name(isa) << " " << dtype_name(dt) << " threads=" << pool->size()
                    << " batch=[" << i0 << "," << i0 + m << ") row " << i0 + i << " col " << j;
          }
    }
}

TEST(Matmul, PublicEntryPointUsesGlobalPool) {
  // F32 whatever DSINFER_MATMUL says (the bound below is F32's); restored at the end.
  const MatmulPrecision before = matmul_precision();
  set_matmul_precision(MatmulPrecision::F32);
  TestWeights t = make_weights(DType::BF16, 50, 70, 0, 1);
  auto x = make_x(3, 70, 2);
  std::vector<float> y(150), ref(150);
  matmul(x.data(), 3, t.view, y.data());
  matmul_isa(isa_level(), MatmulPrecision::F32, x.data(), 3, t.view, ref.data(), nullptr);
  set_matmul_precision(before);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(same_bits(y[i], ref[i]));
  expect_close_to_reference(x, 3, t, y, "public");
}

TEST(Matmul, DegenerateShapesAndBadInput) {
  ThreadPool pool(2);
  std::vector<float> y(6, 5.0f);
  float x[3] = {1, 2, 3};
  // cols == 0: empty sums are zero.
  matmul(x, 2, WeightView{x, DType::F32, 3, 0}, y.data(), &pool);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  // m == 0 and rows == 0 do nothing.
  matmul(x, 0, WeightView{x, DType::F32, 3, 1}, nullptr, &pool);
  matmul(x, 1, WeightView{x, DType::F32, 0, 3}, nullptr, &pool);
  EXPECT_THROW(matmul(x, 1, WeightView{x, DType::I32, 1, 3}, y.data(), &pool), Error);
  EXPECT_THROW(matmul(x, 1, WeightView{nullptr, DType::F32, 1, 3}, y.data(), &pool), Error);
}

TEST(Matmul, SpecialValuesPropagate) {
  ThreadPool pool(1);
  for (IsaLevel isa : isas()) {
    const int64_t cols = 40;
    TestWeights t = make_weights(DType::BF16, 2, cols, 0, 4);
    auto x = make_x(1, cols, 8);
    x[3] = INFINITY;  // main part, lane 3
    std::vector<float> y(2);
    matmul_isa(isa, MatmulPrecision::F32, x.data(), 1, t.view, y.data(), &pool);
    EXPECT_TRUE(std::isinf(y[0]) || std::isnan(y[0]));
    x[3] = 1.0f;
    x[37] = NAN;  // tail
    matmul_isa(isa, MatmulPrecision::F32, x.data(), 1, t.view, y.data(), &pool);
    EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]));
  }
}

TEST(WeightRowToF32, AllDtypesExactAndUnaligned) {
  for (DType dt : kDtypes) {
    TestWeights t = make_weights(dt, 5, 37, 1, 21);
    std::vector<float> out(37);
    for (int64_t r = 0; r < 5; ++r) {
      weight_row_to_f32(t.view, r, out.data());
      for (int64_t k = 0; k < 37; ++k) ASSERT_TRUE(same_bits(out[k], t.values[r * 37 + k])) << dtype_name(dt);
    }
    EXPECT_THROW(weight_row_to_f32(t.view, 5, out.data()), Error);
    EXPECT_THROW(weight_row_to_f32(t.view, -1, out.data()), Error);
  }
}

// F16 edge values: subnormals, largest finite, signed zero go through the SIMD converters
// with the same values as the scalar converter.
TEST(Matmul, F16SubnormalsMatchScalar) {
  ThreadPool pool(1);
  const int64_t cols = 48;
  std::vector<uint16_t> w(cols);
  const uint16_t specials[] = {0x0001, 0x03ff, 0x8001, 0x7bff, 0xfbff, 0x8000, 0x0000, 0x0400};
  for (int64_t k = 0; k < cols; ++k) w[k] = specials[k % 8];
  std::vector<float> x(cols, 1.0f);
  WeightView v{w.data(), DType::F16, 1, cols};
  float ref = 0;
  matmul_isa(IsaLevel::Scalar, MatmulPrecision::F32, x.data(), 1, v, &ref, &pool);
  for (IsaLevel isa : isas()) {
    float y = 0;
    matmul_isa(isa, MatmulPrecision::F32, x.data(), 1, v, &y, &pool);
    EXPECT_TRUE(same_bits(y, ref)) << isa_level_name(isa);
  }
}

}  // namespace
}  // namespace dsinfer
