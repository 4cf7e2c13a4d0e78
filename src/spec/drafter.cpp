// dsinfer speculation floor: helpers shared by all drafters.
#include "spec/drafter.h"

#include <cmath>

#include "core/error.h"

namespace dsinfer {

std::vector<int> default_target_layer_ids(int num_target_layers, int num_draft_layers) {
  check(num_target_layers >= 1 && num_draft_layers >= 1, "default_target_layer_ids: layer counts must be >= 1");
  if (num_draft_layers == 1) return {num_target_layers / 2};
  std::vector<int> ids;
  for (int i = 0; i < num_draft_layers; ++i) {
    double x = 1.0 + static_cast<double>(i) * (num_target_layers - 4) / (num_draft_layers - 1);
    ids.push_back(static_cast<int>(std::nearbyint(x)));  // default FE mode: half to even
  }
  return ids;
}

}  // namespace dsinfer
