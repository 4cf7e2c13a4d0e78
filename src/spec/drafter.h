// dsinfer speculation floor: the drafter interface every proposer implements (z-lab DFlash,
// DeepSpec DFlash/DSpark, n-gram prompt lookup).
//
// Data flow of one speculative round for one sequence (driven by engine/, never here):
//   committed context (tokens + captured target layer outputs) --commit_context--> the
//   drafter's per-sequence state (draft context KV cache, n-gram index)
//   anchor (last committed token, not yet in the target KV cache) --propose--> up to
//   max_tokens draft tokens, each with the exact distribution q it was drawn from and,
//   for DSpark, the confidence head's per-position survival probability.
// The engine verifies [anchor, d_1..d_n] in one target forward, accepts a prefix, rolls
// the target KV back, and calls commit_context with the anchor + accepted drafts (their
// target hidden states come from that verify forward). Draft-side state never holds
// uncommitted positions between rounds, so there is nothing to roll back here.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace dsinfer {

class Model;
class BlockKVCache;

// Per-sequence drafter state (draft context cache etc.). Created by Drafter::start.
class DraftSequence {
 public:
  virtual ~DraftSequence() = default;
  // Number of committed positions appended so far.
  virtual int context_length() const = 0;
};

struct DraftProposal {
  std::vector<int32_t> tokens;  // d_1..d_n, n <= max_tokens
  // Draft distributions q_1..q_n, row-major [n, vocab]: q_k is exactly the distribution
  // d_k was drawn from (after any Markov bias, with temperature/top-k/top-p applied the
  // same way as for the target). Empty means point masses on `tokens` (greedy drafting,
  // n-gram lookup).
  std::vector<float> q;
  // Raw confidence-head outputs sigmoid(z_k) per draft position (empty without a head):
  // probability that d_k survives given d_1..d_{k-1} did.
  std::vector<float> confidence;
  // Raw confidence logits z_k (for calibration), same length as confidence.
  std::vector<float> confidence_logits;
};

struct DrafterInfo {
  std::string kind;                   // "dflash" (z-lab), "dflash-deepspec", "dspark", "ngram"
  int block_size = 0;                 // block positions including the anchor (0 for ngram)
  int max_draft_tokens = 0;           // bs-1 (z-lab), bs (DeepSpec), configured (ngram)
  std::vector<int> target_layer_ids;  // layers whose outputs commit_context needs (-1 = embeddings)
  int32_t mask_token_id = -1;
  std::string markov_head;            // "", "vanilla", "gated", "rnn"
  bool confidence_head = false;
  // Tensors the drafter uses from the target instead of its own bit-identical copy
  // (Model::host_embedding/host_lm_head), e.g. {"embed_tokens.weight", "lm_head.weight"}.
  std::vector<std::string> shared_with_target;
  // true when the drafter runs on the target's device (the CUDA DeepSpec drafter).
  bool on_device = false;
  // Ids the drafter drafts from (spec/draft_vocab.h): 0 = the whole vocabulary.
  int draft_vocab = 0;
};

// Keeps the first n drafts of a proposal (tokens, their q rows, confidences); n <= size.
// Verifying a prefix of the drafts is lossless; this is how every verify policy applies.
void keep_first_drafts(DraftProposal& p, size_t n);

// One sequence's part of a batched drafter pass (Drafter::propose_batch). Pointers are
// borrowed for the call; every item names a different sequence.
struct DraftBatchItem {
  DraftSequence* seq = nullptr;
  int32_t anchor = 0;
  int max_tokens = 0;
  const SamplingParams* params = nullptr;
  Rng* rng = nullptr;
};

// One sequence's committed positions in a batched commit (Drafter::commit_context_batch).
// The captured target rows come from `hidden` (host, [count, layers * hidden] F32) or, for a
// drafter that reads_cache_features(), from the feature rows of the paged KV cache the
// target wrote them into (ForwardBatch::capture_to_cache): position feature_first + i is
// row feature_blocks[(feature_first + i) / block_size] * block_size + (feature_first + i) %
// block_size of feature_cache (feature_blocks: the sequence's block table, from position 0).
struct ContextBatchItem {
  DraftSequence* seq = nullptr;
  const int32_t* tokens = nullptr;
  const float* hidden = nullptr;
  int count = 0;
  const BlockKVCache* feature_cache = nullptr;
  const int32_t* feature_blocks = nullptr;
  int feature_first = 0;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const DrafterInfo& info() const = 0;

  virtual std::unique_ptr<DraftSequence> start() const = 0;

  // Appends c committed positions: their token ids and, when target_layer_ids is not
  // empty, the captured target layer outputs, row-major [c, layers * hidden] in the
  // order of target_layer_ids. Positions are absolute and contiguous.
  virtual void commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const = 0;

  // Proposes up to max_tokens drafts following `anchor`, which sits at absolute position
  // seq.context_length(). Sampling (temperature/top-k/top-p, seed stream) as `params`;
  // greedy params give greedy drafts and an empty q.
  virtual DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                                Rng& rng) const = 0;

  // Batched forms for the engine: every running request's drafts (or commits) in one pass,
  // so the drafter's weights are read once per step instead of once per request. Result i
  // is exactly what propose() (commit_context()) would give for item i alone, bit for bit
  // (the kernels are batch-invariant); each item draws from its own rng. The defaults loop
  // over the single-sequence calls; block drafters override them.
  virtual std::vector<DraftProposal> propose_batch(const std::vector<DraftBatchItem>& items) const;
  virtual void commit_context_batch(const std::vector<ContextBatchItem>& items) const;
  // true when commit_context_batch reads captured rows from a paged KV cache's feature rows
  // (the GPU drafter, from its target's device pool); others take host rows only.
  virtual bool reads_cache_features() const { return false; }

  // Drafters that attend to a window of committed context (the block drafters) let the
  // engine move it per sequence (the dynamic drafter window); others refuse.
  virtual bool supports_window() const { return false; }
  virtual void set_window(DraftSequence& seq, int window) const;

  // Sizes the sequence's state for `positions` committed positions up front (prompt + new
  // tokens), so decoding never grows it: growing copies the state, and first-touching
  // fresh pages costs page faults that, in a VM, were several plain decode steps long.
  // A hint: committing more still works. Default: nothing to size.
  virtual void reserve(DraftSequence& seq, int positions) const {
    (void)seq;
    (void)positions;
  }
};

}  // namespace dsinfer

namespace dsinfer {
// z-lab's default target layers when a checkpoint gives none: [L_t / 2] for one draft
// layer, else round(1 + i * (L_t - 4) / (L_d - 1)) for i in [0, L_d), Python-style
// round-half-to-even (drafters_spec.md §1.3).
std::vector<int> default_target_layer_ids(int num_target_layers, int num_draft_layers);

// One-line Error unless every item names its own sequence (and, for proposals, has params
// and an rng): a sequence twice in one batch would make the result depend on item order.
void check_batch_items(const std::vector<DraftBatchItem>& items);
// cache_features: whether items may name a feature_cache (else a one-line Error).
void check_batch_items(const std::vector<ContextBatchItem>& items, bool cache_features = false);
}  // namespace dsinfer
