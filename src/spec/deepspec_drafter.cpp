// dsinfer speculation floor: DeepSpec DFlash / DSpark drafter (see deepspec_drafter.h).
// Tensor names are exactly those of the published checkpoints (no prefix).
#include "spec/deepspec_drafter.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/model.h"
#include "model/qwen3_layer.h"
#include "model/weights.h"
#include "spec/draft_vocab.h"

namespace dsinfer {

DeepSpecDrafter::DeepSpecDrafter(const DraftConfig& cfg, const Model& target, const DrafterOptions& opts)
    : V_(target.config().vocab_size) {
  store_ = std::make_unique<WeightStore>(cfg.base.model_dir, opts.weight_dtype);
  const int H = cfg.base.hidden_size;
  // Shapes against the TARGET vocabulary: the frozen copies must index the same ids.
  embed_ = shared_or_own("embed_tokens.weight", target.host_embedding(), H, opts.weight_dtype);
  lm_head_ = shared_or_own("lm_head.weight", target.host_lm_head(), H, opts.weight_dtype);
  if (target.on_device() && !info_.shared_with_target.empty() && info_.shared_with_target.back() == "lm_head.weight")
    device_head_ = &target;
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
  draft_head_ = lm_head_;
  if (!opts.draft_vocab_ids.empty()) {
    vocab_ = DraftVocab(opts.draft_vocab_ids, V_);
    draft_head_ = gather_rows(lm_head_, vocab_.ids(), head_rows_);
    device_head_ = nullptr;  // the target's device head has every row
    if (markov_) markov_->restrict_output(vocab_.ids());
    info_.draft_vocab = vocab_.size();
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

void DeepSpecDrafter::note_committed(DraftContext& seq, const int32_t* tokens, int c) const {
  if (!vocab_.empty()) vocab_.add_context(seq.vocab_extras, tokens, c, lm_head_, markov_ ? &markov_->w2_full() : nullptr);
}

WeightView DeepSpecDrafter::shared_or_own(const std::string& name, const WeightView* t, int H,
                                          const std::string& weight_dtype) {
  const WeightInfo raw = store_->require(name, {DType::BF16, DType::F32, DType::F16}, {V_, H});
  // The dtype WeightStore::matrix would hand out (weights.h): only then are bytes comparable.
  const bool kept_as_stored = weight_dtype == "f32"    ? raw.dtype == DType::F32
                              : weight_dtype == "bf16" ? raw.dtype == DType::BF16
                                                       : raw.dtype != DType::F16;
  if (t && t->data && kept_as_stored && t->dtype == raw.dtype && t->rows == V_ && t->cols == H &&
      std::memcmp(t->data, raw.data, raw.nbytes) == 0) {
    info_.shared_with_target.push_back(name);
    return *t;
  }
  return store_->matrix(name, V_, H);
}

DraftProposal DeepSpecDrafter::run(DraftContext& seq, int32_t anchor, int n, const SamplingParams& params, Rng& rng,
                                   DraftDebug* dbg) const {
  return std::move(run_items({RunItem{&seq, anchor, n, &params, &rng}}, dbg)[0]);
}

std::vector<DraftProposal> DeepSpecDrafter::run_batch(const std::vector<RunItem>& items) const {
  return run_items(items, nullptr);
}

namespace {
// Per-thread buffers of the batched pass (the drafter is const and shared by sequences).
struct RunWorkspace {
  std::vector<float> emb, out, rows, base, bias, e, f, xbias, logits;
  std::vector<int32_t> prev;
  std::vector<float> hrows;
  std::vector<std::vector<float>> xbase;  // per item: the extras' base logits [n, Ve]
};
RunWorkspace& run_ws() {
  thread_local RunWorkspace ws;
  return ws;
}
}  // namespace

std::vector<DraftProposal> DeepSpecDrafter::run_items(const std::vector<RunItem>& items, DraftDebug* dbg) const {
  const int R = static_cast<int>(items.size());
  std::vector<DraftProposal> props(items.size());
  if (R == 0) return props;
  const int bs = info_.block_size, H = backbone_->hidden();
  const int r_markov = markov_ ? markov_->rank() : 0;
  RunWorkspace& ws = run_ws();
  int max_n = 0, total_n = 0;
  std::vector<DraftContext*> seqs(items.size());
  std::vector<int> row_of(items.size());  // first LM-head row of item i
  for (int i = 0; i < R; ++i) {
    const RunItem& it = items[i];
    if (it.anchor < 0 || it.anchor >= V_)
      throw Error("dspark propose: anchor token " + std::to_string(it.anchor) + " outside the vocabulary [0, " + std::to_string(V_) + ")");
    seqs[i] = it.seq;
    row_of[i] = total_n;
    total_n += it.n;
    max_n = std::max(max_n, it.n);
  }
  float* emb = grow(ws.emb, static_cast<size_t>(R) * bs * H);
  float* out = grow(ws.out, static_cast<size_t>(R) * bs * H);
  for (int i = 0; i < R; ++i) {
    float* e = emb + static_cast<size_t>(i) * bs * H;
    weight_row_to_f32(embed_, items[i].anchor, e);
    for (int j = 1; j < bs; ++j) weight_row_to_f32(embed_, info_.mask_token_id, e + static_cast<size_t>(j) * H);
  }
  backbone_->forward_block_batch(seqs, emb, out);
  // Base logits of the drafted positions of every item: one matmul over all of them.
  float* rows = grow(ws.rows, static_cast<size_t>(total_n) * H);
  for (int i = 0; i < R; ++i)
    std::memcpy(rows + static_cast<size_t>(row_of[i]) * H, out + static_cast<size_t>(i) * bs * H,
                static_cast<size_t>(items[i].n) * H * sizeof(float));
  // The draft vocabulary: the whole one (Vs = V), or the ranked subset (Vs ids, one matmul
  // over every item) plus each sequence's extras (its committed ids outside the subset, a
  // small matmul per item). Item i's logit rows are Vs + Ve_i wide; a drafted index c is the
  // token vocab_.token(c, extras).
  const int Vs = static_cast<int>(draft_head_.rows);
  const bool reduced = !vocab_.empty();
  float* base = grow(ws.base, static_cast<size_t>(total_n) * Vs);
  if (device_head_) device_head_->lm_head(rows, total_n, base, /*apply_norm=*/false);  // on the GPU, same matrix
  else matmul(rows, total_n, draft_head_, base);
  std::vector<int> ve(items.size(), 0);
  int max_ve = 0;
  if (reduced) {
    ws.xbase.resize(items.size());
    for (int i = 0; i < R; ++i) {
      const DraftVocabExtras& x = seqs[i]->vocab_extras;
      ve[i] = static_cast<int>(x.ids.size());
      max_ve = std::max(max_ve, ve[i]);
      if (ve[i] == 0) continue;
      ws.xbase[i].resize(static_cast<size_t>(items[i].n) * ve[i]);
      matmul(rows + static_cast<size_t>(row_of[i]) * H, items[i].n, DraftVocab::rows_view(x.head_rows, lm_head_, ve[i]),
             ws.xbase[i].data());
    }
  }

  for (int i = 0; i < R; ++i) {
    DraftProposal& p = props[i];
    p.tokens.resize(items[i].n);
    if (!items[i].params->greedy()) p.q.resize(static_cast<size_t>(items[i].n) * V_);  // zero outside the draft vocabulary
    if (conf_) {
      p.confidence.resize(items[i].n);
      p.confidence_logits.resize(items[i].n);
    }
  }
  if (dbg) {
    const int W = Vs + ve[0];  // debug-dflash asks for the whole vocabulary: W = V there
    dbg->block_size = bs;
    dbg->hidden = H;
    dbg->vocab = W;
    dbg->n = items[0].n;
    dbg->backbone_out.assign(out, out + static_cast<size_t>(bs) * H);
    dbg->base_logits.resize(static_cast<size_t>(items[0].n) * W);
    for (int k = 0; k < items[0].n; ++k) {
      std::copy(base + static_cast<size_t>(k) * Vs, base + static_cast<size_t>(k + 1) * Vs,
                dbg->base_logits.begin() + static_cast<size_t>(k) * W);
      if (ve[0] > 0)
        std::copy(ws.xbase[0].begin() + static_cast<ptrdiff_t>(k) * ve[0], ws.xbase[0].begin() + static_cast<ptrdiff_t>(k + 1) * ve[0],
                  dbg->base_logits.begin() + static_cast<size_t>(k) * W + Vs);
    }
    if (markov_) dbg->markov_bias.resize(static_cast<size_t>(items[0].n) * W);
    dbg->draft_logits.resize(static_cast<size_t>(items[0].n) * W);
  }
  std::vector<std::vector<float>> states(items.size());
  if (markov_)
    for (auto& st : states) markov_->reset(st);
  std::vector<int32_t> prev(items.size());
  for (int i = 0; i < R; ++i) prev[i] = items[i].anchor;
  std::vector<int> active;
  std::vector<std::vector<float>*> act_states;
  std::vector<float> probs;
  float* logits = grow(ws.logits, static_cast<size_t>(Vs) + max_ve);
  float* xbias = reduced && markov_ ? grow(ws.xbias, std::max(max_ve, 1)) : nullptr;
  // Position k of every item still drafting: its Markov bias needs d_{k-1}, so positions
  // run in order, each batched over the items.
  for (int k = 0; k < max_n; ++k) {
    active.clear();
    act_states.clear();
    ws.prev.clear();
    for (int i = 0; i < R; ++i)
      if (k < items[i].n) {
        active.push_back(i);
        act_states.push_back(&states[i]);
        ws.prev.push_back(prev[i]);
      }
    const int m = static_cast<int>(active.size());
    float* bias = nullptr;
    float* e = nullptr;
    float* f = nullptr;  // the W2 inputs, for the extras' bias
    if (markov_) {
      // h rows of the active items at position k, gathered contiguously.
      float* hrows = grow(ws.hrows, static_cast<size_t>(m) * H);
      for (int a = 0; a < m; ++a)
        std::memcpy(hrows + static_cast<size_t>(a) * H, rows + static_cast<size_t>(row_of[active[a]] + k) * H,
                    H * sizeof(float));
      bias = grow(ws.bias, static_cast<size_t>(m) * Vs);
      e = grow(ws.e, static_cast<size_t>(m) * r_markov);
      if (reduced) f = grow(ws.f, static_cast<size_t>(m) * r_markov);
      markov_->bias_rows(m, ws.prev.data(), hrows, act_states.data(), bias, e, f);
    }
    for (int a = 0; a < m; ++a) {
      const int i = active[a];
      const RunItem& it = items[i];
      DraftProposal& p = props[i];
      const DraftVocabExtras& x = seqs[i]->vocab_extras;
      const int W = Vs + ve[i];
      const float* h = rows + static_cast<size_t>(row_of[i] + k) * H;
      const float* u = base + static_cast<size_t>(row_of[i] + k) * Vs;
      const float* b = markov_ ? bias + static_cast<size_t>(a) * Vs : nullptr;
      if (b)
        for (int j = 0; j < Vs; ++j) logits[j] = u[j] + b[j];
      else
        std::copy(u, u + Vs, logits);
      if (ve[i] > 0) {
        const float* xu = ws.xbase[i].data() + static_cast<size_t>(k) * ve[i];
        if (markov_) {
          matmul(f + static_cast<size_t>(a) * r_markov, 1, DraftVocab::rows_view(x.w2_rows, markov_->w2_full(), ve[i]), xbias);
          for (int j = 0; j < ve[i]; ++j) logits[Vs + j] = xu[j] + xbias[j];
        } else {
          std::copy(xu, xu + ve[i], logits + Vs);
        }
      }
      // The confidence of slot k conditions on x_{k-1} only (non-anticipating).
      if (conf_) {
        const float z = conf_->logit(h, conf_->with_markov() ? e + static_cast<size_t>(a) * r_markov : nullptr);
        p.confidence_logits[k] = z;
        p.confidence[k] = ConfidenceHead::sigmoid(z);
      }
      const int32_t c = draw_draft_token(logits, W, *it.params, *it.rng, probs);
      const int32_t tok = reduced ? vocab_.token(c, x) : c;
      p.tokens[k] = tok;
      if (!it.params->greedy()) {
        float* q = p.q.data() + static_cast<size_t>(k) * V_;
        if (reduced)
          vocab_.scatter(probs, x, q);
        else
          std::copy(probs.begin(), probs.end(), q);
      }
      if (dbg) {
        if (b) {
          std::copy(b, b + Vs, dbg->markov_bias.begin() + static_cast<size_t>(k) * W);
          if (ve[i] > 0) std::copy(xbias, xbias + ve[i], dbg->markov_bias.begin() + static_cast<size_t>(k) * W + Vs);
        }
        std::copy(logits, logits + W, dbg->draft_logits.begin() + static_cast<size_t>(k) * W);
        dbg->draft_ids.push_back(tok);
        dbg->draft_logprobs.push_back(log_softmax_at(logits, W, c));
      }
      prev[i] = tok;
    }
  }
  if (dbg) dbg->confidence_logits = props[0].confidence_logits;
  return props;
}

}  // namespace dsinfer
