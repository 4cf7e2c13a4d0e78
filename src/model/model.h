// dsinfer model floor: the interface every target architecture implements.
//
// Data flow: the caller owns a KVCache (one slot per live sequence) and calls
// Model::forward with a batch of (slot, new tokens) entries. Each entry appends its tokens
// at positions [kv_len, kv_len + n) of its slot; prefill, single-token decode and
// multi-token speculative verify are all this same call. The result holds logits only for
// the rows the caller asked for and, when asked, the residual-stream outputs of chosen
// decoder layers (the DFlash/DSpark drafters read those).
//
// Determinism contract (batch invariance): the logits and captured hidden states of a
// token depend only on its sequence's tokens, never on what else shares the forward call
// or on the thread count. Kernels are written so that every reduction has a fixed order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace dsinfer {

struct WeightView;

class KVCache;
class BlockKVCache;

struct ForwardEntry {
  int slot = 0;                      // KV cache slot of the sequence
  std::vector<int32_t> tokens;       // new tokens appended at the slot's current length
  std::vector<int> logit_rows;       // indices into `tokens` whose logits are returned
};

struct ForwardBatch {
  std::vector<ForwardEntry> entries;
  // Decoder layer outputs to capture for every new token (residual stream after the
  // layer's MLP add, before the final norm). Layer id -1 means the embedding output.
  std::vector<int> capture_layers;
  // Keep the captured rows in the paged cache's feature rows (BlockKVCache::feature_floats,
  // BF16) at each new token's position, where a drafter on the same device reads them
  // (ContextBatchItem's cache source), instead of returning them: out.captured stays empty.
  // Only for a BlockKVCache with feature rows as wide as capture_layers × hidden (else Error).
  bool capture_to_cache = false;
};

struct ForwardOutput {
  int vocab_size = 0;
  int hidden_size = 0;
  // Row-major [sum over entries of logit_rows.size(), vocab_size], entries in batch order.
  std::vector<float> logits;
  // Row-major [sum over entries of tokens.size(), capture_layers.size() * hidden_size]:
  // for each new token, the captured layers concatenated in the order requested.
  std::vector<float> captured;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;

  // Creates a KV cache able to hold `max_slots` sequences of up to `max_tokens` each.
  virtual std::unique_ptr<KVCache> make_kv_cache(int max_slots, int max_tokens) const = 0;

  // Element type of the K/V this model's caches hold (make_kv_cache, and the batched
  // engine's paged cache: the default make_paged_kv_cache passes it to PagedKVCache, and
  // the engine sizes its pool in these bytes), read when a cache is made: the CPU Qwen3 forward keeps BF16 K/V
  // when its matmuls run in bf16 precision over BF16 weights, F32 otherwise.
  virtual DType kv_dtype() const { return DType::F32; }
  // Creates the batched engine's paged KV storage (model/block_kv_cache.h): num_blocks
  // blocks of block_size positions shared by max_slots slots of up to max_tokens each,
  // where this model's forward reads it. Default (model.cpp): PagedKVCache in host memory
  // with the config's geometry; the CUDA model puts the pool in device memory.
  // feature_floats > 0 asks for feature rows next to the K/V (a drafter's captured target
  // rows per position, written by forwards with capture_to_cache); a model that keeps them
  // where its forward runs gives them (the CUDA model), the default does not (the engine
  // then keeps its own host store): read the answer from BlockKVCache::feature_floats().
  virtual std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots,
                                                            int max_tokens, int feature_floats) const;
  // How this model's decoding state grows with a sequence, for the batched engine's pool
  // sizing and prefix cache. The default (bytes_per_token 0): K/V rows of the config's
  // geometry in kv_dtype(), shareable by block (prefix cache, copy-on-write). A model whose
  // state is not a list of per-position K/V rows (DeepSeek-V4: sliding-window rows,
  // compressor buffers and compressed entries per sequence) gives its own figures and
  // prefix_sharing = false: its paged storage keeps the state per slot and the blocks only
  // account for its memory.
  struct PagedStateShape {
    uint64_t bytes_per_token = 0;     // state per token of context (0: the K/V layout)
    uint64_t bytes_per_sequence = 0;  // held by every live sequence, whatever its length
    bool prefix_sharing = true;       // sequences may share cached prefix blocks
  };
  virtual PagedStateShape paged_state_shape() const { return {}; }
  // For a model whose paged KV pool lives in its own device memory: how many blocks of
  // block_size positions `prealloc_ratio` of the device's free memory holds now
  // (--cache-prealloc-ratio), each with feature_floats feature rows per position as
  // make_paged_kv_cache would give them. 0 (the default): the pool lives in host memory and
  // the caller sizes it from the host budget.
  virtual int64_t device_kv_blocks(int block_size, double prealloc_ratio, int feature_floats) const {
    (void)block_size;
    (void)prealloc_ratio;
    (void)feature_floats;
    return 0;
  }
  // true when forward, forward_argmax and lm_head run on a device (a GPU): a greedy caller
  // gains by asking forward_argmax for ids (no vocabulary-wide rows cross to the host), and
  // a drafter that shares this model's LM head runs its head through lm_head() there.
  virtual bool on_device() const { return false; }

  // Runs the batch; appends every entry's tokens to its slot. Throws Error on bad input
  // (token id outside the vocabulary, slot overflow) before touching the cache.
  virtual void forward(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out) = 0;

  // Greedy shortcut: forward(), then ids[i] = argmax of requested logit row i (batch order;
  // lowest index on ties, as torch.argmax). This default reduces on the host; a GPU model
  // overrides it so that only the ids cross to the host, and may leave out.logits empty.
  virtual void forward_argmax(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out, std::vector<int32_t>& ids) {
    forward(kv, batch, out);
    const size_t V = static_cast<size_t>(out.vocab_size);
    ids.assign(V ? out.logits.size() / V : 0, 0);
    for (size_t r = 0; r < ids.size(); ++r) {
      const float* row = out.logits.data() + r * V;
      size_t best = 0;
      for (size_t j = 1; j < V; ++j)
        if (row[j] > row[best]) best = j;
      ids[r] = static_cast<int32_t>(best);
    }
  }

  // Pieces the drafters borrow: token embeddings and the final norm + LM head.
  // embed: out[i * hidden .. ] = embedding of ids[i].
  virtual void embed(const int32_t* ids, int n, float* out) const = 0;
  // lm_head: logits[i * vocab ..] = head(final_norm(hidden[i])) when apply_norm.
  virtual void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const = 0;
  // The host matrices behind embed() and the LM head, for drafters whose checkpoints carry
  // frozen copies of them (DeepSpec DFlash/DSpark store embed_tokens and lm_head): a drafter
  // whose copy is bit-identical uses the target's instead, so the pair keeps one copy in
  // memory and in the caches (same bits in, same kernels: the drafts do not change).
  // nullptr where the model has none on the host (GPU models). Valid while the model lives.
  virtual const WeightView* host_embedding() const { return nullptr; }
  virtual const WeightView* host_lm_head() const { return nullptr; }

  // Bytes of weights one decode step (batch 1) has to read: every matrix once plus the
  // norm vectors. Used by bench-model for the bandwidth roofline. 0 = unknown.
  virtual uint64_t decode_weight_bytes() const { return 0; }
};

