// dsinfer speculation floor: the DeepSpec drafters (`Qwen3DSparkModel`): DeepSpec DFlash
// (markov_rank 0, no confidence head) and DSpark (Markov head and/or confidence head),
// drafters_spec.md §2.
//
// Data flow of propose: [anchor, MASK × (bs−1)] → the draft's OWN embed_tokens →
// DraftBackbone::forward_block → h [bs, H] (after the final norm) → U = own lm_head(h) for
// the first n positions (through the target's Model::lm_head when the head is the target's
// and the target runs on a device: the GPU GEMM, U copied back) (all bs positions predict: output k is the token at start + k + 1)
// → sequential sampling (§2.6), for k = 0..n−1 with prev = anchor, x_0, x_1, ...:
//     ℓ_k = U_k + B_k(prev, h_k [, rnn state])         (Markov head, if any)
//     q_k = sampling_distribution(ℓ_k, params)          (stored in DraftProposal.q unless greedy)
//     x_k = argmax ℓ_k (greedy) or sample_from(q_k, rng)
//     z_k = confidence_head(h_k [, W1[prev]]),  c_k = sigmoid(z_k)
// With a reduced draft vocabulary (DrafterOptions::draft_vocab_ids, spec/draft_vocab.h), U
// and B are computed for the ranked subset (rows gathered once at load) plus the sequence's
// committed ids outside it (rows gathered as they are committed); ℓ_k, q_k and the argmax
// run over those, and x_k is mapped back to its real id; q_k (full vocabulary wide) is zero
// outside them.
#pragma once
#include <memory>

#include "spec/confidence_head.h"
#include "spec/dflash_backbone.h"
#include "spec/drafter_loader.h"
#include "spec/markov_head.h"

namespace dsinfer {

class DeepSpecDrafter final : public BlockDrafter {
 public:
  // The draft's embed_tokens / lm_head are the target's own matrices when the checkpoint's
  // copies are bit-identical to them (they are frozen copies in DeepSpec training).
  DeepSpecDrafter(const DraftConfig& cfg, const Model& target, const DrafterOptions& opts);
  ~DeepSpecDrafter() override;

  const MarkovHead* markov_head() const { return markov_.get(); }
  const ConfidenceHead* confidence_head() const { return conf_.get(); }

 protected:
  DraftProposal run(DraftContext& seq, int32_t anchor, int n, const SamplingParams& params, Rng& rng,
                    DraftDebug* dbg) const override;
  // One backbone pass over every item's block, one LM-head matmul over all drafted rows,
  // and per draft position one Markov W2 matmul over the items still drafting.
  std::vector<DraftProposal> run_batch(const std::vector<RunItem>& items) const override;
  // A reduced draft vocabulary grows the sequence's extras with the committed ids.
  void note_committed(DraftContext& seq, const int32_t* tokens, int c) const override;

 private:
  // dbg (only with one item) records every intermediate for debug-dflash.
  std::vector<DraftProposal> run_items(const std::vector<RunItem>& items, DraftDebug* dbg) const;

  // The target's view of `name` when the draft's [V, H] tensor is a byte-identical copy in
  // the dtype the drafter would keep it in; else the drafter's own view.
  WeightView shared_or_own(const std::string& name, const WeightView* target_view, int H,
                           const std::string& weight_dtype);

  int V_ = 0;
  WeightView embed_{}, lm_head_{};
  // The rows the drafter drafts from: lm_head_ itself, or the rows of the ranked subset
  // vocab_ (ascending), copied into head_rows_; each sequence adds its extras
  // (DraftContext::vocab_extras).
  WeightView draft_head_{};
  DraftVocab vocab_;
  std::vector<uint8_t> head_rows_;
  // The target, when the LM head is shared with it and it runs on a device (Model::on_device):
  // the draft rows' base logits come from its lm_head() there instead of a host matmul.
  const Model* device_head_ = nullptr;
  std::unique_ptr<MarkovHead> markov_;
  std::unique_ptr<ConfidenceHead> conf_;
};

}  // namespace dsinfer
