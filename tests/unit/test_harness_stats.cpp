// Harness statistics (src/harness/stats.h): percentiles against hand-computed and analytic
// quantiles, summaries, the seeded RNG, and bootstrap intervals whose coverage is checked on
// a seeded simulation. Behaviour only: no timing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "harness/stats.h"

using namespace dsinfer::harness;

TEST(HarnessStats, PercentileLinearInterpolation) {
  // NumPy: np.percentile([1, 2, 3, 4], [0, 25, 50, 90, 100]) = 1, 1.75, 2.5, 3.7, 4
  const std::vector<double> x = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(x, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(x, 25), 1.75);
  EXPECT_DOUBLE_EQ(percentile(x, 50), 2.5);
  EXPECT_NEAR(percentile(x, 90), 3.7, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(x, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
  EXPECT_THROW(percentile(x, 101), dsinfer::Error);
  EXPECT_THROW(percentile(x, -1), dsinfer::Error);
  EXPECT_THROW(percentile({1, std::numeric_limits<double>::quiet_NaN()}, 50), dsinfer::Error);
}

TEST(HarnessStats, SummaryOfKnownSample) {
  std::vector<double> x;
  for (int i = 1; i <= 101; ++i) x.push_back(i);  // 1..101: Pq = 1 + q exactly
  const Summary s = summarize(x);
  EXPECT_EQ(s.count, 101u);
  EXPECT_DOUBLE_EQ(s.mean, 51.0);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 101.0);
  EXPECT_DOUBLE_EQ(s.p50, 51.0);
  EXPECT_DOUBLE_EQ(s.p90, 91.0);
  EXPECT_DOUBLE_EQ(s.p99, 100.0);
  const Summary e = summarize({});
  EXPECT_EQ(e.count, 0u);
  EXPECT_TRUE(std::isnan(e.p50));
}

TEST(HarnessStats, PercentilesMatchAnalyticQuantiles) {
  // Uniform(0, 1): the q-quantile is q. Standard normal: P90 = 1.2816, P99 = 2.3263.
  Rng rng(42);
  std::vector<double> u, n;
  for (int i = 0; i < 200000; ++i) {
    u.push_back(rng.uniform());
    n.push_back(rng.normal());
  }
  EXPECT_NEAR(percentile(u, 50), 0.50, 0.005);
  EXPECT_NEAR(percentile(u, 90), 0.90, 0.005);
  EXPECT_NEAR(percentile(u, 99), 0.99, 0.002);
  EXPECT_NEAR(percentile(n, 50), 0.0, 0.01);
  EXPECT_NEAR(percentile(n, 90), 1.2816, 0.02);
  EXPECT_NEAR(percentile(n, 99), 2.3263, 0.04);
  EXPECT_NEAR(mean(n), 0.0, 0.01);
}

TEST(HarnessStats, RngIsSeededAndExponentialHasItsMean) {
  Rng a(7), b(7), c(8);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next(), b.next());
  Rng d(7);
  EXPECT_NE(c.next(), d.next());
  Rng e(3);
  double s = 0;
  for (int i = 0; i < 100000; ++i) s += e.exponential(4.0);
  EXPECT_NEAR(s / 100000, 0.25, 0.005);
  Rng f(5);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(f.index(3), 3u);
}

TEST(HarnessStats, BootstrapIsDeterministicAndBracketsTheEstimate) {
  Rng rng(1);
  std::vector<double> x;
  for (int i = 0; i < 200; ++i) x.push_back(rng.normal() + 10);
  const auto med = [](const std::vector<double>& v) { return percentile(v, 50); };
  const Interval a = bootstrap_ci(x, med, 500, 0.95, 99), b = bootstrap_ci(x, med, 500, 0.95, 99);
  EXPECT_EQ(a.low, b.low);
  EXPECT_EQ(a.high, b.high);
  EXPECT_LE(a.low, a.estimate);
  EXPECT_GE(a.high, a.estimate);
  EXPECT_LT(a.high - a.low, 1.0);
  EXPECT_TRUE(std::isnan(bootstrap_ci({}, med).estimate));
  EXPECT_THROW(bootstrap_ci(x, med, 0), dsinfer::Error);
  EXPECT_THROW(bootstrap_ci(x, med, 10, 1.5), dsinfer::Error);
}

TEST(HarnessStats, BootstrapCoverageOnSeededSimulation) {
  // 95% intervals for the mean of Normal(5, 2) samples of 60: over 300 seeded experiments
  // the true mean should fall inside about 95% of them (percentile bootstrap is a little
  // narrow at n = 60; accept 88-99%).
  Rng rng(2024);
  int covered = 0;
  const int experiments = 300;
  for (int e = 0; e < experiments; ++e) {
    std::vector<double> x;
    for (int i = 0; i < 60; ++i) x.push_back(5 + 2 * rng.normal());
    const Interval iv = bootstrap_ci(x, [](const std::vector<double>& v) { return mean(v); }, 400, 0.95, 1000 + e);
    covered += iv.low <= 5.0 && 5.0 <= iv.high;
  }
  const double rate = static_cast<double>(covered) / experiments;
  EXPECT_GE(rate, 0.88);
  EXPECT_LE(rate, 0.99);
}

TEST(HarnessStats, Formatting) {
  EXPECT_EQ(format_seconds(0.0123), "12.3 ms");
  EXPECT_EQ(format_seconds(2.5), "2.50 s");
  EXPECT_EQ(format_seconds(std::numeric_limits<double>::quiet_NaN()), "n/a");
  EXPECT_EQ(format_number(3.14159, 2), "3.14");
}