// KV cache: per-slot key/value storage. Lengths can be cut back (speculation rollback).
class KVCache {
 public:
  virtual ~KVCache() = default;
  virtual int max_slots() const = 0;
  virtual int max_tokens() const = 0;
  virtual int length(int slot) const = 0;
  // Drops every position >= new_length of the slot. new_length <= length(slot).
  virtual void truncate(int slot, int new_length) = 0;
  void clear(int slot) { truncate(slot, 0); }
};

// The checks every model's forward() runs before it touches its cache, with the same
// one-line messages ("forward: entry E (slot S): ..."): slot in range and not repeated, the
// slot's capacity (capacity(slot) tokens), token ids inside the vocabulary, logit rows inside
// the entry, captured layers inside [-1, layers). Returns the batch's new rows and logit rows.
struct ForwardBatchSize {
  int64_t rows = 0, logit_rows = 0;
};
template <typename Capacity>
ForwardBatchSize check_forward_batch(const ForwardBatch& batch, const KVCache& kv, int64_t vocab, int layers,
                                     Capacity&& capacity);

struct LoadOptions {
  // Weight storage on the CPU: keep as in the file (mmap, no copy) or convert.
  // "auto" keeps BF16/F32 as they are and converts F16 to F32.
  std::string weight_dtype = "auto";
};

// Reads DIR/config.json, checks the architecture, maps the safetensors and checks every
// tensor against the config. Throws Error naming the file/field at fault.
std::unique_ptr<Model> load_model(const std::string& model_dir, const LoadOptions& opts = {});

[[noreturn]] void forward_entry_error(const ForwardBatch& batch, size_t entry, const std::string& why);
[[noreturn]] void forward_capture_error(int layer, int layers);

template <typename Capacity>
ForwardBatchSize check_forward_batch(const ForwardBatch& batch, const KVCache& kv, int64_t vocab, int layers,
                                     Capacity&& capacity) {
  // (Messages are built only on failure: this runs for every decoded token.)
  ForwardBatchSize size;
  for (size_t e = 0; e < batch.entries.size(); ++e) {
    const ForwardEntry& en = batch.entries[e];
    if (en.slot < 0 || en.slot >= kv.max_slots())
      forward_entry_error(batch, e, "slot out of range [0, " + std::to_string(kv.max_slots()) + ")");
    for (size_t o = 0; o < e; ++o)
      if (batch.entries[o].slot == en.slot) forward_entry_error(batch, e, "slot appears twice in one batch");
    const int64_t n = static_cast<int64_t>(en.tokens.size());
    const int64_t cap = capacity(en.slot);
    if (kv.length(en.slot) + n > cap)
      forward_entry_error(batch, e, "KV cache overflow: " + std::to_string(kv.length(en.slot)) + " + " + std::to_string(n) +
                                        " tokens > capacity " + std::to_string(cap));
    for (int32_t t : en.tokens)
      if (t < 0 || t >= vocab)
        forward_entry_error(batch, e, "token id " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(vocab) + ")");
    for (int r : en.logit_rows)
      if (r < 0 || r >= n) forward_entry_error(batch, e, "logit row " + std::to_string(r) + " outside [0, " + std::to_string(n) + ")");
    size.rows += n;
    size.logit_rows += static_cast<int64_t>(en.logit_rows.size());
  }
  for (int c : batch.capture_layers)
    if (c < -1 || c >= layers) forward_capture_error(c, layers);
  return size;
}

}  // namespace dsinfer
