// dsinfer speculation floor: the DFlash/DSpark draft backbone (see dflash_backbone.h for
// the data flow). Context K/V are computed once, at commit time, at absolute positions;
// the block's K/V are written after the committed rows for one call only, which is the
// reference's "append then crop to start" without the crop.
//
// Storage per (layer, KV head) is [rows][head_dim] with row 0 at absolute position
// store_first_, which is the cache layout attention_causal() reads: the block's attention
// is one non-causal call (every block row sees the visible context and the whole block),
// so the grouped kernel loads each visible K/V row once for all rows and heads of a group.
// A sliding window moves visible_begin_ forward; rows before it are dropped by an
// occasional compaction (amortised O(1) per committed position).
#include "spec/dflash_backbone.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/silu_mul.h"
#include "model/weights.h"

namespace dsinfer {


DraftBackbone::DraftBackbone(const ModelConfig& cfg, int num_features, int block_size, int window_size,
                             WeightStore& store, const std::string& prefix)
    : H_(cfg.hidden_size),
      I_(cfg.intermediate_size),
      L_(cfg.num_hidden_layers),
      NH_(cfg.num_attention_heads),
      NKV_(cfg.num_key_value_heads),
      D_(cfg.head_dim),
      m_(num_features),
      bs_(block_size),
      window_(window_size),
      eps_(static_cast<float>(cfg.rms_norm_eps)) {
  check(window_size >= 0, "dflash window size: must be >= 0, got " + std::to_string(window_size));
  rope_ = compute_rope_params(cfg.rope, D_, cfg.max_position_embeddings);
  const int64_t H = H_;
  fc_ = store.matrix(prefix + "fc.weight", H, int64_t{m_} * H);
  hidden_norm_ = store.vector_f32(prefix + "hidden_norm.weight", H);
  final_norm_ = store.vector_f32(prefix + "norm.weight", H);
  dims_ = qwen3_layer_dims(cfg);
  layers_.resize(L_);
  for (int l = 0; l < L_; ++l)
    layers_[l] = load_qwen3_layer(store, prefix + "layers." + std::to_string(l) + ".", dims_, cfg.attention_bias);
  // The target's rule (Qwen3Model::kv_dtype): K/V from Bf16Dot projections are kept in BF16.
  kv_bf16_ = matmul_precision() == MatmulPrecision::Bf16Dot && L_ > 0 && layers_[0].k.dtype == DType::BF16 &&
             layers_[0].v.dtype == DType::BF16;
}

namespace {
// Calls f on the K and the V buffers (per layer) the context uses: F32 or BF16.
template <class F>
void for_each_kv(bool bf16, std::vector<std::vector<float>>& k, std::vector<std::vector<float>>& v,
                 std::vector<std::vector<uint16_t>>& kb, std::vector<std::vector<uint16_t>>& vb, F&& f) {
  if (bf16) {
    f(kb);
    f(vb);
  } else {
    f(k);
    f(v);
  }
}
}  // namespace

void DraftBackbone::store_kv(DraftContext& s, int l, int g, int row, const float* k, const float* v) const {
  const size_t dst = (static_cast<size_t>(g) * s.cap_ + row) * D_;
  if (kv_bf16_) {
    kv_round_bf16(k, D_, s.kb_[l].data() + dst);
    kv_round_bf16(v, D_, s.vb_[l].data() + dst);
  } else {
    std::memcpy(s.k_[l].data() + dst, k, D_ * sizeof(float));
    std::memcpy(s.v_[l].data() + dst, v, D_ * sizeof(float));
  }
}

void DraftBackbone::ensure_capacity(DraftContext& s, int rows_needed) const {
  const size_t layers = kv_bf16_ ? s.kb_.size() : s.k_.size();
  if (static_cast<int>(layers) != L_) {
    for_each_kv(kv_bf16_, s.k_, s.v_, s.kb_, s.vb_, [&](auto& bufs) { bufs.assign(L_, {}); });
    s.cap_ = 0;
  }
  if (rows_needed <= s.cap_) return;
  const int new_cap = std::max({rows_needed, 2 * s.cap_, 64});
  const int used = s.length_ - s.store_first_;  // committed rows worth keeping
  for_each_kv(kv_bf16_, s.k_, s.v_, s.kb_, s.vb_, [&](auto& bufs) {
    using T = typename std::decay_t<decltype(bufs)>::value_type::value_type;
    for (auto& buf : bufs) {
      std::vector<T> nb(static_cast<size_t>(NKV_) * new_cap * D_);
      for (int g = 0; g < NKV_; ++g)
        if (used > 0)
          std::memcpy(nb.data() + static_cast<size_t>(g) * new_cap * D_, buf.data() + static_cast<size_t>(g) * s.cap_ * D_,
                      static_cast<size_t>(used) * D_ * sizeof(T));
      buf.swap(nb);
    }
  });
  s.cap_ = new_cap;
}

void DraftBackbone::apply_window(DraftContext& s) const {
  const int w = s.window_override_ > 0 ? s.window_override_ : window_;
  s.visible_begin_ = w > 0 ? std::max(s.store_first_, s.length_ - w) : s.store_first_;
  // Rows kept: the configured window's, or a larger per-sequence window's (which fills up
  // as new positions arrive when rows were already dropped); no configured window keeps all.
  if (window_ <= 0) return;
  const int keep_rows = std::max(window_, s.window_override_);
  // Compact once the dead prefix is as large as the kept window (or 32 rows): each row moves
  // O(1) times on average.
  const int keep_from = std::max(s.store_first_, s.length_ - keep_rows);
  const int drop = keep_from - s.store_first_;
  if (drop < std::max(keep_rows, 32)) return;
  const int keep = s.length_ - keep_from;
  for_each_kv(kv_bf16_, s.k_, s.v_, s.kb_, s.vb_, [&](auto& bufs) {
    using T = typename std::decay_t<decltype(bufs)>::value_type::value_type;
    for (auto& buf : bufs)
      for (int g = 0; g < NKV_; ++g) {
        T* base = buf.data() + static_cast<size_t>(g) * s.cap_ * D_;
        std::memmove(base, base + static_cast<size_t>(drop) * D_, static_cast<size_t>(keep) * D_ * sizeof(T));
      }
  });
  s.store_first_ = keep_from;
}

void DraftBackbone::reserve(DraftContext& s, int positions) const {
  if (positions <= 0) return;
  // With a window, apply_window() compacts once the dropped prefix reaches the kept rows
  // (or 32): at most 2 * keep + 32 rows are ever stored.
  const int keep = window_ > 0 ? std::max(window_, s.window_override_) : 0;
  const int rows = keep > 0 ? std::min(positions, 2 * keep + 32) : positions;
  ensure_capacity(s, s.length_ - s.store_first_ + rows + bs_);
}

void DraftBackbone::set_window(DraftContext& s, int window) const {
  if (window < 0) throw Error("drafter window: must be >= 0, got " + std::to_string(window));
  s.window_override_ = window;
  apply_window(s);
}

namespace {
// Workspace of the batched passes: one per thread (the methods are const and a drafter is
// shared by every sequence of an engine), grown once, reused every step.
struct BatchWorkspace {
  std::vector<float> ctx, x, h, q, k, v, att, g, u, t, cos, sin;
  std::vector<int32_t> pos;
};
BatchWorkspace& batch_ws() {
  thread_local BatchWorkspace ws;
  return ws;
}
}  // namespace

void DraftBackbone::append_context(DraftContext& s, const float* features, int c) const {
  append_context_batch({ContextRows{&s, features, c}});
}

void DraftBackbone::append_context_batch(const std::vector<ContextRows>& items) const {
  int64_t C = 0;
  for (const ContextRows& it : items) {
    if (it.count < 0) throw Error("dflash commit_context: negative position count " + std::to_string(it.count));
    if (it.count > 0 && !it.features) throw Error("dflash commit_context: target hidden states are required (got none)");
    C += it.count;
  }
  if (C == 0) return;
  const int64_t H = H_, D = D_, NK = int64_t{NKV_} * D, F = int64_t{m_} * H;
  BatchWorkspace& ws = batch_ws();
  // Gather every sequence's feature rows, then ctx = hidden_norm(fc(features)): shared by
  // every layer, never updated across layers.
  float* feats = grow(ws.x, C * F);
  if (ws.pos.size() < static_cast<size_t>(C)) ws.pos.resize(C);
  {
    int64_t r = 0;
    for (const ContextRows& it : items) {
      if (it.count == 0) continue;
      ensure_capacity(*it.seq, it.seq->length_ - it.seq->store_first_ + it.count + bs_);
      std::memcpy(feats + r * F, it.features, static_cast<size_t>(it.count) * F * sizeof(float));
      for (int i = 0; i < it.count; ++i) ws.pos[r + i] = it.seq->length_ + i;
      r += it.count;
    }
  }
  float* ctx = grow(ws.ctx, C * H);
  matmul(feats, C, fc_, ctx);
  rmsnorm(ctx, H, C, H, hidden_norm_.data(), eps_, ctx, H);
  const int half = D_ / 2;
  float* cos_t = grow(ws.cos, C * half);
  float* sin_t = grow(ws.sin, C * half);
  rope_tables(rope_.inv_freq.data(), half, ws.pos.data(), C, rope_.attention_factor, cos_t, sin_t);
  float* k = grow(ws.k, C * NK);
  float* v = grow(ws.v, C * NK);
  for (int l = 0; l < L_; ++l) {
    const Qwen3LayerWeights& W = layers_[l];
    matmul(ctx, C, W.k, k);
    matmul(ctx, C, W.v, v);
    add_bias(k, C, NK, W.k_bias);
    add_bias(v, C, NK, W.v_bias);
    rmsnorm(k, D, C * NKV_, D, W.k_norm.data(), eps_, k, D);
    apply_rope(k, NK, C, NKV_, D_, cos_t, sin_t);
    int64_t r = 0;
    for (const ContextRows& it : items) {
      DraftContext& s = *it.seq;
      const int row0 = s.length_ - s.store_first_;
      for (int i = 0; i < it.count; ++i)
        for (int g = 0; g < NKV_; ++g) store_kv(s, l, g, row0 + i, k + (r + i) * NK + g * D, v + (r + i) * NK + g * D);
      r += it.count;
    }
  }
  for (const ContextRows& it : items) {
    if (it.count == 0) continue;
    it.seq->length_ += it.count;
    apply_window(*it.seq);
  }
}

void DraftBackbone::forward_block(DraftContext& s, const float* emb, float* out) const {
  forward_block_batch({&s}, emb, out);
}

void DraftBackbone::forward_block_batch(const std::vector<DraftContext*>& seqs, const float* emb, float* out) const {
  const int R = static_cast<int>(seqs.size());
  if (R == 0) return;
  const int64_t H = H_, I = I_, D = D_, NQ = int64_t{NH_} * D, NK = int64_t{NKV_} * D, B = bs_, T = int64_t{R} * bs_;
  BatchWorkspace& ws = batch_ws();
  if (ws.pos.size() < static_cast<size_t>(T)) ws.pos.resize(T);
  for (int i = 0; i < R; ++i) {
    DraftContext& s = *seqs[i];
    ensure_capacity(s, s.length_ - s.store_first_ + bs_);
    for (int j = 0; j < bs_; ++j) ws.pos[int64_t{i} * B + j] = s.length_ + j;
  }
  float* x = grow(ws.x, T * H);
  std::memcpy(x, emb, T * H * sizeof(float));
  const int half = D_ / 2;
  float* cos_t = grow(ws.cos, T * half);
  float* sin_t = grow(ws.sin, T * half);
  rope_tables(rope_.inv_freq.data(), half, ws.pos.data(), T, rope_.attention_factor, cos_t, sin_t);
  float* h = grow(ws.h, T * H);
  float* q = grow(ws.q, T * NQ);
  float* k = grow(ws.k, T * NK);
  float* v = grow(ws.v, T * NK);
  float* att = grow(ws.att, T * NQ);
  float* g = grow(ws.g, T * I);
  float* u = grow(ws.u, T * I);
  float* t = grow(ws.t, T * H);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  std::vector<AttentionBlock> blocks(R);
  for (int l = 0; l < L_; ++l) {
    const Qwen3LayerWeights& W = layers_[l];
    qwen3_attention_inputs(W, dims_, x, T, cos_t, sin_t, h, q, k, v);
    for (int i = 0; i < R; ++i) {
      DraftContext& s = *seqs[i];
      const int row0 = s.length_ - s.store_first_;       // block rows start here (temporary)
      const int vis0 = s.visible_begin_ - s.store_first_;  // first visible context row
      const int64_t r0 = int64_t{i} * B;
      for (int j = 0; j < bs_; ++j)
        for (int gq = 0; gq < NKV_; ++gq)
          store_kv(s, l, gq, row0 + j, k + (r0 + j) * NK + gq * D, v + (r0 + j) * NK + gq * D);
      // Non-causal: every block query sees [visible context ; whole block], i.e. the block
      // starts at key row row0 - vis0 of the visible range and sees all of itself.
      AttentionBlock& ab = blocks[i];
      ab = AttentionBlock{};
      ab.q = q + r0 * NQ;
      ab.q_stride = NQ;
      ab.n_q = bs_;
      ab.start_pos = row0 - vis0;
      ab.causal = false;
      if (kv_bf16_) {
        ab.k_bf16 = s.kb_[l].data() + static_cast<int64_t>(vis0) * D;
        ab.v_bf16 = s.vb_[l].data() + static_cast<int64_t>(vis0) * D;
      } else {
        ab.k = s.k_[l].data() + static_cast<int64_t>(vis0) * D;
        ab.v = s.v_[l].data() + static_cast<int64_t>(vis0) * D;
      }
      ab.kv_head_stride = static_cast<int64_t>(s.cap_) * D;
      ab.out = att + r0 * NQ;
      ab.out_stride = NQ;
    }
    attention_causal(blocks.data(), R, NH_, NKV_, D_, scale);
    qwen3_attention_out_mlp(W, dims_, att, T, x, h, g, u, t);
  }
  rmsnorm(x, H, T, H, final_norm_.data(), eps_, out, H);
}

// ---- BlockDrafter -----------------------------------------------------------------------

BlockDrafter::BlockDrafter() = default;
BlockDrafter::~BlockDrafter() = default;

DraftContext& BlockDrafter::as_ctx(DraftSequence& seq) {
  auto* c = dynamic_cast<DraftContext*>(&seq);
  if (!c) throw Error("dflash drafter: sequence state was not created by this drafter's start()");
  return *c;
}

void BlockDrafter::commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const {
  if (c < 0) throw Error("dflash commit_context: negative position count " + std::to_string(c));
  backbone_->append_context(as_ctx(seq), hidden, c);
  note_committed(as_ctx(seq), tokens, c);
}

void BlockDrafter::set_window(DraftSequence& seq, int window) const { backbone_->set_window(as_ctx(seq), window); }

void BlockDrafter::reserve(DraftSequence& seq, int positions) const { backbone_->reserve(as_ctx(seq), positions); }

void BlockDrafter::commit_context_batch(const std::vector<ContextBatchItem>& items) const {
  check_batch_items(items);
  std::vector<DraftBackbone::ContextRows> rows;
  rows.reserve(items.size());
  for (const ContextBatchItem& it : items) rows.push_back({&as_ctx(*it.seq), it.hidden, it.count});
  backbone_->append_context_batch(rows);
  for (const ContextBatchItem& it : items) note_committed(as_ctx(*it.seq), it.tokens, it.count);
}

std::vector<DraftProposal> BlockDrafter::run_batch(const std::vector<RunItem>& items) const {
  std::vector<DraftProposal> out;
  out.reserve(items.size());
  for (const RunItem& it : items) out.push_back(run(*it.seq, it.anchor, it.n, *it.params, *it.rng, nullptr));
  return out;
}

std::vector<DraftProposal> BlockDrafter::propose_batch(const std::vector<DraftBatchItem>& items) const {
  check_batch_items(items);
  std::vector<DraftProposal> out(items.size());
  std::vector<RunItem> run_items;
  std::vector<size_t> where;
  for (size_t i = 0; i < items.size(); ++i) {
    const DraftBatchItem& it = items[i];
    if (it.max_tokens < 0)
      throw Error("dflash propose: max_tokens must be >= 0, got " + std::to_string(it.max_tokens));
    const int n = std::min(it.max_tokens, info_.max_draft_tokens);
    if (n == 0) continue;
    run_items.push_back({&as_ctx(*it.seq), it.anchor, n, it.params, it.rng});
    where.push_back(i);
  }
  std::vector<DraftProposal> got = run_batch(run_items);
  for (size_t j = 0; j < got.size(); ++j) out[where[j]] = std::move(got[j]);
  return out;
}

DraftProposal BlockDrafter::propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                                    Rng& rng) const {
  if (max_tokens < 0) throw Error("dflash propose: max_tokens must be >= 0, got " + std::to_string(max_tokens));
  const int n = std::min(max_tokens, info_.max_draft_tokens);
  if (n == 0) return {};
  return run(as_ctx(seq), anchor, n, params, rng, nullptr);
}

DraftProposal BlockDrafter::propose_debug(DraftSequence& seq, int32_t anchor, const SamplingParams& params, Rng& rng,
                                          DraftDebug& dbg) const {
  dbg = DraftDebug{};
  return run(as_ctx(seq), anchor, info_.max_draft_tokens, params, rng, &dbg);
}

float log_softmax_at(const float* logits, int n, int32_t id) {
  double mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return static_cast<float>(static_cast<double>(logits[id]) - mx - std::log(sum));
}

int32_t draw_draft_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                         std::vector<float>& probs) {
  if (params.greedy()) return argmax(logits, vocab);
  sampling_distribution(logits, vocab, params, probs);
  return sample_from(probs, rng);
}

}  // namespace dsinfer
