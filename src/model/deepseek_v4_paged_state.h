// dsinfer model floor: a DeepSeek-V4 model's decoding state as the batched engine's paged
// KV storage (Model::make_paged_kv_cache), so LLMEngine, bench-engine and serve run V4
// targets with the same scheduling, preemption and speculation as Qwen3 ones.
//
// Data flow: a V4 state is not a list of per-position K/V rows that blocks could hold or
// share (sliding-window rows, compressor buffers, compressed entries and indexer keys per
// sequence: deepseek_v4_state.h), so this storage keeps one V4State slot per engine slot
// and the engine's blocks only account for its memory (the model reports
// Model::PagedStateShape::prefix_sharing = false; the engine's pool then keeps no prefix
// cache and makes no copy-on-write). The engine's table length is the truth: before a
// forward, sync() cuts each slot's V4 state back to it (a speculative rollback is the
// engine truncating the table; V4State::truncate is exact), and an unbind (request
// finished or preempted) clears the slot's state. A table longer than the state it
// describes is an Error, never a silent continuation from someone else's rows.
#pragma once
#include "model/block_kv_cache.h"
#include "model/deepseek_v4_state.h"

namespace dsinfer {

class V4PagedState final : public BlockKVCache {
 public:
  V4PagedState(const DeepseekV4Config& cfg, int block_size, int64_t num_blocks, int max_slots, int max_tokens);

  V4State& state() { return state_; }
  // Before a forward over these entries' slots: each slot's V4 state cut back to the
  // table's length (Error when the state holds fewer positions than the table says).
  void sync(const ForwardBatch& batch);
  // Blocks hold no state of their own: the engine copies blocks only for prefix sharing and
  // compaction, which a V4 pool never does; a call is a caller bug (Error).
  void copy_block(int32_t src, int32_t dst, int n_tokens) override;

 protected:
  void on_bind(int slot, std::span<const int32_t> blocks) override;

 private:
  V4State state_;
};

}  // namespace dsinfer
