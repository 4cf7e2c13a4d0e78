// dsinfer model floor: the dense per-slot KV cache (F32, or BF16 in bf16 matmul precision:
// Model::kv_dtype() chooses, the forward rounds K/V with kv_round_bf16 as it writes them).
//
// Layout: for every layer and slot, K and V are each [n_kv_heads][max_tokens][head_dim]
// elements of dtype(), so one KV head's keys are contiguous in position order, which is
// the order attention reads them in. Memory is reserved up front but left untouched (no zero fill), so the
// OS commits pages only as positions are written. A later issue replaces this with the
// paged block pool; the KVCache interface stays.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "model/model.h"

namespace dsinfer {

class DenseKVCache : public KVCache {
 public:
  // dtype: DType::F32 or DType::BF16 (else Error).
  DenseKVCache(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_tokens, DType dtype = DType::F32);

  int max_slots() const override { return max_slots_; }
  int max_tokens() const override { return max_tokens_; }
  int length(int slot) const override;
  void truncate(int slot, int new_length) override;

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  // Elements between consecutive KV heads of one (layer, slot).
  int64_t head_stride() const { return static_cast<int64_t>(max_tokens_) * head_dim_; }
  // K/V of (layer, slot): k()/v() for an F32 cache, k_bf16()/v_bf16() (BF16 bit patterns)
  // for a BF16 one; the accessor of the other type throws Error.
  float* k(int layer, int slot) { return elems<float>(k_.get(), layer, slot); }
  float* v(int layer, int slot) { return elems<float>(v_.get(), layer, slot); }
  uint16_t* k_bf16(int layer, int slot) { return elems<uint16_t>(k_.get(), layer, slot); }
  uint16_t* v_bf16(int layer, int slot) { return elems<uint16_t>(v_.get(), layer, slot); }
  // Called by the model once every layer has written the new positions.
  void set_length(int slot, int len);

 private:
  int64_t offset(int layer, int slot) const {
    return (static_cast<int64_t>(layer) * max_slots_ + slot) * n_kv_heads_ * head_stride();
  }
  void check_slot(int slot, const char* what) const;
  void check_dtype(DType want) const;
  template <class T>
  T* elems(std::byte* base, int layer, int slot) {
    check_dtype(sizeof(T) == 4 ? DType::F32 : DType::BF16);
    return reinterpret_cast<T*>(base) + offset(layer, slot);
  }

  int n_layers_, n_kv_heads_, head_dim_, max_slots_, max_tokens_;
  DType dtype_;
  std::unique_ptr<std::byte[]> k_, v_;
  std::vector<int> len_;
};

}  // namespace dsinfer
