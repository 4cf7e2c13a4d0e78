// dsinfer speculation floor: DeepSpec DFlash / DSpark drafter (see deepspec_drafter.h).
// Tensor names are exactly those of the published checkpoints (no prefix).
#include "spec/deepspec_drafter.h"

#include <algorithm>

#include "core/error.h"
#include "model/qwen3_layer.h"
#include "model/weights.h"

namespace dsinfer {

DeepSpecDrafter::DeepSpecDrafter(const DraftConfig& cfg, const ModelConfig& target, const DrafterOptions& opts)
    : V_(target.vocab_size) {
  store_ = std::make_unique<WeightStore>(cfg.base.model_dir, opts.weight_dtype);
  const int H = cfg.base.hidden_size;
  // Shapes against the TARGET vocabulary: the frozen copies must index the same ids.
  embed_ = store_->matrix("embed_tokens.weight", V_, H);
  lm_head_ = store_->matrix("lm_head.weight", V_, H);
  backbone_ = std::make_unique<DraftBackbone>(cfg.base, static_cast<int>(cfg.target_layer_ids.size()), cfg.block_size,
                                              opts.window_size, *store_, "");
  if (cfg.markov_rank > 0) {
    MarkovHead::Type t = cfg.markov_head == "gated" ? MarkovHead::Type::Gated
                         : cfg.markov_head == "rnn" ? MarkovHead::Type::Rnn
                                                    : MarkovHead::Type::Vanilla;
    markov_ = std::make_unique<MarkovHead>(*store_, t, V_, cfg.markov_rank, H);
  }
  if (cfg.confidence_head) {
    const bool with_markov = cfg.confidence_with_markov < 0 ? cfg.markov_rank > 0 : cfg.confidence_with_markov == 1;
    conf_ = std::make_unique<ConfidenceHead>(*store_, H, with_markov ? cfg.markov_rank : 0);
  }
  info_.kind = (markov_ || conf_) ? "dspark" : "dflash-deepspec";
  info_.block_size = cfg.block_size;
  info_.max_draft_tokens = cfg.block_size;
  info_.target_layer_ids = cfg.target_layer_ids;
  info_.mask_token_id = cfg.mask_token_id;
  info_.markov_head = markov_ ? MarkovHead::type_name(markov_->type()) : "";
  info_.confidence_head = conf_ != nullptr;
}

DeepSpecDrafter::~DeepSpecDrafter() = default;

DraftProposal DeepSpecDrafter::run(DraftContext& seq, int32_t anchor, int n, const SamplingParams& params, Rng& rng,
                                   DraftDebug* dbg) const {
  if (anchor < 0 || anchor >= V_)
    throw Error("dspark propose: anchor token " + std::to_string(anchor) + " outside the vocabulary [0, " + std::to_string(V_) + ")");
  const int bs = info_.block_size, H = backbone_->hidden();
  float* emb = grow(seq.ws_emb, static_cast<size_t>(bs) * H);
  float* out = grow(seq.ws_out, static_cast<size_t>(bs) * H);
  weight_row_to_f32(embed_, anchor, emb);
  for (int i = 1; i < bs; ++i) weight_row_to_f32(embed_, info_.mask_token_id, emb + static_cast<size_t>(i) * H);
  backbone_->forward_block(seq, emb, out);
  // Base logits of the positions we draft (one matmul over n rows).
  float* base = grow(seq.ws_base, static_cast<size_t>(n) * V_);
  matmul(out, n, lm_head_, base);

  DraftProposal p;
  p.tokens.resize(n);
  const bool greedy = params.greedy();
  if (!greedy) p.q.resize(static_cast<size_t>(n) * V_);
  if (conf_) {
    p.confidence.resize(n);
    p.confidence_logits.resize(n);
  }
  if (dbg) {
    dbg->block_size = bs;
    dbg->hidden = H;
    dbg->vocab = V_;
    dbg->n = n;
    dbg->backbone_out.assign(out, out + static_cast<size_t>(bs) * H);
    dbg->base_logits.assign(base, base + static_cast<size_t>(n) * V_);
    if (markov_) dbg->markov_bias.resize(static_cast<size_t>(n) * V_);
    dbg->draft_logits.resize(static_cast<size_t>(n) * V_);
  }
  std::vector<float> state, probs;
  float* bias = markov_ ? grow(seq.ws_bias, V_) : nullptr;
  float* logits = grow(seq.ws_logits, V_);
  std::vector<float> e(markov_ ? markov_->rank() : 0);
  if (markov_) markov_->reset(state);
  int32_t prev = anchor;
  for (int k = 0; k < n; ++k) {
    const float* h = out + static_cast<size_t>(k) * H;
    const float* u = base + static_cast<size_t>(k) * V_;
    if (markov_) {
      markov_->bias(prev, h, state, bias, e.data());
      for (int j = 0; j < V_; ++j) logits[j] = u[j] + bias[j];
    } else {
      std::copy(u, u + V_, logits);
    }
    // The confidence of slot k conditions on x_{k-1} only (non-anticipating).
    if (conf_) {
      const float z = conf_->logit(h, conf_->with_markov() ? e.data() : nullptr);
      p.confidence_logits[k] = z;
      p.confidence[k] = ConfidenceHead::sigmoid(z);
    }
    const int32_t x = draw_draft_token(logits, V_, params, rng, probs);
    p.tokens[k] = x;
    if (!greedy) std::copy(probs.begin(), probs.end(), p.q.begin() + static_cast<size_t>(k) * V_);
    if (dbg) {
      if (markov_) std::copy(bias, bias + V_, dbg->markov_bias.begin() + static_cast<size_t>(k) * V_);
      std::copy(logits, logits + V_, dbg->draft_logits.begin() + static_cast<size_t>(k) * V_);
      dbg->draft_ids.push_back(x);
      dbg->draft_logprobs.push_back(log_softmax_at(logits, V_, x));
    }
    prev = x;
  }
  if (dbg) dbg->confidence_logits = p.confidence_logits;
  return p;
}

}  // namespace dsinfer
