// dsinfer tests: matmul's Bf16Dot precision on AMX tiles (matmul_amx.cpp). Skipped where
// the CPU or OS does not offer AMX-BF16 (CI machines may or may not).
//
// Checks:
//  - the kernel bit for bit against a scalar statement of the hardware's order (per
//    32-element chunk: even products and odd products each chained by fmas from +0, then
//    acc + (even + odd)), over shapes around the panel (16 features), the group of 4
//    panels, the 16-row x group and thread splits;
//  - batch invariance: row i alone equals row i in any batch, with any thread split;
//  - closeness to a double-precision reference (x rounded to BF16);
//  - the packing rules: amx_wants() only for BF16, K % 32 == 0, Bf16Dot; a matrix without
//    its AMX layout takes the vdpbf16ps kernel for every m (bits equal to Avx512Bf16);
//  - DSINFER_AMX=0 turns it off, other values than 0/1 are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_internal.h"

namespace dsinfer {
namespace {

using matmul_detail::Path;
constexpr MatmulPrecision kBf16 = MatmulPrecision::Bf16Dot;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

struct PrecisionScope {
  MatmulPrecision saved = matmul_precision();
  explicit PrecisionScope(MatmulPrecision p) { set_matmul_precision(p); }
  ~PrecisionScope() { set_matmul_precision(saved); }
};

// A BF16 matrix with its AMX layout, at a byte offset of 2 (the mmap gives no alignment).
struct AmxWeights {
  std::vector<unsigned char> storage;
  std::vector<uint16_t> packed_storage;
  WeightView view;
  AmxWeights(int64_t rows, int64_t cols, std::mt19937& rng, float scale = 0.5f) {
    storage.resize(static_cast<size_t>(rows * cols) * 2 + 2);
    std::normal_distribution<float> nd(0.0f, scale);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint16_t h = f32_to_bf16(nd(rng));
      std::memcpy(storage.data() + 2 + 2 * i, &h, 2);
    }
    view = WeightView{storage.data() + 2, DType::BF16, rows, cols};
    const int64_t n = amx_pack_elems(view);
    packed_storage.resize(static_cast<size_t>(n) + 32);
    uint16_t* p = packed_storage.data() + (64 - reinterpret_cast<uintptr_t>(packed_storage.data()) % 64) % 64 / 2;
    amx_pack(view, p);
    view.amx_panels = p;
  }
  float w(int64_t row, int64_t k) const {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(view.data) + (row * view.cols + k) * 2, 2);
    return matmul_detail::flush_subnormal(bf16_to_f32(h));
  }
};

// The hardware's order, in scalar code: y[i][j] for x already rounded to BF16.
float amx_reference(const std::vector<float>& xb_row, const AmxWeights& W, int64_t j) {
  using matmul_detail::bf16_dot_step;
  using matmul_detail::flush_subnormal;
  float acc = 0.0f;
  for (int64_t c = 0; c < W.view.cols; c += 32) {
    float even = 0.0f, odd = 0.0f;
    for (int k2 = 0; k2 < 16; ++k2) {
      even = bf16_dot_step(even, xb_row[c + 2 * k2], W.w(j, c + 2 * k2));
      odd = bf16_dot_step(odd, xb_row[c + 2 * k2 + 1], W.w(j, c + 2 * k2 + 1));
    }
    acc = flush_subnormal(acc + flush_subnormal(even + odd));
  }
  return acc;
}

std::vector<float> random_x(int64_t m, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (auto& v : x) v = nd(rng);
  return x;
}

std::vector<float> rounded_row(const std::vector<float>& x, int64_t i, int64_t cols) {
  std::vector<float> r(static_cast<size_t>(cols));
  for (int64_t k = 0; k < cols; ++k) r[k] = bf16_to_f32(matmul_detail::x_to_bf16(x[i * cols + k]));
  return r;
}

class MatmulAmx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!matmul_detail::amx_usable()) GTEST_SKIP() << "no AMX-BF16 here (CPU, OS or DSINFER_AMX=0)";
  }
};

TEST_F(MatmulAmx, BitIdenticalToTheHardwareOrderStatedInScalarCode) {
  std::mt19937 rng(7);
  ThreadPool pool1(1), pool2(2);
  for (int64_t rows : {1, 15, 16, 17, 48, 64, 65, 100, 200})
    for (int64_t cols : {32, 64, 320})
      for (int64_t m : {1, 2, 9, 16, 17, 40}) {
        AmxWeights W(rows, cols, rng);
        const auto x = random_x(m, cols, rng);
        for (ThreadPool* pool : {&pool1, &pool2}) {
          std::vector<float> y(static_cast<size_t>(m * rows), -1.0f);
          matmul_detail::matmul_path(Path::Amx, kBf16, x.data(), m, W.view, y.data(), pool, pool == &pool1 ? matmul_detail::kMinMacsPerChunk : 1);
          for (int64_t i = 0; i < m; ++i) {
            const auto xr = rounded_row(x, i, cols);
            for (int64_t j = 0; j < rows; ++j)
              ASSERT_TRUE(same_bits(y[i * rows + j], amx_reference(xr, W, j)))
                  << "rows " << rows << " cols " << cols << " m " << m << " i " << i << " j " << j << ": "
                  << y[i * rows + j] << " vs " << amx_reference(xr, W, j);
          }
        }
      }
}

