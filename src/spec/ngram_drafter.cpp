// dsinfer speculation floor: n-gram / prompt-lookup drafter (see ngram_drafter.h).
#include "spec/ngram_drafter.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"

namespace dsinfer {

namespace {
class NgramSequence : public DraftSequence {
 public:
  int context_length() const override { return static_cast<int>(history.size()); }
  std::vector<int32_t> history;  // committed tokens
  std::vector<int32_t> scratch;  // history + anchor + drafts during propose
};
}  // namespace

NgramDrafter::NgramDrafter(const NgramOptions& opts) : opts_(opts) {
  if (opts.min_ngram < 1) throw Error("ngram: min n-gram length must be >= 1, got " + std::to_string(opts.min_ngram));
  if (opts.max_ngram < opts.min_ngram)
    throw Error("ngram: max n-gram length (" + std::to_string(opts.max_ngram) + ") must be >= min n-gram length (" +
                std::to_string(opts.min_ngram) + ")");
  if (opts.max_draft_tokens < 1)
    throw Error("ngram: max draft tokens must be >= 1, got " + std::to_string(opts.max_draft_tokens));
  info_.kind = "ngram";
  info_.block_size = 0;
  info_.max_draft_tokens = opts.max_draft_tokens;
}

std::unique_ptr<DraftSequence> NgramDrafter::start() const { return std::make_unique<NgramSequence>(); }

void NgramDrafter::commit_context(DraftSequence& seq, const int32_t* tokens, const float* /*hidden*/, int c) const {
  auto& s = dynamic_cast<NgramSequence&>(seq);
  if (c < 0) throw Error("ngram: commit_context with a negative count");
  s.history.insert(s.history.end(), tokens, tokens + c);
}

DraftProposal NgramDrafter::propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& /*params*/,
                                    Rng& /*rng*/) const {
  auto& s = dynamic_cast<NgramSequence&>(seq);
  DraftProposal prop;
  const int budget = std::min(max_tokens, opts_.max_draft_tokens);
  if (budget <= 0) return prop;
  std::vector<int32_t>& h = s.scratch;
  h = s.history;
  h.push_back(anchor);
  const int L = static_cast<int>(h.size());
  for (int n = std::min(opts_.max_ngram, L - 1); n >= opts_.min_ngram; --n) {
    const int32_t* suffix = h.data() + (L - n);
    // Most recent earlier occurrence: start positions from L-n-1 down to 0 (the match must
    // end before the suffix's own last token so at least one token follows it).
    for (int st = L - n - 1; st >= 0; --st) {
      if (!std::equal(suffix, suffix + n, h.data() + st)) continue;
      // Copy what followed; past the end of the history keep copying from the drafts.
      for (int k = 0; k < budget; ++k) {
        int32_t t = h[static_cast<size_t>(st + n + k)];
        prop.tokens.push_back(t);
        h.push_back(t);
      }
      return prop;
    }
  }
  return prop;
}

}  // namespace dsinfer
