// dsinfer speculation floor: the DeepSeek-V4 DSpark drafter (see v4_dspark_drafter.h for the
// data flow). Weights come from the target's own checkpoint directory through V4TensorIndex
// (both naming schemes, FP8/FP4 kept quantized as in the target); the Markov and
// confidence heads are the DeepSpec ones read under the "mtp.{S−1}." prefix.
#include "spec/v4_dspark_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"
#include "kernels/cpu/rmsnorm.h"
#include "model/config.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v4_attention.h"
#include "model/deepseek_v4_config.h"
#include "model/deepseek_v4_mhc.h"
#include "model/deepseek_v4_moe.h"
#include "model/deepseek_v4_weights.h"
#include "model/model.h"
#include "model/rope_params.h"
#include "model/weights.h"
#include "spec/confidence_head.h"
#include "spec/dflash_backbone.h"
#include "spec/drafter_loader.h"
#include "spec/markov_head.h"

namespace dsinfer {

namespace {

std::string ids_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Per-sequence state: for every stage the K=V rows of the committed positions still inside
// the window, rows [first, len) of width d.
class V4DraftSeq final : public DraftSequence {
 public:
  int context_length() const override { return len; }
  int len = 0;
  int first = 0;
  std::vector<std::vector<float>> kv;  // per stage
};

class V4DSparkDrafter final : public Drafter {
 public:
  V4DSparkDrafter(const std::string& dir, const Model& target, const V4DSparkConfig& dc);
  const DrafterInfo& info() const override { return info_; }
  std::unique_ptr<DraftSequence> start() const override {
    auto s = std::make_unique<V4DraftSeq>();
    s->kv.resize(stages_.size());
    return s;
  }
  void commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const override {
    commit_context_batch({ContextBatchItem{&seq, tokens, hidden, c}});
  }
  DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                        Rng& rng) const override {
    return std::move(propose_batch({DraftBatchItem{&seq, anchor, max_tokens, &params, &rng}})[0]);
  }
  // Every sequence's rows through each stage's matrices and experts at once (the weights
  // are read once per pass, not once per request); attention runs per sequence over its
  // own window and block. The kernels are row-invariant, so item i's result is what a pass
  // of item i alone gives, bit for bit (V4DSpark.BatchedPassEqualsSinglePasses).
  std::vector<DraftProposal> propose_batch(const std::vector<DraftBatchItem>& items) const override;
  void commit_context_batch(const std::vector<ContextBatchItem>& items) const override;

