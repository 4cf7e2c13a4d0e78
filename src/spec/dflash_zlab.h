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
// which must outlive it. With a reduced draft vocabulary (spec/draft_vocab.h) the head is
// a copy of the target's host LM-head rows for the ranked subset plus the sequence's
// committed ids, and drafts map back to real ids.
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
  void note_committed(DraftContext& seq, const int32_t* tokens, int c) const override;

 private:
  const Model& target_;
  int V_ = 0;
  // Reduced draft vocabulary: the ranked subset and its gathered LM-head rows (the
  // sequence's extras live in DraftContext::vocab_extras); empty = the whole vocabulary.
  DraftVocab vocab_;
  std::vector<uint8_t> head_rows_;
  WeightView draft_head_{}, full_head_{};
};

}  // namespace dsinfer
