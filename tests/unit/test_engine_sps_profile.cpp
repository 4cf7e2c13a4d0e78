// Tests of the SPS(B) profiler's fitting (engine/sps_profile.h):
// - monotone_nondecreasing is the least-squares isotonic fit (checked against a brute force
//   over a fine grid on small cases, and its defining properties on random ones);
// - profile_sps on the embedded target + DSpark drafter returns a curve whose step time
//   never falls as B grows, whatever the machine's load did to single repetitions;
// - DraftCostTable interpolates between measured batch sizes, extrapolates past the last
//   with its per-request slope, refuses malformed points; profile_draft_cost measures a
//   t_draft(k) that never falls as k grows, on the batch sizes draft_cost_batches picks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "engine/sps_profile.h"
#include "model/model.h"
#include "model/weights.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"

namespace dsinfer {
namespace {

double sq_err(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * (a[i] - b[i]);
  return e;
}

TEST(SpsProfile, IsotonicFitKeepsMonotoneInput) {
  const std::vector<double> y = {1.0, 1.0, 2.5, 3.0, 7.0};
  EXPECT_EQ(monotone_nondecreasing(y), y);
  EXPECT_TRUE(monotone_nondecreasing({}).empty());
}

TEST(SpsProfile, IsotonicFitPoolsViolators) {
  // 3, 1 pool to 2, 2; then 2, 2, 0.5 ... pool to the mean of the block.
  const std::vector<double> fit = monotone_nondecreasing({3.0, 1.0, 5.0});
  ASSERT_EQ(fit.size(), 3u);
  EXPECT_DOUBLE_EQ(fit[0], 2.0);
  EXPECT_DOUBLE_EQ(fit[1], 2.0);
  EXPECT_DOUBLE_EQ(fit[2], 5.0);
  const std::vector<double> fit2 = monotone_nondecreasing({4.0, 3.0, 2.0});
  for (double v : fit2) EXPECT_DOUBLE_EQ(v, 3.0);
}

TEST(SpsProfile, IsotonicFitIsTheLeastSquaresMonotoneSequence) {
  // Brute force over monotone sequences on a 0.25 grid (values 0..4, length 4): the PAVA
  // fit must be monotone and no grid sequence may be closer to y.
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> q(0, 16);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<double> y(4);
    for (double& v : y) v = q(rng) * 0.25;
    const std::vector<double> fit = monotone_nondecreasing(y);
    ASSERT_EQ(fit.size(), y.size());
    for (size_t i = 1; i < fit.size(); ++i) EXPECT_LE(fit[i - 1], fit[i] + 1e-12);
    double best = 1e300;
    for (int a = 0; a <= 16; ++a)
      for (int b = a; b <= 16; ++b)
        for (int c = b; c <= 16; ++c)
          for (int d = c; d <= 16; ++d)
            best = std::min(best, sq_err(y, {a * 0.25, b * 0.25, c * 0.25, d * 0.25}));
    EXPECT_LE(sq_err(y, fit), best + 1e-12) << "trial " << trial;
  }
}

TEST(SpsProfile, ProfiledStepTimeNeverFallsWithB) {
  const std::string root = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";
  if (!std::filesystem::exists(root + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped drafter";
  auto target = load_model(root + "/target");
  auto drafter = load_drafter(root + "/dspark", *target);
  SpsProfileOptions opts;
  opts.max_batch_tokens = 9;
  opts.context = 96;
  opts.repeats = 2;
  double draft_ms = -1;
  const SpsTable t = profile_sps(*target, drafter.get(), opts, &draft_ms);
  EXPECT_GT(draft_ms, 0.0);
  ASSERT_EQ(t.points().size(), 9u);
  for (size_t i = 0; i < t.points().size(); ++i) {
    EXPECT_EQ(t.points()[i].batch_tokens, static_cast<int>(i) + 1);
    EXPECT_TRUE(std::isfinite(t.points()[i].sps) && t.points()[i].sps > 0);
    if (i) EXPECT_LE(t.points()[i].sps, t.points()[i - 1].sps * (1 + 1e-12));
  }
}

// The cached profile is keyed by the build that measured it: a rebuilt (faster or slower)
// binary must not reuse an older build's verify and drafter costs.
TEST(SpsProfile, MachineStringNamesTheRunningBuild) {
  const std::string id = sps_build_identity();
  EXPECT_EQ(id.rfind("build ", 0), 0u) << id;
  EXPECT_NE(id, "build unknown");  // Linux: /proc/self/exe
  EXPECT_EQ(sps_build_identity(), id);  // stable within a process
  const std::string machine = sps_machine_string(1, SpsProfileOptions{});
  EXPECT_NE(machine.find(id), std::string::npos) << machine;
  // This test binary's size is part of it.
  const auto bytes = std::filesystem::file_size(std::filesystem::read_symlink("/proc/self/exe"));
  EXPECT_NE(id.find(" " + std::to_string(bytes) + "-"), std::string::npos) << id;
}

TEST(DraftCost, InterpolatesAndExtrapolatesWithTheLastSlope) {
  const DraftCostTable t({{1, 0.5}, {2, 0.8}, {4, 1.2}});
  EXPECT_DOUBLE_EQ(t.ms(0), 0.0);
  EXPECT_DOUBLE_EQ(t.ms(1), 0.5);
  EXPECT_DOUBLE_EQ(t.ms(2), 0.8);
  EXPECT_DOUBLE_EQ(t.ms(3), 1.0);   // between 2 and 4
  EXPECT_DOUBLE_EQ(t.ms(4), 1.2);
  EXPECT_DOUBLE_EQ(t.ms(10), 2.4);  // 1.2 + 6 x 0.2 (the last segment's per-request slope)
  const DraftCostTable one({{1, 0.7}});
  EXPECT_DOUBLE_EQ(one.ms(3), 2.1);  // a single point: proportional
  const DraftCostTable from4({{4, 2.0}, {8, 3.0}});
  EXPECT_DOUBLE_EQ(from4.ms(2), 1.0);  // below the first point: proportional to it
  EXPECT_TRUE(DraftCostTable().empty());
  EXPECT_DOUBLE_EQ(DraftCostTable().ms(5), 0.0);
}

TEST(DraftCost, CommitCostIsPerRowAndValidated) {
  DraftCostTable t({{1, 1.0}});
  EXPECT_EQ(t.commit_ms(500), 0.0);  // not measured: free
  t.set_commit_ms_per_row(0.004);
  EXPECT_DOUBLE_EQ(t.commit_ms(250), 1.0);
  EXPECT_EQ(t.commit_ms(0), 0.0);
  EXPECT_EQ(t.commit_ms(-3), 0.0);
  EXPECT_THROW(t.set_commit_ms_per_row(-1.0), Error);
  EXPECT_THROW(t.set_commit_ms_per_row(std::nan("")), Error);
}

TEST(DraftCost, MalformedPointsAreErrors) {
  EXPECT_THROW(DraftCostTable({{0, 1.0}}), Error);
  EXPECT_THROW(DraftCostTable({{1, 0.0}}), Error);
  EXPECT_THROW(DraftCostTable({{2, 1.0}, {2, 1.5}}), Error);
  EXPECT_THROW(DraftCostTable({{4, 1.0}, {2, 1.5}}), Error);
}

TEST(DraftCost, BatchSizesArePowersOfTwoUpToTheEngineSize) {
  EXPECT_EQ(draft_cost_batches(1), (std::vector<int>{1}));
  EXPECT_EQ(draft_cost_batches(4), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(draft_cost_batches(12), (std::vector<int>{1, 2, 4, 8, 12}));
  EXPECT_EQ(draft_cost_batches(500), (std::vector<int>{1, 2, 4, 8, 16, 32, 64}));
}

TEST(DraftCost, ProfiledPassTimeNeverFallsWithK) {
  const std::string root = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";
  if (!std::filesystem::exists(root + "/dspark/model.safetensors")) GTEST_SKIP() << "no shipped drafter";
  auto target = load_model(root + "/target");
  auto drafter = load_drafter(root + "/dspark", *target);
  const DraftCostTable t = profile_draft_cost(*target, *drafter, {1, 2, 4}, 64, 2);
  ASSERT_EQ(t.points().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(t.points()[i].first, 1 << i);
    EXPECT_TRUE(std::isfinite(t.points()[i].second) && t.points()[i].second > 0);
    if (i) EXPECT_GE(t.points()[i].second, t.points()[i - 1].second);
  }
  // The context commit is timed too: a positive time per row, in the start-up summary.
  EXPECT_TRUE(std::isfinite(t.commit_ms_per_row()) && t.commit_ms_per_row() > 0);
  EXPECT_DOUBLE_EQ(t.commit_ms(100), 100 * t.commit_ms_per_row());
  EXPECT_NE(draft_cost_summary(t).find("context commit"), std::string::npos);
  EXPECT_THROW(profile_draft_cost(*target, *drafter, {2, 1}), Error);
  EXPECT_THROW(profile_draft_cost(*target, *drafter, {}), Error);
}

}  // namespace
}  // namespace dsinfer