 private:
  static V4DraftSeq& as_seq(DraftSequence& s) {
    auto* p = dynamic_cast<V4DraftSeq*>(&s);
    if (!p) throw Error("dspark (DeepSeek-V4): draft sequence was not created by this drafter");
    return *p;
  }
  const Model& target_;
  DeepseekV4Config c_;
  DrafterInfo info_;
  std::unique_ptr<V4TensorIndex> own_index_;  // only for a drafter directory other than the target's
  std::deque<std::vector<uint8_t>> owned_;
  std::vector<V4LayerWeights> stages_;
  V4Linear main_proj_, hc_head_fn_;
  std::vector<float> main_norm_, norm_, hc_head_base_, hc_head_scale_, rope_inv_;
  std::unique_ptr<WeightStore> store_;  // the heads' tensors
  std::unique_ptr<MarkovHead> markov_;
  std::unique_ptr<ConfidenceHead> conf_;
};

V4DSparkDrafter::V4DSparkDrafter(const std::string& dir, const Model& target, const V4DSparkConfig& dc)
    : target_(target), c_(*deepseek_v4_config(target)) {
  // The stages usually live in the target's own checkpoint: read them through the target's
  // index (its files are already held, possibly as a resident copy) instead of opening and
  // copying the whole checkpoint again.
  const V4TensorIndex* shared = deepseek_v4_index(target);
  std::error_code ec;
  if (!shared || !std::filesystem::equivalent(shared->dir(), dir, ec)) {
    own_index_ = std::make_unique<V4TensorIndex>(dir);
    shared = own_index_.get();
  }
  const V4TensorIndex& ix = *shared;
  int S = 0;
  while (ix.find("mtp." + std::to_string(S) + ".input_layernorm.weight")) ++S;
  if (S == 0)
    throw Error(ix.where() + ": no DSpark drafter tensors (tensor 'mtp.0.input_layernorm.weight' / 'mtp.0.attn_norm.weight' not found; this "
                "DeepSeek-V4 checkpoint has no mtp.* stages)");
  const int64_t D = c_.hidden, nhc = c_.hc_mult, m = static_cast<int64_t>(dc.target_layer_ids.size());
  uint64_t bytes = 0, expert_bytes = 0;
  main_proj_ = load_v4_linear(ix, "mtp.0.main_proj.weight", D, m * D, owned_);
  bytes += main_proj_.bytes();
  main_norm_ = load_v4_floats(ix, "mtp.0.main_norm.weight", {D});
  for (int s = 0; s < S; ++s)
    stages_.push_back(load_v4_block(ix, c_, "mtp." + std::to_string(s) + ".", V4Attn::Sliding, 0, false, owned_,
                                    bytes, expert_bytes));
  const std::string last = "mtp." + std::to_string(S - 1) + ".";
  norm_ = load_v4_floats(ix, last + "norm.weight", {D});
  hc_head_fn_ = load_v4_linear(ix, last + "hc_head.hc_fn", nhc, nhc * D, owned_);
  bytes += hc_head_fn_.bytes();
  hc_head_base_ = load_v4_floats(ix, last + "hc_head.hc_base", {nhc});
  hc_head_scale_ = load_v4_floats(ix, last + "hc_head.hc_scale", {1});
  rope_inv_ = compute_rope_params(c_.rope_main, c_.rope_dim, c_.max_pos).inv_freq;

  // Heads: stored under their DeepSpec names after the last stage's prefix.
  store_ = std::make_unique<WeightStore>(dir, "auto", MappedFile::Placement::Mmap);  // a few small tensors
  if (dc.markov_rank > 0)
    markov_ = std::make_unique<MarkovHead>(*store_, MarkovHead::Type::Vanilla, c_.vocab, dc.markov_rank,
                                           static_cast<int>(D), last);
  if (const TensorLocation* cl = ix.find(last + "confidence_head.proj.weight")) {
    // [1, D + r] when trained with the Markov feature, [1, D] without: read off the shape.
    const auto& shp = cl->tensor->shape;
    const bool with_markov = dc.markov_rank > 0 && shp.size() == 2 && shp[1] == D + dc.markov_rank;
    conf_ = std::make_unique<ConfidenceHead>(*store_, static_cast<int>(D), with_markov ? dc.markov_rank : 0, last, true);
  }
  bytes += store_->matrix_bytes();

  info_.kind = "dspark";
  info_.block_size = dc.block_size;
  info_.max_draft_tokens = dc.block_size;
  info_.target_layer_ids = dc.target_layer_ids;
  info_.mask_token_id = dc.noise_token_id;
  info_.markov_head = markov_ ? "vanilla" : "";
  info_.confidence_head = conf_ != nullptr;

  deepseek_v4_plan_drafter(target, "DSpark drafter (" + std::to_string(S) + " mtp stages, block " +
                                       std::to_string(dc.block_size) + ", window " + std::to_string(c_.window) +
                                       ", target layers " + ids_str(dc.target_layer_ids) + ")",
                           bytes, expert_bytes);
}

void V4DSparkDrafter::commit_context_batch(const std::vector<ContextBatchItem>& items) const {
  const int64_t D = c_.hidden, d = c_.head_dim;
  int64_t rows = 0;
  for (const ContextBatchItem& it : items) {
    if (it.count <= 0) continue;
    if (!it.hidden) throw Error("dspark (DeepSeek-V4) commit_context: the target layer outputs are missing");
    rows += it.count;
  }
  if (rows == 0) return;
  // The items' captured rows side by side: [rows, m·D] -> main_x [rows, D].
  const int64_t F = static_cast<int64_t>(info_.target_layer_ids.size()) * D;
  std::vector<float> feat(static_cast<size_t>(rows * F)), x(static_cast<size_t>(rows * D));
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  {
    int64_t r = 0;
    for (const ContextBatchItem& it : items) {
      if (it.count <= 0) continue;
      const V4DraftSeq& seq = as_seq(*it.seq);
      std::memcpy(feat.data() + r * F, it.hidden, sizeof(float) * static_cast<size_t>(it.count * F));
      for (int i = 0; i < it.count; ++i) pos[static_cast<size_t>(r + i)] = seq.len + i;
      r += it.count;
    }
  }
  v4_matmul(feat.data(), rows, main_proj_, x.data());
  rmsnorm(x.data(), D, rows, D, main_norm_.data(), static_cast<float>(c_.eps), x.data(), D);
  const int half = static_cast<int>(rope_inv_.size());
  std::vector<float> cs(static_cast<size_t>(rows) * half), sn(static_cast<size_t>(rows) * half), kv(static_cast<size_t>(rows * d));
  v4_rope_rows(rope_inv_, pos.data(), rows, cs.data(), sn.data());
  for (size_t s = 0; s < stages_.size(); ++s) {
    v4_attn_kv(stages_[s], c_, half, cs.data(), sn.data(), x.data(), rows, kv.data());
    int64_t r = 0;
    for (const ContextBatchItem& it : items) {
      if (it.count <= 0) continue;
      V4DraftSeq& seq = as_seq(*it.seq);
      seq.kv[s].insert(seq.kv[s].end(), kv.begin() + r * d, kv.begin() + (r + it.count) * d);
      r += it.count;
    }
  }
  for (const ContextBatchItem& it : items) {
    if (it.count <= 0) continue;
    V4DraftSeq& seq = as_seq(*it.seq);
    seq.len += it.count;
    // Keep the window (amortised: drop only when that frees at least as much as is kept).
    const int keep_from = std::max(0, seq.len - c_.window);
    if (keep_from - seq.first >= c_.window) {
      const size_t drop = static_cast<size_t>(keep_from - seq.first) * d;
      for (auto& stage_rows : seq.kv) stage_rows.erase(stage_rows.begin(), stage_rows.begin() + static_cast<ptrdiff_t>(drop));
      seq.first = keep_from;
    }
  }
}

std::vector<DraftProposal> V4DSparkDrafter::propose_batch(const std::vector<DraftBatchItem>& items) const {
  std::vector<DraftProposal> out(items.size());
  const int bs = info_.block_size;
  const int V = c_.vocab, nhc = c_.hc_mult;
  const int64_t D = c_.hidden, d = c_.head_dim, Hd = static_cast<int64_t>(c_.heads) * d;
  // The items that draft (n > 0), each a block of bs rows in the pass.
  std::vector<size_t> act;
  for (size_t i = 0; i < items.size(); ++i) {
    const DraftBatchItem& it = items[i];
    if (std::min(it.max_tokens, bs) <= 0) continue;
    if (it.anchor < 0 || it.anchor >= V)
      throw Error("dspark propose: anchor token " + std::to_string(it.anchor) + " outside the vocabulary [0, " +
                  std::to_string(V) + ")");
    act.push_back(i);
  }
  if (act.empty()) return out;
  const int64_t B = static_cast<int64_t>(act.size()), T = B * bs;
  const float eps = static_cast<float>(c_.eps);

  // Block tokens, positions, RoPE tables: item b's rows are [b·bs, (b+1)·bs).
  std::vector<int32_t> blk(static_cast<size_t>(T), info_.mask_token_id), pos(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b) {
    const DraftBatchItem& it = items[act[b]];
    const V4DraftSeq& seq = as_seq(*it.seq);
    blk[static_cast<size_t>(b * bs)] = it.anchor;
    for (int i = 0; i < bs; ++i) pos[static_cast<size_t>(b * bs + i)] = seq.len + i;
  }
  const int half = static_cast<int>(rope_inv_.size());
  std::vector<float> cs(static_cast<size_t>(T) * half), sn(static_cast<size_t>(T) * half);
  v4_rope_rows(rope_inv_, pos.data(), T, cs.data(), sn.data());

  // Residual streams: n_hc copies of each embedding (the target's embedding table).
  std::vector<float> X(static_cast<size_t>(T * nhc * D)), u(static_cast<size_t>(T * D)), y(static_cast<size_t>(T * D));
  target_.embed(blk.data(), static_cast<int>(T), u.data());
  for (int64_t r = 0; r < T; ++r)
    for (int j = 0; j < nhc; ++j) std::memcpy(X.data() + (r * nhc + j) * D, u.data() + r * D, sizeof(float) * D);
  std::vector<float> post(static_cast<size_t>(T * nhc)), comb(static_cast<size_t>(T * nhc * nhc)), scratch;
  std::vector<float> qres(static_cast<size_t>(T) * c_.q_lora), q(static_cast<size_t>(T * Hd)),
      kv(static_cast<size_t>(T * d)), att(static_cast<size_t>(T * Hd)), logit;
  const V4HcParams hp{nhc, D, c_.hc_iters, static_cast<float>(c_.hc_eps), eps};
  std::vector<const float*> keys;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const V4LayerWeights& L = stages_[s];
    v4_hc_pre({&L.attn_hc_fn, L.attn_hc_base.data(), L.attn_hc_scale.data()}, hp, X.data(), T, post.data(),
              comb.data(), u.data(), scratch);
    rmsnorm(u.data(), D, T, D, L.in_norm.data(), eps, u.data(), D);
    v4_attn_project(L, c_, half, cs.data(), sn.data(), u.data(), T, qres.data(), q.data(), kv.data());
    for (int64_t b = 0; b < B; ++b) {
      // Keys: the window's committed context rows, then every block row (non-causal block).
      const V4DraftSeq& seq = as_seq(*items[act[b]].seq);
      const int ctx_from = std::max(seq.first, seq.len - c_.window);
      keys.clear();
      for (int t = ctx_from; t < seq.len; ++t) keys.push_back(seq.kv[s].data() + static_cast<int64_t>(t - seq.first) * d);
      for (int r = 0; r < bs; ++r) keys.push_back(kv.data() + (b * bs + r) * d);
      for (int r = 0; r < bs; ++r) {
        const int64_t row = b * bs + r;
        v4_attn_row(L, c_, q.data() + row * Hd, keys.data(), keys.size(), cs.data() + row * half, sn.data() + row * half,
                    half, logit, att.data() + row * Hd);
      }
    }
    v4_attn_output(L, c_, att.data(), T, y.data());
    v4_hc_post(hp, post.data(), comb.data(), y.data(), T, X.data());
    v4_hc_pre({&L.ffn_hc_fn, L.ffn_hc_base.data(), L.ffn_hc_scale.data()}, hp, X.data(), T, post.data(), comb.data(),
              u.data(), scratch);
    rmsnorm(u.data(), D, T, D, L.post_norm.data(), eps, u.data(), D);
    v4_moe(L, c_, u.data(), blk.data(), T, y.data());
    v4_hc_post(hp, post.data(), comb.data(), y.data(), T, X.data());
  }
  // Head: collapse, the last stage's norm, the target's LM head for each item's drafted rows.
  std::vector<float> h(static_cast<size_t>(T * D));
  v4_hc_head(hc_head_fn_, hc_head_base_.data(), hc_head_scale_.data(), hp, X.data(), T, h.data(), scratch);
  rmsnorm(h.data(), D, T, D, norm_.data(), eps, h.data(), D);
  std::vector<int64_t> first_row(static_cast<size_t>(B));
  int64_t n_rows = 0;
  for (int64_t b = 0; b < B; ++b) first_row[b] = n_rows, n_rows += std::min(items[act[b]].max_tokens, bs);
  std::vector<float> hd(static_cast<size_t>(n_rows * D)), base(static_cast<size_t>(n_rows) * V);
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(hd.data() + first_row[b] * D, h.data() + b * bs * D,
                sizeof(float) * static_cast<size_t>(std::min(items[act[b]].max_tokens, bs) * D));
  target_.lm_head(hd.data(), static_cast<int>(n_rows), base.data(), false);

