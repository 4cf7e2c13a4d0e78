// dsinfer model floor: DeepSeek-V4 decoding state (see deepseek_v4_state.h). The class
// owns storage, lengths and the retention rule; what the rows mean is the forward's
// business (deepseek_v4_attention.cpp), which is why truncate() only checks that the rows a
// continuation needs are still held and moves the length.
#include "model/deepseek_v4_state.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsinfer {

V4State::V4State(const DeepseekV4Config& cfg, int max_slots, int max_tokens)
    : cfg_(cfg), n_layers_(cfg.layers), max_slots_(max_slots), max_tokens_(max_tokens) {
  check(max_slots >= 1, "KV cache: max_slots must be >= 1 (got " + std::to_string(max_slots) + ")");
  check(max_tokens >= 1, "KV cache: max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
  ls_.resize(static_cast<size_t>(n_layers_) * max_slots);
  len_.assign(max_slots, 0);
}

void V4State::check_slot(int slot, const char* what) const {
  if (slot < 0 || slot >= max_slots_)
    throw Error(std::string("KV cache ") + what + ": slot " + std::to_string(slot) + " out of range [0, " +
                std::to_string(max_slots_) + ")");
}

int V4State::length(int slot) const {
  check_slot(slot, "length");
  return len_[slot];
}

void V4State::PositionRows::drop_before(int p) {
  if (width == 0 || p <= first) return;
  const size_t drop = static_cast<size_t>(p - first) * width;
  if (drop > data.size() || 2 * drop < data.size()) return;  // keep until it frees half
  data.erase(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(drop));
  first = p;
}

int V4State::keep_kv_from(int len) const { return std::max(0, len - kMaxRollback - (cfg_.window - 1)); }

int V4State::keep_raw_from(int len, int layer) const {
  const int m = cfg_.compress_rate(layer);
  if (m == 0) return len;
  const int lowest = std::max(0, len - kMaxRollback);  // the shortest length a rollback may leave
  const int w = lowest / m;                           // next window to close from there
  const int back = cfg_.attn[layer] == V4Attn::CSA ? 1 : 0;  // CSA also pools window w − 1
  return std::max(0, (w - back) * m);
}

void V4State::truncate(int slot, int new_length) {
  check_slot(slot, "truncate");
  if (new_length < 0 || new_length > len_[slot])
    throw Error("KV cache truncate: slot " + std::to_string(slot) + ": new length " + std::to_string(new_length) +
                " not in [0, " + std::to_string(len_[slot]) + "]");
  if (new_length == 0) {
    for (int l = 0; l < n_layers_; ++l) {
      LayerSlot& s = at(l, slot);
      s.kv.reset();
      s.comp_raw.reset();
      s.idx_raw.reset();
    }
  } else {
    // Every row a continuation from new_length reads must still be held.
    for (int l = 0; l < n_layers_; ++l) {
      LayerSlot& s = at(l, slot);
      const bool ok = s.kv.first <= std::max(0, new_length - (cfg_.window - 1)) &&
                      (cfg_.compress_rate(l) == 0 ||
                       (s.comp_raw.first <= keep_raw_from(new_length + kMaxRollback, l) &&
                        (cfg_.attn[l] != V4Attn::CSA || s.idx_raw.first <= keep_raw_from(new_length + kMaxRollback, l))));
      if (!ok)
        throw Error("KV cache truncate: slot " + std::to_string(slot) + ": rolling back from " + std::to_string(len_[slot]) +
                    " to " + std::to_string(new_length) + " tokens is deeper than the " + std::to_string(kMaxRollback) +
                    " tokens a DeepSeek-V4 state keeps (clear the slot and prefill instead)");
    }
  }
  len_[slot] = new_length;
}

void V4State::set_length(int slot, int len) {
  check_slot(slot, "set_length");
  if (len < 0 || len > max_tokens_)
    throw Error("KV cache: slot " + std::to_string(slot) + " overflow: " + std::to_string(len) + " tokens > capacity " +
                std::to_string(max_tokens_));
  len_[slot] = len;
  for (int l = 0; l < n_layers_; ++l) {
    LayerSlot& s = at(l, slot);
    s.kv.drop_before(keep_kv_from(len));
    if (cfg_.compress_rate(l) == 0) continue;
    s.comp_raw.drop_before(keep_raw_from(len, l));
    s.idx_raw.drop_before(keep_raw_from(len, l));
  }
}

uint64_t V4State::bytes_used(int slot) const {
  check_slot(slot, "bytes_used");
  uint64_t n = 0;
  for (int l = 0; l < n_layers_; ++l) {
    const LayerSlot& s = ls_[static_cast<size_t>(l) * max_slots_ + slot];
    n += s.kv.data.capacity() + s.comp_raw.data.capacity() + s.comp_entry.capacity() + s.idx_raw.data.capacity() +
         s.idx_entry.capacity();
  }
  return n * sizeof(float);
}

uint64_t V4State::bytes_per_token(const DeepseekV4Config& c) {
  double floats = 0;
  for (int l = 0; l < c.layers; ++l) {
    if (c.attn[l] == V4Attn::HCA) floats += static_cast<double>(c.head_dim) / c.rate_hca;
    if (c.attn[l] == V4Attn::CSA) floats += static_cast<double>(c.head_dim + c.idx_head_dim) / c.rate_csa;
  }
  return static_cast<uint64_t>(floats * sizeof(float) + 0.999);
}

uint64_t V4State::bytes_bounded(const DeepseekV4Config& c) {
  // Worst case: drop_before frees in halves (2x the kept rows) and the vector's capacity
  // may have doubled past that (another 2x).
  uint64_t floats = 0;
  for (int l = 0; l < c.layers; ++l) {
    floats += 4ull * (c.window - 1 + kMaxRollback) * c.head_dim;
    const int m = c.compress_rate(l);
    if (c.attn[l] == V4Attn::HCA) floats += 4ull * (m + kMaxRollback) * 2 * c.head_dim;
    if (c.attn[l] == V4Attn::CSA) floats += 4ull * (2 * m + kMaxRollback) * (4ull * c.head_dim + 4ull * c.idx_head_dim);
  }
  return floats * sizeof(float);
}

}  // namespace dsinfer
