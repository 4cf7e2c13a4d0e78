// dsinfer speculation floor: the z-lab DFlash drafter (`DFlashDraftModel`,
// drafters_spec.md §1).
//
// Data flow of propose: [anchor, MASK × (bs−1)] → the TARGET's embedding table
// (Model::embed) → DraftBackbone::forward_block over the committed draft context → the
// draft's own final norm → the TARGET's LM head matrix (Model::lm_head, apply_norm=false)
// on block positions 1..bs−1 only (position j predicts the token at start + j, no shift;
// the anchor's output is discarded) → one draft per position, independently: argmax when
// greedy, else drawn from sampling_distribution(logits, params), whose rows become q.
// The checkpoint holds no embedding/LM head; the drafter keeps a reference to the target,
// which must outlive it.
#pragma once
#include "spec/dflash_backbone.h"
#include "spec/drafter_loader.h"

namespace dsinfer {

class ZlabDFlashDrafter final : public BlockDrafter {
 public:
  ZlabDFlashDrafter(const DraftConfig& cfg, const Model& target, const DrafterOptions& opts);

 protected:
  DraftProposal run(DraftContext& seq, int32_t anchor, int n, const SamplingParams& params, Rng& rng,
                    DraftDebug* dbg) const override;

 private:
  const Model& target_;
  int V_ = 0;
};

}  // namespace dsinfer
