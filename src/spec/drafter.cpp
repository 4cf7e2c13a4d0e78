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

namespace {
void check_distinct(const std::vector<DraftSequence*>& seqs, const char* what) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!seqs[i]) throw Error(std::string(what) + ": item " + std::to_string(i) + " has no sequence");
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i]) throw Error(std::string(what) + ": items " + std::to_string(j) + " and " + std::to_string(i) + " name the same sequence");
  }
}
}  // namespace

void check_batch_items(const std::vector<DraftBatchItem>& items) {
  std::vector<DraftSequence*> seqs;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].params || !items[i].rng)
      throw Error("propose_batch: item " + std::to_string(i) + " has no sampling params or rng");
    seqs.push_back(items[i].seq);
  }
  check_distinct(seqs, "propose_batch");
}

void check_batch_items(const std::vector<ContextBatchItem>& items, bool cache_features) {
  std::vector<DraftSequence*> seqs;
  for (size_t i = 0; i < items.size(); ++i) {
    const ContextBatchItem& it = items[i];
    if (it.feature_cache && !cache_features)
      throw Error("commit_context_batch: item " + std::to_string(i) +
                  " names KV-cache feature rows; this drafter reads captured rows from the host only");
    if (it.feature_cache && !it.feature_blocks && it.count > 0)
      throw Error("commit_context_batch: item " + std::to_string(i) + " names KV-cache feature rows without a block table");
    seqs.push_back(it.seq);
  }
  check_distinct(seqs, "commit_context_batch");
}

std::vector<DraftProposal> Drafter::propose_batch(const std::vector<DraftBatchItem>& items) const {
  check_batch_items(items);
  std::vector<DraftProposal> out;
  out.reserve(items.size());
  for (const DraftBatchItem& it : items) out.push_back(propose(*it.seq, it.anchor, it.max_tokens, *it.params, *it.rng));
  return out;
}

void Drafter::commit_context_batch(const std::vector<ContextBatchItem>& items) const {
  check_batch_items(items);
  for (const ContextBatchItem& it : items) commit_context(*it.seq, it.tokens, it.hidden, it.count);
}

void Drafter::set_window(DraftSequence&, int) const {
  throw Error("drafter window: the '" + info().kind + "' drafter has no context window to set");
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
