// dsinfer model floor: the paged KV cache's slot bookkeeping, shared by every storage (see
// block_kv_cache.h). Every block id and length from a caller is checked with
// dsinfer::Error, so a bad table never becomes a wild write, on the host or on a device.
#include "model/block_kv_cache.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsinfer {

BlockKVCache::BlockKVCache(const char* name, int block_size, int64_t num_blocks, int max_slots, int max_tokens)
    : block_size_(block_size), num_blocks_(num_blocks), max_tokens_(max_tokens) {
  const std::string n(name);
  check(block_size >= 1, n + ": block_size must be >= 1 (got " + std::to_string(block_size) + ")");
  check(num_blocks >= 1, n + ": num_blocks must be >= 1 (got " + std::to_string(num_blocks) + ")");
  check(max_slots >= 1, n + ": max_slots must be >= 1 (got " + std::to_string(max_slots) + ")");
  check(max_tokens >= 1, n + ": max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
  slots_.resize(static_cast<size_t>(max_slots));
}

void BlockKVCache::check_slot(int slot, const char* what) const {
  if (slot < 0 || slot >= max_slots())
    throw Error(std::string("paged KV cache ") + what + ": slot " + std::to_string(slot) + " out of range [0, " +
                std::to_string(max_slots()) + ")");
}

int BlockKVCache::length(int slot) const {
  check_slot(slot, "length");
  return slots_[static_cast<size_t>(slot)].length;
}

void BlockKVCache::truncate(int slot, int new_length) {
  check_slot(slot, "truncate");
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (new_length < 0 || new_length > s.length)
    throw Error("paged KV cache truncate: slot " + std::to_string(slot) + ": new length " + std::to_string(new_length) +
                " not in [0, " + std::to_string(s.length) + "]");
  s.length = new_length;
}

void BlockKVCache::bind(int slot, std::span<const int32_t> blocks, int length) {
  check_slot(slot, "bind");
  for (int32_t b : blocks)
    if (b < 0 || b >= num_blocks_)
      throw Error("paged KV cache bind: slot " + std::to_string(slot) + ": block id " + std::to_string(b) +
                  " outside [0, " + std::to_string(num_blocks_) + ")");
  const int64_t cap = static_cast<int64_t>(blocks.size()) * block_size_;
  if (length < 0 || length > cap || length > max_tokens_)
    throw Error("paged KV cache bind: slot " + std::to_string(slot) + ": length " + std::to_string(length) +
                " not in [0, " + std::to_string(std::min<int64_t>(cap, max_tokens_)) + "]");
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.blocks.assign(blocks.begin(), blocks.end());
  s.length = length;
  on_bind(slot, blocks);
}

std::span<const int32_t> BlockKVCache::blocks(int slot) const {
  check_slot(slot, "blocks");
  return slots_[static_cast<size_t>(slot)].blocks;
}

int BlockKVCache::capacity(int slot) const {
  check_slot(slot, "capacity");
  const int64_t cap = static_cast<int64_t>(slots_[static_cast<size_t>(slot)].blocks.size()) * block_size_;
  return static_cast<int>(std::min<int64_t>(cap, max_tokens_));
}

void BlockKVCache::set_length(int slot, int len) {
  check_slot(slot, "set_length");
  if (len < 0 || len > capacity(slot))
    throw Error("paged KV cache: slot " + std::to_string(slot) + " overflow: " + std::to_string(len) +
                " tokens > capacity " + std::to_string(capacity(slot)));
  slots_[static_cast<size_t>(slot)].length = len;
}

void BlockKVCache::check_copy(int32_t src, int32_t dst, int n_tokens) const {
  if (src < 0 || src >= num_blocks_ || dst < 0 || dst >= num_blocks_ || n_tokens < 0 || n_tokens > block_size_)
    throw Error("paged KV cache copy_block: block " + std::to_string(src) + " -> " + std::to_string(dst) + " (" +
                std::to_string(n_tokens) + " tokens) out of range");
}

}  // namespace dsinfer