TEST_F(MatmulAmx, RowAloneEqualsRowInAnyBatchAndThreadSplit) {
  std::mt19937 rng(11);
  ThreadPool pool1(1), pool2(2), pool3(3);
  const int64_t rows = 1000, cols = 320, total = 70;
  AmxWeights W(rows, cols, rng);
  const auto x = random_x(total, cols, rng);
  std::vector<float> alone(static_cast<size_t>(total * rows));
  for (int64_t i = 0; i < total; ++i)
    matmul_detail::matmul_path(Path::Amx, kBf16, x.data() + i * cols, 1, W.view, alone.data() + i * rows, &pool1);
  for (int64_t m : {2, 9, 16, 17, 33, 70})
    for (int64_t i0 : {int64_t{0}, total - m})
      for (ThreadPool* pool : {&pool1, &pool2, &pool3})
        for (int64_t min_macs : {matmul_detail::kMinMacsPerChunk, int64_t{1}}) {
          std::vector<float> y(static_cast<size_t>(m * rows));
          matmul_detail::matmul_path(Path::Amx, kBf16, x.data() + i0 * cols, m, W.view, y.data(), pool, min_macs);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < rows; ++j)
              ASSERT_TRUE(same_bits(y[i * rows + j], alone[(i0 + i) * rows + j]))
                  << "m " << m << " i0 " << i0 << " i " << i << " j " << j;
        }
}

TEST_F(MatmulAmx, CloseToDoublePrecision) {
  std::mt19937 rng(3);
  const int64_t rows = 96, cols = 1024, m = 5;
  AmxWeights W(rows, cols, rng, 0.05f);
  const auto x = random_x(m, cols, rng);
  ThreadPool pool(1);
  std::vector<float> y(static_cast<size_t>(m * rows));
  matmul_detail::matmul_path(Path::Amx, kBf16, x.data(), m, W.view, y.data(), &pool);
  for (int64_t i = 0; i < m; ++i) {
    const auto xr = rounded_row(x, i, cols);
    for (int64_t j = 0; j < rows; ++j) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < cols; ++k) {
        ref += static_cast<double>(xr[k]) * W.w(j, k);
        mag += std::fabs(static_cast<double>(xr[k]) * W.w(j, k));
      }
      EXPECT_NEAR(y[i * rows + j], ref, 1e-5 * mag + 1e-6) << i << "," << j;
    }
  }
}

TEST_F(MatmulAmx, WithoutItsLayoutAMatrixTakesTheVdpbf16psKernelForEveryM) {
  std::mt19937 rng(5);
  AmxWeights W(48, 320, rng);
  WeightView plain = W.view;
  plain.amx_panels = nullptr;
  ThreadPool pool(1);
  for (int64_t m : {1, 9}) {
    const auto x = random_x(m, 320, rng);
    std::vector<float> a(static_cast<size_t>(m * 48)), b(a.size());
    matmul_detail::matmul_path(Path::Amx, kBf16, x.data(), m, plain, a.data(), &pool);
    matmul_detail::matmul_path(Path::Avx512Bf16, kBf16, x.data(), m, plain, b.data(), &pool);
    for (size_t k = 0; k < a.size(); ++k) ASSERT_TRUE(same_bits(a[k], b[k])) << k;
  }
}

TEST_F(MatmulAmx, PackedOnlyForBf16WithKAMultipleOf32InBf16DotPrecision) {
  uint16_t dummy[64] = {};
  PrecisionScope bf16(kBf16);
  EXPECT_TRUE(amx_wants(WeightView{dummy, DType::BF16, 2, 32}));
  EXPECT_FALSE(amx_wants(WeightView{dummy, DType::BF16, 2, 33}));
  EXPECT_FALSE(amx_wants(WeightView{dummy, DType::F32, 2, 32}));
  EXPECT_FALSE(amx_wants(WeightView{dummy, DType::BF16, 0, 32}));
  set_matmul_precision(MatmulPrecision::F32);
  EXPECT_FALSE(amx_wants(WeightView{dummy, DType::BF16, 2, 32}));
}

// DSINFER_AMX is read once per process; death tests run in a fresh one. Runs on every CPU:
// the variable is checked before the hardware.
TEST(MatmulAmxDeathTest, EnvironmentTurnsItOffAndRejectsOtherValues) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("DSINFER_AMX", "0", 1);
        std::exit(!matmul_detail::amx_usable() && matmul_detail::hardware_path() != Path::Amx ? 3 : 4);
      },
      testing::ExitedWithCode(3), "");
  EXPECT_EXIT(
      {
        setenv("DSINFER_AMX", "yes", 1);
        try {
          matmul_detail::amx_usable();
        } catch (const Error& e) {
          std::exit(std::string(e.what()).find("DSINFER_AMX must be 0 or 1, not 'yes'") != std::string::npos ? 3 : 5);
        }
        std::exit(4);
      },
      testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace dsinfer
