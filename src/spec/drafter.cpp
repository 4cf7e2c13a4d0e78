// dsinfer speculation floor: helpers shared by all drafters.
#include "spec/drafter.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsinfer {

void keep_first_drafts(DraftProposal& p, size_t n) {
  const size_t n0 = p.tokens.size();
  if (n >= n0) return;
  if (!p.q.empty()) p.q.resize(n * (p.q.size() / n0));  // q rows are [vocab] each
  p.tokens.resize(n);
  p.confidence.resize(std::min(p.confidence.size(), n));
  p.confidence_logits.resize(std::min(p.confidence_logits.size(), n));
}

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
