// dsinfer model floor: dense KV cache (see kv_cache.h). Bounds are checked here with
// dsinfer::Error so a bad slot or length from a caller never becomes a wild write; the
// per-token checks build their message only when they fail.
#include "model/kv_cache.h"

#include <string>

#include "core/error.h"

namespace dsinfer {

DenseKVCache::DenseKVCache(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_tokens, DType dtype)
    : n_layers_(n_layers), n_kv_heads_(n_kv_heads), head_dim_(head_dim), max_slots_(max_slots), max_tokens_(max_tokens),
      dtype_(dtype) {
  check(dtype == DType::F32 || dtype == DType::BF16,
        std::string("KV cache: element type ") + dtype_name(dtype) + " is not F32 or BF16");
  check(max_slots >= 1, "KV cache: max_slots must be >= 1 (got " + std::to_string(max_slots) + ")");
  check(max_tokens >= 1, "KV cache: max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
  const long double total = static_cast<long double>(n_layers) * max_slots * n_kv_heads * max_tokens * head_dim;
  const size_t esize = dtype_size(dtype);
  check(total * esize * 2 < static_cast<long double>(1ull << 46),
        "KV cache: " + std::to_string(max_slots) + " slots x " + std::to_string(max_tokens) + " tokens is too large");
  const size_t bytes = static_cast<size_t>(total) * esize;
  // new std::byte[n] (default-initialised): no zero fill, pages are committed on first write.
  k_.reset(new std::byte[bytes]);
  v_.reset(new std::byte[bytes]);
  len_.assign(max_slots, 0);
}

void DenseKVCache::check_slot(int slot, const char* what) const {
  if (slot < 0 || slot >= max_slots_)
    throw Error(std::string("KV cache ") + what + ": slot " + std::to_string(slot) + " out of range [0, " + std::to_string(max_slots_) + ")");
}

void DenseKVCache::check_dtype(DType want) const {
  if (dtype_ != want)
    throw Error(std::string("KV cache: ") + dtype_name(want) + " access to a " + dtype_name(dtype_) + " cache");
}

int DenseKVCache::length(int slot) const {
  check_slot(slot, "length");
  return len_[slot];
}

void DenseKVCache::truncate(int slot, int new_length) {
  check_slot(slot, "truncate");
  if (new_length < 0 || new_length > len_[slot])
    throw Error("KV cache truncate: slot " + std::to_string(slot) + ": new length " + std::to_string(new_length) + " not in [0, " +
            std::to_string(len_[slot]) + "]");
  len_[slot] = new_length;
}

void DenseKVCache::set_length(int slot, int len) {
  check_slot(slot, "set_length");
  if (len < 0 || len > max_tokens_)
    throw Error("KV cache: slot " + std::to_string(slot) + " overflow: " + std::to_string(len) +
                                            " tokens > capacity " + std::to_string(max_tokens_));
  len_[slot] = len;
}

}  // namespace dsinfer