  // Sequential drafting per item (DeepSpec DSpark, §2.6): Markov bias from the previous
  // SAMPLED token, each item with its own sampling parameters and rng.
  std::vector<float> logits(static_cast<size_t>(V)), bias(static_cast<size_t>(V)), state, probs;
  std::vector<float> e(static_cast<size_t>(markov_ ? markov_->rank() : 0));
  for (int64_t b = 0; b < B; ++b) {
    const DraftBatchItem& it = items[act[b]];
    const SamplingParams& params = *it.params;
    DraftProposal& p = out[act[b]];
    const int n = std::min(it.max_tokens, bs);
    p.tokens.resize(n);
    if (!params.greedy()) p.q.resize(static_cast<size_t>(n) * V);
    if (conf_) {
      p.confidence.resize(n);
      p.confidence_logits.resize(n);
    }
    if (markov_) markov_->reset(state);
    int32_t prev = it.anchor;
    for (int k = 0; k < n; ++k) {
      const float* hk = hd.data() + (first_row[b] + k) * D;
      const float* uk = base.data() + (first_row[b] + k) * V;
      if (markov_) {
        markov_->bias(prev, hk, state, bias.data(), e.data());
        for (int j = 0; j < V; ++j) logits[j] = uk[j] + bias[j];
      } else {
        std::copy(uk, uk + V, logits.begin());
      }
      if (conf_) {
        const float z = conf_->logit(hk, conf_->with_markov() ? e.data() : nullptr);
        p.confidence_logits[k] = z;
        p.confidence[k] = ConfidenceHead::sigmoid(z);
      }
      const int32_t x = draw_draft_token(logits.data(), V, params, *it.rng, probs);
      p.tokens[k] = x;
      if (!params.greedy()) std::copy(probs.begin(), probs.end(), p.q.begin() + static_cast<int64_t>(k) * V);
      prev = x;
    }
  }
  return out;
}

}  // namespace

