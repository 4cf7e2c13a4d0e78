// dsinfer speculation floor: the DFlash/DSpark draft backbone shared by all three dialects
// (drafters_spec.md §1.4, §2.1), its per-sequence draft context KV cache, and the debug
// record the concrete drafters fill for `dsinfer debug-dflash`.
//
// Data flow:
//   commit_context: captured target features [c, m·H] → ctx = hidden_norm(fc(features))
//     → for every draft layer: K = k_norm(k_proj(ctx)) rotated at the ABSOLUTE positions
//     [len, len + c), V = v_proj(ctx) → appended to DraftContext (committed positions only;
//     with a sliding window only the last window_size positions stay visible), in BF16 when
//     the projections run as Bf16Dot (kv_bf16()), as the target's own cache.
//   forward_block: block input embeddings [bs, H] ([anchor, MASK × (bs−1)]) at positions
//     [len, len + bs) → per layer: input_layernorm → Q (q_norm, RoPE), block K (k_norm,
//     RoPE) and V written temporarily after the committed entries (never persisted) →
//     NON-causal GQA attention of the bs queries over [visible context ; block] → o_proj
//     residual → post_attention_layernorm → SwiGLU MLP residual → final norm → [bs, H].
// Every linear is one matmul over all rows (batch-invariant kernels); attention work items
// are (query, head) pairs each computed by one thread in a fixed order, so results do not
// depend on the thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "model/config.h"
#include "model/qwen3_layer.h"
#include "model/rope_params.h"
#include "spec/draft_vocab.h"
#include "spec/drafter.h"

namespace dsinfer {

class WeightStore;

// Per-sequence draft state: the context K/V of every draft layer plus workspace buffers.
class DraftContext final : public DraftSequence {
 public:
  int context_length() const override { return length_; }
  // Absolute position of the first context entry attention can see (window start).
  int visible_begin() const { return visible_begin_; }
  // Per-sequence window (the dynamic drafter window), 0 = the backbone's configured one.
  int window_override() const { return window_override_; }

 private:
  friend class DraftBackbone;
  int window_override_ = 0;
  int length_ = 0;         // committed positions appended so far (absolute)
  int store_first_ = 0;    // absolute position of stored row 0
  int visible_begin_ = 0;  // >= store_first_
  int cap_ = 0;            // rows per (layer, KV head) buffer
  // Per layer: [n_kv_heads][cap_][head_dim]; F32 (k_, v_) or, when the backbone keeps BF16
  // K/V (DraftBackbone::kv_bf16), BF16 bit patterns (kb_, vb_). Only one pair is used.
  std::vector<std::vector<float>> k_, v_;
  std::vector<std::vector<uint16_t>> kb_, vb_;

 public:
  // With a reduced draft vocabulary: this sequence's committed ids outside the ranked
  // subset (and their head rows), kept by the drafter (spec/draft_vocab.h).
  DraftVocabExtras vocab_extras;
};


class DraftBackbone {
 public:
  // cfg: the draft's Qwen3-style fields. num_features: m (captured target layers).
  // prefix: "" or "model." in front of every backbone tensor name.
  DraftBackbone(const ModelConfig& cfg, int num_features, int block_size, int window_size, WeightStore& store,
                const std::string& prefix);

  int hidden() const { return H_; }
  int block_size() const { return bs_; }
  int num_features() const { return m_; }
  int window_size() const { return window_; }
  // True when the context K/V are kept in BF16 (rounded by kv_round_bf16) and attended with
  // vdpbf16ps scores, as the target's cache: exactly when the K and V projections run as
  // Bf16Dot (bf16 matmul precision, BF16 weights) at construction. F32 precision (the
  // goldens) keeps F32 K/V.
  bool kv_bf16() const { return kv_bf16_; }

  // Appends c committed positions (features [c, m·H]) at absolute positions [len, len + c).
  void append_context(DraftContext& seq, const float* features, int c) const;
  // The same for several sequences in one pass (one fc / K / V matmul over all their rows).
  struct ContextRows {
    DraftContext* seq = nullptr;
    const float* features = nullptr;
    int count = 0;
  };
  void append_context_batch(const std::vector<ContextRows>& items) const;

  // Runs the block at positions [len, len + bs). emb: [bs, H] input embeddings.
  // out: [bs, H], the backbone output after the final norm. The sequence's committed
  // context is left unchanged.
  void forward_block(DraftContext& seq, const float* emb, float* out) const;
  // The blocks of several sequences in one pass: emb/out [seqs.size() * bs, H], sequence i
  // in rows [i * bs, (i + 1) * bs). Matmuls run over all rows at once, attention per
  // sequence; each block's bits equal forward_block() on it alone.
  void forward_block_batch(const std::vector<DraftContext*>& seqs, const float* emb, float* out) const;

