// dsinfer model floor: DeepSeek-V4 decoding state, the KVCache of a V4 model.
//
// What a V4 layer needs from the past (spec §4): the single shared K=V row of every
// position in its sliding window; for CSA/HCA layers the compressed entries c_w of every
// complete window; for CSA layers also the indexer's compressed keys. transformers keeps
// these as buffers (raw rows of the unfinished window), an overlap (the previous window's
// Ca halves) and append-only entry lists, and has no way to roll them back.
//
// Here the state is kept as per-position rows plus derived entries:
//   kv[p]            post-norm, post-RoPE K=V row of position p (width d);
//   comp_raw[p]      the compressor's raw projections C_p | Z_p (Z without position_bias),
//                    width 2·cw (cw = d for HCA, 2d for CSA);
//   comp_entry[w]    compressed entry w (post-norm, post-RoPE), valid for w < ⌊len/m⌋;
//   idx_raw/idx_entry the same for the CSA indexer at width d_I.
// The transformers buffer and overlap are never stored: they are exactly the raw rows of
// the current and previous window, which the forward reads from comp_raw when a window
// closes. So the state after n tokens is a pure function of rows < n, and
// truncate(slot, n') is exact by construction: it only moves the length; entries ≥ ⌊n'/m⌋
// are recomputed, bit for bit, from the same raw rows when their windows close again.
// Memory is bounded except for the entries (the long-range memory itself): after each
// forward, rows no longer reachable are dropped — window rows older than
// len − (W − 1) − kMaxRollback and raw rows before the window that would close next after
// a rollback of kMaxRollback tokens. A deeper truncate (other than to 0) throws Error.
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek_v4_config.h"
#include "model/model.h"

namespace dsinfer {

class V4State : public KVCache {
 public:
  V4State(const DeepseekV4Config& cfg, int max_slots, int max_tokens);
  const DeepseekV4Config& config() const { return cfg_; }

  int max_slots() const override { return max_slots_; }
  int max_tokens() const override { return max_tokens_; }
  int length(int slot) const override;
  void truncate(int slot, int new_length) override;

  // Deepest rollback truncate() guarantees (tokens); drafts per round are far fewer.
  static constexpr int kMaxRollback = 256;

  // Rows of consecutive positions [first, first + rows) of one width.
  struct PositionRows {
    std::vector<float> data;
    int first = 0, width = 0;
    float* row(int p) { return data.data() + static_cast<int64_t>(p - first) * width; }
    const float* row(int p) const { return data.data() + static_cast<int64_t>(p - first) * width; }
    // Makes rows up to position end − 1 addressable.
    void ensure(int end, int w) {
      width = w;
      const size_t need = static_cast<size_t>(end - first) * w;
      if (data.size() < need) data.resize(need);
    }
    // Forgets rows before p (amortised: only when that frees at least half the storage).
    void drop_before(int p);
    void reset() {
      data.clear();
      first = 0;
    }
  };
  struct LayerSlot {
    PositionRows kv;                // width d
    PositionRows comp_raw;          // width 2·cw
    std::vector<float> comp_entry;  // [windows, d]
    PositionRows idx_raw;           // width 4·d_I
    std::vector<float> idx_entry;   // [windows, d_I]
  };
  LayerSlot& at(int layer, int slot) { return ls_[static_cast<size_t>(layer) * max_slots_ + slot]; }
  int n_layers() const { return n_layers_; }
  // Called by the model after every layer has written the new positions; drops rows that
  // no rollback of up to kMaxRollback tokens can reach any more.
  void set_length(int slot, int len);
  // Floats currently held for one slot (for memory reports).
  uint64_t bytes_used(int slot) const;
  // Bytes per token of context the state needs once the bounded rows are full: the
  // compressed entries (planning at load time), and the bounded part per sequence.
  static uint64_t bytes_per_token(const DeepseekV4Config& cfg);
  static uint64_t bytes_bounded(const DeepseekV4Config& cfg);

 private:
  void check_slot(int slot, const char* what) const;
  // First position each kind of row must keep when the sequence has `len` tokens (and may
  // still be truncated to len − kMaxRollback): window rows, raw rows of a compressor.
  int keep_kv_from(int len) const;
  int keep_raw_from(int len, int layer) const;
  DeepseekV4Config cfg_;
  int n_layers_, max_slots_, max_tokens_;
  std::vector<LayerSlot> ls_;
  std::vector<int> len_;
};

}  // namespace dsinfer
