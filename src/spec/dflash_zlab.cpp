// dsinfer speculation floor: z-lab DFlash drafter (see dflash_zlab.h for the data flow).
// Tensor names are as published (top level), with an optional "model." prefix tolerated.
#include "spec/dflash_zlab.h"

#include <algorithm>

#include "core/error.h"
#include "model/model.h"
#include "model/weights.h"
#include "spec/draft_vocab.h"

namespace dsinfer {

ZlabDFlashDrafter::ZlabDFlashDrafter(const DraftConfig& cfg, const Model& target, const DrafterOptions& opts)
    : target_(target), V_(target.config().vocab_size) {
  store_ = std::make_unique<WeightStore>(cfg.base.model_dir, opts.weight_dtype);
  const std::string prefix = (!store_->has("fc.weight") && store_->has("model.fc.weight")) ? "model." : "";
  backbone_ = std::make_unique<DraftBackbone>(cfg.base, static_cast<int>(cfg.target_layer_ids.size()), cfg.block_size,
                                              opts.window_size, *store_, prefix);
  if (!opts.draft_vocab_ids.empty()) {
    const WeightView* head = target.host_lm_head();
    if (!head) throw Error("--draft-vocab: the z-lab drafter borrows the target's LM head, which is not on the host here");
    vocab_ = DraftVocab(opts.draft_vocab_ids, V_);
    full_head_ = *head;
    draft_head_ = gather_rows(*head, vocab_.ids(), head_rows_);
    info_.draft_vocab = vocab_.size();
  }
  info_.kind = "dflash";
  info_.block_size = cfg.block_size;
  info_.max_draft_tokens = cfg.block_size - 1;
  info_.target_layer_ids = cfg.target_layer_ids;
  info_.mask_token_id = cfg.mask_token_id;
}

DraftProposal ZlabDFlashDrafter::run(DraftContext& seq, int32_t anchor, int n, const SamplingParams& params, Rng& rng,
                                     DraftDebug* dbg) const {
  if (anchor < 0 || anchor >= V_)
    throw Error("dflash propose: anchor token " + std::to_string(anchor) + " outside the vocabulary [0, " + std::to_string(V_) + ")");
  const int bs = info_.block_size, H = backbone_->hidden();
  std::vector<int32_t> ids(bs, info_.mask_token_id);
  ids[0] = anchor;
  std::vector<float> emb(static_cast<size_t>(bs) * H), out(static_cast<size_t>(bs) * H);
  target_.embed(ids.data(), bs, emb.data());
  backbone_->forward_block(seq, emb.data(), out.data());
  // Block index j (1..n) predicts the token at start + j: only those rows need logits.
  // The whole vocabulary, or the ranked subset plus this sequence's extras (index c is the
  // token vocab_.token(c, extras)).
  const bool reduced = !vocab_.empty();
  const DraftVocabExtras& x = seq.vocab_extras;
  const int ve = reduced ? static_cast<int>(x.ids.size()) : 0;
  const int Vs = reduced ? vocab_.size() : V_, W = Vs + ve;
  std::vector<float> logits(static_cast<size_t>(n) * W);
  if (reduced) {
    std::vector<float> sub(static_cast<size_t>(n) * Vs), ext(static_cast<size_t>(n) * ve);
    matmul(out.data() + H, n, draft_head_, sub.data());
    if (ve > 0) matmul(out.data() + H, n, DraftVocab::rows_view(x.head_rows, full_head_, ve), ext.data());
    for (int k = 0; k < n; ++k) {
      std::copy(sub.begin() + static_cast<ptrdiff_t>(k) * Vs, sub.begin() + static_cast<ptrdiff_t>(k + 1) * Vs,
                logits.begin() + static_cast<ptrdiff_t>(k) * W);
      std::copy(ext.begin() + static_cast<ptrdiff_t>(k) * ve, ext.begin() + static_cast<ptrdiff_t>(k + 1) * ve,
                logits.begin() + static_cast<ptrdiff_t>(k) * W + Vs);
    }
  } else {
    target_.lm_head(out.data() + H, n, logits.data(), /*apply_norm=*/false);
  }

  DraftProposal p;
  p.tokens.resize(n);
  if (!params.greedy()) p.q.resize(static_cast<size_t>(n) * V_);  // zero outside the draft vocabulary
  std::vector<float> probs;
  std::vector<int32_t> drawn(n);
  for (int k = 0; k < n; ++k) {
    const float* row = logits.data() + static_cast<size_t>(k) * W;
    drawn[k] = draw_draft_token(row, W, params, rng, probs);
    p.tokens[k] = reduced ? vocab_.token(drawn[k], x) : drawn[k];
    if (params.greedy()) continue;
    float* q = p.q.data() + static_cast<size_t>(k) * V_;
    if (reduced)
      vocab_.scatter(probs, x, q);
    else
      std::copy(probs.begin(), probs.end(), q);
  }
  if (dbg) {
    dbg->block_size = bs;
    dbg->hidden = H;
    dbg->vocab = W;
    dbg->n = n;
    dbg->backbone_out = out;
    dbg->base_logits = logits;
    dbg->draft_logits = logits;
    dbg->draft_ids = p.tokens;
    for (int k = 0; k < n; ++k)
      dbg->draft_logprobs.push_back(log_softmax_at(logits.data() + static_cast<size_t>(k) * W, W, drawn[k]));
  }
  return p;
}

void ZlabDFlashDrafter::note_committed(DraftContext& seq, const int32_t* tokens, int c) const {
  if (!vocab_.empty()) vocab_.add_context(seq.vocab_extras, tokens, c, full_head_, nullptr);
}

}  // namespace dsinfer
