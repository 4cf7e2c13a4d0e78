// dsinfer speculation floor: z-lab DFlash drafter (see dflash_zlab.h for the data flow).
// Tensor names are as published (top level), with an optional "model." prefix tolerated.
#include "spec/dflash_zlab.h"

#include <algorithm>

#include "core/error.h"
#include "model/model.h"
#include "model/weights.h"

namespace dsinfer {

ZlabDFlashDrafter::ZlabDFlashDrafter(const DraftConfig& cfg, const Model& target, const DrafterOptions& opts)
    : target_(target), V_(target.config().vocab_size) {
  store_ = std::make_unique<WeightStore>(cfg.base.model_dir, opts.weight_dtype);
  const std::string prefix = (!store_->has("fc.weight") && store_->has("model.fc.weight")) ? "model." : "";
  backbone_ = std::make_unique<DraftBackbone>(cfg.base, static_cast<int>(cfg.target_layer_ids.size()), cfg.block_size,
                                              opts.window_size, *store_, prefix);
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
  std::vector<float> logits(static_cast<size_t>(n) * V_);
  target_.lm_head(out.data() + H, n, logits.data(), /*apply_norm=*/false);

  DraftProposal p;
  p.tokens.resize(n);
  if (!params.greedy()) p.q.resize(static_cast<size_t>(n) * V_);
  std::vector<float> probs;
  for (int k = 0; k < n; ++k) {
    const float* row = logits.data() + static_cast<size_t>(k) * V_;
    p.tokens[k] = draw_draft_token(row, V_, params, rng, probs);
    if (!params.greedy()) std::copy(probs.begin(), probs.end(), p.q.begin() + static_cast<size_t>(k) * V_);
  }
  if (dbg) {
    dbg->block_size = bs;
    dbg->hidden = H;
    dbg->vocab = V_;
    dbg->n = n;
    dbg->backbone_out = out;
    dbg->base_logits = logits;
    dbg->draft_logits = logits;
    dbg->draft_ids = p.tokens;
    for (int k = 0; k < n; ++k)
      dbg->draft_logprobs.push_back(log_softmax_at(logits.data() + static_cast<size_t>(k) * V_, V_, p.tokens[k]));
  }
  return p;
}

}  // namespace dsinfer
