// dsinfer model floor: paged KV cache storage (see paged_kv_cache.h). Every block id and
// length from a caller is checked with dsinfer::Error, so a bad table never becomes a wild
// write.
#include "model/paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"

namespace dsinfer {

PagedKVCache::PagedKVCache(int n_layers, int n_kv_heads, int head_dim, int block_size, int64_t num_blocks,
                           int max_slots, int max_tokens, DType dtype)
    : n_layers_(n_layers), n_kv_heads_(n_kv_heads), head_dim_(head_dim), block_size_(block_size),
      num_blocks_(num_blocks), max_tokens_(max_tokens), dtype_(dtype) {
  check(dtype == DType::F32 || dtype == DType::BF16,
        std::string("paged KV cache: element type ") + dtype_name(dtype) + " is not F32 or BF16");
  check(n_layers >= 1 && n_kv_heads >= 1 && head_dim >= 1, "paged KV cache: empty layer geometry");
  check(block_size >= 1, "paged KV cache: block_size must be >= 1 (got " + std::to_string(block_size) + ")");
  check(num_blocks >= 1, "paged KV cache: num_blocks must be >= 1 (got " + std::to_string(num_blocks) + ")");
  check(max_slots >= 1, "paged KV cache: max_slots must be >= 1 (got " + std::to_string(max_slots) + ")");
  check(max_tokens >= 1, "paged KV cache: max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
  block_stride_ = static_cast<int64_t>(n_kv_heads) * block_size * head_dim;
  const long double total = static_cast<long double>(n_layers) * num_blocks * block_stride_;
  const size_t esize = dtype_size(dtype);
  check(total * esize * 2 < static_cast<long double>(1ull << 46),
        "paged KV cache: " + std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + " tokens is too large");
  const size_t bytes = static_cast<size_t>(total) * esize;
  // new std::byte[n] (default-initialised): no zero fill, pages are committed on first write.
  k_.reset(new std::byte[bytes]);
  v_.reset(new std::byte[bytes]);
  slots_.resize(static_cast<size_t>(max_slots));
}

void PagedKVCache::check_slot(int slot, const char* what) const {
  if (slot < 0 || slot >= max_slots())
    throw Error(std::string("paged KV cache ") + what + ": slot " + std::to_string(slot) + " out of range [0, " +
                std::to_string(max_slots()) + ")");
}

void PagedKVCache::check_dtype(DType want) const {
  if (dtype_ != want)
    throw Error(std::string("paged KV cache: ") + dtype_name(want) + " access to a " + dtype_name(dtype_) + " cache");
}

int PagedKVCache::length(int slot) const {
  check_slot(slot, "length");
  return slots_[static_cast<size_t>(slot)].length;
}

void PagedKVCache::truncate(int slot, int new_length) {
  check_slot(slot, "truncate");
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (new_length < 0 || new_length > s.length)
    throw Error("paged KV cache truncate: slot " + std::to_string(slot) + ": new length " + std::to_string(new_length) +
                " not in [0, " + std::to_string(s.length) + "]");
  s.length = new_length;
}

void PagedKVCache::bind(int slot, std::span<const int32_t> blocks, int length) {
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
}

std::span<const int32_t> PagedKVCache::blocks(int slot) const {
  check_slot(slot, "blocks");
  return slots_[static_cast<size_t>(slot)].blocks;
}

int PagedKVCache::capacity(int slot) const {
  check_slot(slot, "capacity");
  const int64_t cap = static_cast<int64_t>(slots_[static_cast<size_t>(slot)].blocks.size()) * block_size_;
  return static_cast<int>(std::min<int64_t>(cap, max_tokens_));
}

void PagedKVCache::copy_block(int32_t src, int32_t dst, int n_tokens) {
  if (src < 0 || src >= num_blocks_ || dst < 0 || dst >= num_blocks_ || n_tokens < 0 || n_tokens > block_size_)
    throw Error("paged KV cache copy_block: block " + std::to_string(src) + " -> " + std::to_string(dst) + " (" +
                std::to_string(n_tokens) + " tokens) out of range");
  if (src == dst || n_tokens == 0) return;
  // In bytes: the copy does not depend on the element type.
  const int64_t es = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t hs = head_stride() * es, bstride = block_stride_ * es, D = head_dim_ * es;
  const int64_t layer_bytes = num_blocks_ * bstride;
  for (int l = 0; l < n_layers_; ++l)
    for (std::byte* base : {k_.get() + l * layer_bytes, v_.get() + l * layer_bytes})
      for (int g = 0; g < n_kv_heads_; ++g)
        std::memcpy(base + dst * bstride + g * hs, base + src * bstride + g * hs, static_cast<size_t>(n_tokens * D));
}

void PagedKVCache::set_length(int slot, int len) {
  check_slot(slot, "set_length");
  if (len < 0 || len > capacity(slot))
    throw Error("paged KV cache: slot " + std::to_string(slot) + " overflow: " + std::to_string(len) +
                " tokens > capacity " + std::to_string(capacity(slot)));
  slots_[static_cast<size_t>(slot)].length = len;
}

}  // namespace dsinfer
