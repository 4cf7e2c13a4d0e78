// Tests of spec/drafter helpers: the default target-layer formula against the examples
// given in drafters_spec.md §1.3 (Python round-half-to-even included).
#include <gtest/gtest.h>

#include "spec/drafter.h"

TEST(SpecDrafter, DefaultTargetLayerIds) {
  using dsinfer::default_target_layer_ids;
  EXPECT_EQ(default_target_layer_ids(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(default_target_layer_ids(40, 5), (std::vector<int>{1, 10, 19, 28, 37}));
  EXPECT_EQ(default_target_layer_ids(64, 10), (std::vector<int>{1, 8, 14, 21, 28, 34, 41, 48, 54, 61}));
  EXPECT_EQ(default_target_layer_ids(28, 1), (std::vector<int>{14}));
  // 1 + 1 * (10 - 4) / 4 = 2.5 rounds to 2 (half to even), 1 + 3 * 6 / 4 = 5.5 rounds to 6.
  EXPECT_EQ(default_target_layer_ids(10, 5), (std::vector<int>{1, 2, 4, 6, 7}));
}
