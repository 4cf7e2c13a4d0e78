// dsinfer model floor: paged KV cache storage on the host (see paged_kv_cache.h). Block ids
// and lengths are checked by BlockKVCache (model/block_kv_cache.cpp), copy_block's range
// here through its check_copy, so a bad table never becomes a wild write.
#include "model/paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"

namespace dsinfer {

PagedKVCache::PagedKVCache(int n_layers, int n_kv_heads, int head_dim, int block_size, int64_t num_blocks,
                           int max_slots, int max_tokens, DType dtype)
    : BlockKVCache("paged KV cache", block_size, num_blocks, max_slots, max_tokens),
      n_layers_(n_layers), n_kv_heads_(n_kv_heads), head_dim_(head_dim), dtype_(dtype) {
  check(dtype == DType::F32 || dtype == DType::BF16,
        std::string("paged KV cache: element type ") + dtype_name(dtype) + " is not F32 or BF16");
  check(n_layers >= 1 && n_kv_heads >= 1 && head_dim >= 1, "paged KV cache: empty layer geometry");
  block_stride_ = static_cast<int64_t>(n_kv_heads) * block_size * head_dim;
  const long double total = static_cast<long double>(n_layers) * num_blocks * block_stride_;
  const size_t esize = dtype_size(dtype);
  check(total * esize * 2 < static_cast<long double>(1ull << 46),
        "paged KV cache: " + std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + " tokens is too large");
  const size_t bytes = static_cast<size_t>(total) * esize;
  // new std::byte[n] (default-initialised): no zero fill, pages are committed on first write.
  k_.reset(new std::byte[bytes]);
  v_.reset(new std::byte[bytes]);
}

void PagedKVCache::prefault() {
  const size_t bytes = static_cast<size_t>(n_layers_) * static_cast<size_t>(num_blocks()) *
                       static_cast<size_t>(block_stride_) * dtype_size(dtype_);
  std::memset(k_.get(), 0, bytes);
  std::memset(v_.get(), 0, bytes);
}

void PagedKVCache::check_dtype(DType want) const {
  if (dtype_ != want)
    throw Error(std::string("paged KV cache: ") + dtype_name(want) + " access to a " + dtype_name(dtype_) + " cache");
}

void PagedKVCache::copy_block(int32_t src, int32_t dst, int n_tokens) {
  check_copy(src, dst, n_tokens);
  if (src == dst || n_tokens == 0) return;
  // In bytes: the copy does not depend on the element type.
  const int64_t es = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t hs = head_stride() * es, bstride = block_stride_ * es, D = head_dim_ * es;
  const int64_t layer_bytes = num_blocks() * bstride;
  for (int l = 0; l < n_layers_; ++l)
    for (std::byte* base : {k_.get() + l * layer_bytes, v_.get() + l * layer_bytes})
      for (int g = 0; g < n_kv_heads_; ++g)
        std::memcpy(base + dst * bstride + g * hs, base + src * bstride + g * hs, static_cast<size_t>(n_tokens * D));
}

}  // namespace dsinfer
