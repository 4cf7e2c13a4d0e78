// Tests of the SwiGLU gate kernel (kernels/cpu/silu_mul.h): the AVX2 path against the scalar
// libm reference (a few ulp: the polynomial exp), the extremes (large |g|: no inf/NaN), and
// position independence (an element's bits do not depend on n or on where the tail starts),
// which batch invariance needs: rows of a batch are one long array here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/silu_mul.h"

namespace dsinfer {
namespace {

TEST(KernelsSiluMul, Avx2MatchesScalarWithinAFewUlp) {
  if (isa_level() < IsaLevel::Avx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const int n = 1003;
  std::vector<float> g(n), u(n), a(n), b(n);
  for (int i = 0; i < n; ++i) g[i] = nd(rng), u[i] = nd(rng);
  g[0] = 0.0f, g[1] = -100.0f, g[2] = 100.0f, g[3] = -87.5f, g[4] = 88.5f, g[5] = -1e-30f;
  silu_mul_scalar(g.data(), u.data(), a.data(), n);
  silu_mul_avx2(g.data(), u.data(), b.data(), n);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(b[i])) << i << " g=" << g[i];
    EXPECT_NEAR(b[i], a[i], 4e-7f * std::fabs(a[i]) + 1e-30f) << i << " g=" << g[i];
  }
}

TEST(KernelsSiluMul, ElementBitsDoNotDependOnLengthOrOffset) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int n = 77;
  std::vector<float> g(n), u(n), whole(n);
  for (int i = 0; i < n; ++i) g[i] = nd(rng), u[i] = nd(rng);
  silu_mul(g.data(), u.data(), whole.data(), n);
  for (int start : {0, 1, 5, 8, 13})
    for (int len : {1, 3, 8, 9, 30}) {
      if (start + len > n) continue;
      std::vector<float> part(len);
      silu_mul(g.data() + start, u.data() + start, part.data(), len);
      EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + start, sizeof(float) * len)) << start << "+" << len;
    }
  // In place (out aliases gate), as the model calls it.
  std::vector<float> inplace = g;
  silu_mul(inplace.data(), u.data(), inplace.data(), n);
  EXPECT_EQ(0, std::memcmp(inplace.data(), whole.data(), sizeof(float) * n));
}

}  // namespace
}  // namespace dsinfer