bool is_deepseek_v4_dir(const std::string& dir) {
  const std::string file = dir + "/config.json";
  if (!file_exists(file)) return false;
  const nlohmann::json j = read_json_file(file);
  return j.is_object() && j.contains("model_type") && j.at("model_type").is_string() &&
         j.at("model_type").get<std::string>() == "deepseek_v4";
}

bool has_v4_dspark_stages(const std::string& dir) {
  try {
    if (!is_deepseek_v4_dir(dir)) return false;
    parse_v4_dspark_config(dir, parse_deepseek_v4_config(load_model_config(dir)));
    return true;
  } catch (const Error&) {
    return false;
  }
}

V4DSparkConfig parse_v4_dspark_config(const std::string& dir, const DeepseekV4Config& t) {
  const std::string file = dir + "/config.json";
  const nlohmann::json j = read_json_file(file);
  auto fail = [&](const std::string& field, const std::string& why) -> void {
    throw Error(file + ": field '" + field + "': " + why);
  };
  auto integer = [&](const char* key, bool required, int64_t lo, int64_t hi, int64_t dflt) -> int64_t {
    if (!j.contains(key) || j.at(key).is_null()) {
      if (required) fail(key, "missing (this DeepSeek-V4 checkpoint declares no DSpark drafter)");
      return dflt;
    }
    const auto& v = j.at(key);
    if (!v.is_number_integer()) fail(key, std::string("expected an integer, got ") + v.type_name());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      fail(key, "value " + std::to_string(x) + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  };
  V4DSparkConfig d;
  d.block_size = static_cast<int>(integer("dspark_block_size", true, 1, 64, 0));
  d.noise_token_id = static_cast<int32_t>(integer("dspark_noise_token_id", true, 0, t.vocab - 1, 0));
  d.markov_rank = static_cast<int>(integer("dspark_markov_rank", false, 0, 65536, 0));
  const char* ik = "dspark_target_layer_ids";
  if (!j.contains(ik) || !j.at(ik).is_array() || j.at(ik).empty())
    fail(ik, "missing or not a non-empty list of integers");
  for (const auto& v : j.at(ik)) {
    if (!v.is_number_integer()) fail(ik, "expected a list of integers, got an element of type " + std::string(v.type_name()));
    d.target_layer_ids.push_back(v.get<int>());
  }
  for (size_t i = 0; i < d.target_layer_ids.size(); ++i) {
    const int id = d.target_layer_ids[i];
    if (id < 0 || id >= t.layers)
      fail(ik, ids_str(d.target_layer_ids) + ": id " + std::to_string(id) + " outside [0, " + std::to_string(t.layers - 1) + "]");
    if (i > 0 && id <= d.target_layer_ids[i - 1]) fail(ik, ids_str(d.target_layer_ids) + " is not strictly increasing");
  }
  return d;
}

std::unique_ptr<Drafter> load_v4_dspark_drafter(const std::string& dir, const Model& target, const DrafterOptions& opts) {
  const DeepseekV4Config* tc = deepseek_v4_config(target);
  if (!tc)
    throw Error(dir + "/config.json: a DeepSeek-V4 DSpark drafter (mtp.* stages) needs a DeepSeek-V4 target, but the "
                "target model is '" + target.config().architecture + "'");
  if (opts.window_size > 0)
    throw Error("--dflash-window-size: not used by the DeepSeek-V4 DSpark drafter (its stages attend to the last "
                "sliding_window = " + std::to_string(tc->window) + " committed positions)");
  const V4DSparkConfig dc = parse_v4_dspark_config(dir, *tc);
  return std::make_unique<V4DSparkDrafter>(dir, target, dc);
}

}  // namespace dsinfer
