// Tests of the argmax kernel (kernels/cpu/argmax.h): the AVX-512 path returns exactly the
// scalar loop's index (the first maximum under `>`) on random rows of every length around
// the 16-lane steps, on rows full of ties, with ±0, with infinities and with a NaN at any
// place, so switching paths never changes a greedy decision.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/argmax.h"
#include "kernels/cpu/cpu_features.h"

namespace dsinfer {
namespace {

void expect_same(const std::vector<float>& x, const char* what) {
  const int32_t want = argmax_f32_scalar(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(argmax_f32_avx512(x.data(), static_cast<int64_t>(x.size())), want) << what << " n=" << x.size();
  EXPECT_EQ(argmax_f32(x.data(), static_cast<int64_t>(x.size())), want) << what << " (dispatched) n=" << x.size();
}

TEST(KernelsArgmax, Avx512EqualsTheScalarLoop) {
  if (isa_level() < IsaLevel::Avx512) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(-2, 2);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 8191, 8192, 8193}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    expect_same(x, "random");
    for (auto& v : x) v = static_cast<float>(small(rng));  // many ties of the maximum
    expect_same(x, "ties");
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0) ? -0.0f : 0.0f;
    expect_same(x, "signed zeros");
    for (auto& v : x) v = -inf;
    expect_same(x, "all -inf");
    for (auto& v : x) v = nd(rng);
    x[x.size() / 2] = inf;
    x.back() = inf;
    expect_same(x, "+inf twice");
    for (size_t at : {size_t{0}, x.size() / 2, x.size() - 1}) {
      for (auto& v : x) v = nd(rng);
      x[at] = nan;
      expect_same(x, "NaN");
    }
  }
}

TEST(KernelsArgmax, LowestIdWinsTies) {
  std::vector<float> x(8192, 1.0f);
  x[7] = 3.0f;
  x[4000] = 3.0f;
  EXPECT_EQ(argmax_f32_scalar(x.data(), 8192), 7);
  EXPECT_EQ(argmax_f32(x.data(), 8192), 7);
}

}  // namespace
}  // namespace dsinfer
