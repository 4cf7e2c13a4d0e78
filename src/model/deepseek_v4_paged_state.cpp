// dsinfer model floor: the DeepSeek-V4 state behind the batched engine's paged KV
// interface (see deepseek_v4_paged_state.h).
#include "model/deepseek_v4_paged_state.h"

#include <string>

#include "core/error.h"

namespace dsinfer {

V4PagedState::V4PagedState(const DeepseekV4Config& cfg, int block_size, int64_t num_blocks, int max_slots, int max_tokens)
    : BlockKVCache("DeepSeek-V4 paged state", block_size, num_blocks, max_slots, max_tokens),
      state_(cfg, max_slots, max_tokens) {}

void V4PagedState::sync(const ForwardBatch& batch) {
  for (const ForwardEntry& en : batch.entries) {
    const int table = length(en.slot), held = state_.length(en.slot);
    if (held > table) state_.truncate(en.slot, table);
    else if (held < table)
      throw Error("DeepSeek-V4 paged state: slot " + std::to_string(en.slot) + " is bound at " + std::to_string(table) +
                  " tokens but its state holds " + std::to_string(held) +
                  " (a V4 state cannot be shared or restored by block: no prefix cache)");
  }
}

void V4PagedState::copy_block(int32_t src, int32_t dst, int n_tokens) {
  check_copy(src, dst, n_tokens);
  throw Error("DeepSeek-V4 paged state: block " + std::to_string(src) + " -> " + std::to_string(dst) +
              ": the state is kept per sequence, blocks cannot be copied (prefix sharing and compaction are off)");
}

void V4PagedState::on_bind(int slot, std::span<const int32_t> blocks) {
  // An unbind ends the slot's sequence (finished, cancelled or preempted): its rows go now,
  // and the next sequence bound there starts from an empty state.
  if (blocks.empty()) state_.truncate(slot, 0);
}

}  // namespace dsinfer
