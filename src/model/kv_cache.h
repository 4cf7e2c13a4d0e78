// dsinfer model floor: the dense per-slot KV cache (F32).
//
// Layout: for every layer and slot, K and V are each [n_kv_heads][max_tokens][head_dim],
// so one KV head's keys are contiguous in position order, which is the order attention
// reads them in. Memory is reserved up front but left untouched (no zero fill), so the
// OS commits pages only as positions are written. A later issue replaces this with the
// paged block pool; the KVCache interface stays.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace dsinfer {

class DenseKVCache : public KVCache {
 public:
  DenseKVCache(int n_layers, int n_kv_heads, int head_dim, int max_slots, int max_tokens);

  int max_slots() const override { return max_slots_; }
  int max_tokens() const override { return max_tokens_; }
  int length(int slot) const override;
  void truncate(int slot, int new_length) override;

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  // Floats between consecutive KV heads of one (layer, slot).
  int64_t head_stride() const { return static_cast<int64_t>(max_tokens_) * head_dim_; }
  float* k(int layer, int slot) { return k_.get() + offset(layer, slot); }
  float* v(int layer, int slot) { return v_.get() + offset(layer, slot); }
  // Called by the model once every layer has written the new positions.
  void set_length(int slot, int len);

 private:
  int64_t offset(int layer, int slot) const {
    return (static_cast<int64_t>(layer) * max_slots_ + slot) * n_kv_heads_ * head_stride();
  }
  void check_slot(int slot, const char* what) const;

  int n_layers_, n_kv_heads_, head_dim_, max_slots_, max_tokens_;
  std::unique_ptr<float[]> k_, v_;
  std::vector<int> len_;
};

}  // namespace dsinfer
