// dsinfer model floor: a model's per-slot decoding state behind the batched engine's paged
// KV interface (see slot_state_paged_cache.h).
#include "model/slot_state_paged_cache.h"

#include <string>

#include "core/error.h"

namespace dsinfer {

SlotStatePagedCache::SlotStatePagedCache(std::unique_ptr<KVCache> state, int block_size, int64_t num_blocks)
    : BlockKVCache("paged decoding state", block_size, num_blocks, state ? state->max_slots() : 0,
                   state ? state->max_tokens() : 0),
      state_(std::move(state)) {}

ForwardBatchSize SlotStatePagedCache::begin_forward(const ForwardBatch& batch, int64_t vocab, int layers) {
  const ForwardBatchSize size = check_forward_batch(batch, *this, vocab, layers, [&](int s) { return int64_t(capacity(s)); });
  for (const ForwardEntry& en : batch.entries) {
    const int table = length(en.slot), held = state_->length(en.slot);
    if (held > table) state_->truncate(en.slot, table);
    else if (held < table)
      throw Error("paged decoding state: slot " + std::to_string(en.slot) + " is bound at " + std::to_string(table) +
                  " tokens but its state holds " + std::to_string(held) +
                  " (this model's state cannot be shared or restored by block: no prefix cache)");
  }
  return size;
}

void SlotStatePagedCache::copy_block(int32_t src, int32_t dst, int n_tokens) {
  check_copy(src, dst, n_tokens);
  throw Error("paged decoding state: block " + std::to_string(src) + " -> " + std::to_string(dst) +
              ": the state is kept per sequence, blocks cannot be copied (prefix sharing and compaction are off)");
}

void SlotStatePagedCache::on_bind(int slot, std::span<const int32_t> blocks) {
  // An unbind ends the slot's sequence (finished, cancelled or preempted): its rows go now,
  // and the next sequence bound there starts from an empty state.
  if (blocks.empty()) state_->truncate(slot, 0);
}

}  // namespace dsinfer