  // The window of one sequence (dynamic window, hot reload): it attends to its last `window`
  // committed positions (0 = the configured window). Rows are kept for the larger of the two
  // windows; rows already dropped do not come back (a grown window fills up as positions
  // arrive), and without a configured window every row stays stored.
  void set_window(DraftContext& seq, int window) const;
  // Capacity for `positions` committed positions (at most what the window keeps) + a block.
  void reserve(DraftContext& seq, int positions) const;

 private:
  void ensure_capacity(DraftContext& seq, int rows_needed) const;
  void apply_window(DraftContext& seq) const;
  // Writes one position's K and V rows (head_dim floats each) of KV head g, layer l, at
  // stored row `row`, rounding to BF16 when kv_bf16_.
  void store_kv(DraftContext& seq, int l, int g, int row, const float* k, const float* v) const;

  int H_, I_, L_, NH_, NKV_, D_, m_, bs_, window_;
  bool kv_bf16_ = false;
  float eps_;
  RopeParams rope_;
  WeightView fc_{};
  std::vector<float> hidden_norm_, final_norm_;
  Qwen3LayerDims dims_;
  std::vector<Qwen3LayerWeights> layers_;
};

// What debug-dflash prints for one propose call over the whole block. n = predicted
// positions (bs−1 for z-lab, bs for DeepSpec); rows follow the drafted positions.
struct DraftDebug {
  int block_size = 0, hidden = 0, vocab = 0, n = 0;
  std::vector<float> backbone_out;        // [bs, H] after the final norm
  std::vector<float> base_logits;         // [n, V] U_k (lm_head of the backbone output)
  std::vector<float> markov_bias;         // [n, V] B_k (empty without a Markov head)
  std::vector<float> draft_logits;        // [n, V] U_k + B_k (what the drafts are sampled from)
  std::vector<float> confidence_logits;   // [n] z_k (empty without a confidence head)
  std::vector<int32_t> draft_ids;         // [n]
  std::vector<float> draft_logprobs;      // [n] log softmax(draft_logits_k)[x_k] at temperature 1
};

// The DFlash-family drafters (z-lab, DeepSpec DFlash, DSpark): shared start/commit and the
// debug entry point.
class BlockDrafter : public Drafter {
 public:
  BlockDrafter();
  ~BlockDrafter() override;
  const DrafterInfo& info() const override { return info_; }
  std::unique_ptr<DraftSequence> start() const override { return std::make_unique<DraftContext>(); }
  void commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const override;
  DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                        Rng& rng) const override;
  std::vector<DraftProposal> propose_batch(const std::vector<DraftBatchItem>& items) const override;
  void commit_context_batch(const std::vector<ContextBatchItem>& items) const override;
  bool supports_window() const override { return true; }
  void set_window(DraftSequence& seq, int window) const override;
  void reserve(DraftSequence& seq, int positions) const override;
  // Proposes the full block (n drafts) and records every intermediate in `dbg`.
  DraftProposal propose_debug(DraftSequence& seq, int32_t anchor, const SamplingParams& params, Rng& rng,
                              DraftDebug& dbg) const;
  const DraftBackbone& backbone() const { return *backbone_; }

 protected:
  // max_tokens already clamped to [1, info_.max_draft_tokens]; dbg may be null.
  virtual DraftProposal run(DraftContext& seq, int32_t anchor, int n, const SamplingParams& params, Rng& rng,
                            DraftDebug* dbg) const = 0;
  // One sequence of a batched run (n already clamped to [1, max_draft_tokens]).
  struct RunItem {
    DraftContext* seq = nullptr;
    int32_t anchor = 0;
    int n = 0;
    const SamplingParams* params = nullptr;
    Rng* rng = nullptr;
  };
  // Default: run() per item. Drafters whose heads batch well override it.
  virtual std::vector<DraftProposal> run_batch(const std::vector<RunItem>& items) const;
  // Called with every committed position's token id (tokens may be null): drafters with a
  // reduced draft vocabulary grow the sequence's extras here. Default: nothing.
  virtual void note_committed(DraftContext& seq, const int32_t* tokens, int c) const {
    (void)seq;
    (void)tokens;
    (void)c;
  }
  static DraftContext& as_ctx(DraftSequence& seq);

  DrafterInfo info_;
  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<DraftBackbone> backbone_;
};

// log softmax(logits)[id] at temperature 1, in double (debug / golden comparison).
float log_softmax_at(const float* logits, int n, int32_t id);

// Draws one draft from a logits row exactly as the target side samples: argmax (lowest id
// on ties) when greedy, else sample_from(sampling_distribution(logits, params)); `probs`
// receives that distribution (left untouched when greedy).
int32_t draw_draft_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                         std::vector<float>& probs);

}  // namespace dsinfer
