// dsinfer speculation floor: the n-gram / prompt-lookup drafter (no weights).
//
// Data flow: commit_context appends the committed token ids of a sequence (prompt, then
// each round's anchor + accepted drafts) to the sequence's history; it needs no target
// hidden states (target_layer_ids is empty). propose looks at history + anchor, takes its
// last n tokens for n = max_ngram down to min_ngram, finds the most recent earlier place
// where those n tokens occur, and proposes the tokens that followed that occurrence. When
// the proposal runs past the end of the history, it keeps copying from its own drafts, so
// a repeating pattern of period k continues for the full budget. Drafts are point masses
// (q empty): verification accepts d with probability p(d) and stays lossless. Fully
// deterministic: no random numbers are used.
#pragma once
#include <memory>

#include "spec/drafter.h"

namespace dsinfer {

struct NgramOptions {
  int max_ngram = 3;         // longest suffix tried first
  int min_ngram = 1;         // shortest suffix still used for lookup, >= 1
  int max_draft_tokens = 8;  // drafts per round at most
};

class NgramDrafter : public Drafter {
 public:
  // Throws Error naming the option when 1 <= min_ngram <= max_ngram and max_draft_tokens
  // >= 1 do not hold.
  explicit NgramDrafter(const NgramOptions& opts = {});
  const DrafterInfo& info() const override { return info_; }
  const NgramOptions& options() const { return opts_; }

  std::unique_ptr<DraftSequence> start() const override;
  void commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const override;
  DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                        Rng& rng) const override;

 private:
  NgramOptions opts_;
  DrafterInfo info_;
};

}  // namespace dsinfer
