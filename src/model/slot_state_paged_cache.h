// dsinfer model floor: the batched engine's paged KV interface over a model's own per-slot
// decoding state, for models whose state is not a list of per-position K/V rows that blocks
// could hold or share (DeepSeek-V4: sliding-window rows, compressor buffers, compressed
// entries and indexer keys per sequence, on the CPU (V4State) or the GPU (V4CudaState)).
// With it LLMEngine, bench-engine and serve run such models with the same scheduling,
// preemption and speculation as Qwen3 ones.
//
// Data flow: the model's make_paged_kv_cache wraps the state its make_kv_cache makes (one
// state slot per engine slot); the engine's blocks only account for the state's memory (the
// model reports Model::PagedStateShape::prefix_sharing = false, so the engine's pool keeps
// no prefix cache and makes no copy-on-write). The engine's table length is the truth:
// before a forward, begin_forward() cuts each slot's state back to it (a speculative rollback is the
// engine truncating the table; the state's truncate is exact), and an unbind (request
// finished or preempted) clears the slot's state. A table longer than the state it
// describes is an Error, never a silent continuation from someone else's rows. The
// model's forward unwraps the state (state()), runs on it, then sets the table lengths.
#pragma once
#include <memory>

#include "model/block_kv_cache.h"

namespace dsinfer {

class SlotStatePagedCache final : public BlockKVCache {
 public:
  // `state` holds max_slots slots of up to max_tokens positions (the model's make_kv_cache).
  SlotStatePagedCache(std::unique_ptr<KVCache> state, int block_size, int64_t num_blocks);

  KVCache& state() { return *state_; }
  // What a model's forward calls first: the batch checked against the tables' lengths and
  // capacities (check_forward_batch's one-line errors), then each slot's state cut back to
  // its table's length (Error when the state holds fewer positions than the table says).
  ForwardBatchSize begin_forward(const ForwardBatch& batch, int64_t vocab, int layers);
  // Blocks hold no state of their own: the engine copies blocks only for prefix sharing and
  // compaction, which such a pool never does; a call is a caller bug (Error).
  void copy_block(int32_t src, int32_t dst, int n_tokens) override;

 protected:
  void on_bind(int slot, std::span<const int32_t> blocks) override;

 private:
  std::unique_ptr<KVCache> state_;
};

}  // namespace dsinfer
