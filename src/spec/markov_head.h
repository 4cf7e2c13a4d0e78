// dsinfer speculation floor: DSpark sequential (Markov) heads, drafters_spec.md §2.4.
//
// Data flow, per block position k inside one propose call: the previous token x_{k−1}
// (the anchor for k = 0, then the SAMPLED previous draft) is looked up in W1
// (markov_w1 [V, r]) giving e; the head turns e (and, for gated/rnn, the backbone output
// h_k after the final norm, and the rnn state) into a logit bias B_k = W2 · f(...) with
// W2 = markov_w2 [V, r]. The drafter adds B_k to the base logits U_k before sampling.
//   vanilla: B = W2 e
//   gated:   g = σ(gate_proj([h ; e]) + b),   B = W2 (g ⊙ e)
//   rnn:     [a | c | o] = joint_proj([s ; e ; h]) + b (three chunks of r),
//            s' = σ(a) ⊙ s + (1 − σ(a)) ⊙ tanh(c),   B = W2 tanh(o)   (uses the old s)
// The rnn state starts at zero for every propose call and is carried across positions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace dsinfer {

class WeightStore;

class MarkovHead {
 public:
  enum class Type { Vanilla, Gated, Rnn };
  // Reads <prefix>markov_head.* from the store and checks shapes against (vocab, rank,
  // hidden). prefix: "" (DeepSpec checkpoints) or "mtp.2." (DeepSeek-V4 DSpark).
  MarkovHead(WeightStore& store, Type type, int vocab, int rank, int hidden, const std::string& prefix = "");

  Type type() const { return type_; }
  int rank() const { return r_; }
  static const char* type_name(Type t);

  // e = W1[prev] (r floats).
  void embed(int32_t prev, float* e) const;
  // Zero state (r floats; unused for vanilla/gated).
  // f(prev, h, state) [rank]: the vector W2 multiplies; updates the rnn state.
  void features(int32_t prev, const float* h, std::vector<float>& state, float* f, float* e_out) const;
  void reset(std::vector<float>& state) const { state.assign(static_cast<size_t>(r_), 0.0f); }
  // bias[V] for the position whose previous token is `prev` and backbone output `h` [H];
  // advances `state` for the rnn head. `e_out` (optional, r floats) receives W1[prev].
  void bias(int32_t prev, const float* h, std::vector<float>& state, float* bias_out, float* e_out = nullptr) const;
  // The same for m positions of different sequences at once (one batched drafter pass):
  // row i uses prev[i], h[i * H ..], *states[i]; bias_out [m, V], e_out [m, rank] (or null).
  // Row i's bits equal bias() on that row alone (the W2 product is one batch-invariant
  // matmul over the m feature rows).
  // f_out (optional, [m, rank]) receives the vectors W2 multiplied (for the rows of W2
  // outside a restricted output, see below).
  void bias_rows(int m, const int32_t* prev, const float* h, std::vector<float>* const* states, float* bias_out,
                 float* e_out, float* f_out = nullptr) const;

  // Keeps only W2 rows `ids` (a reduced draft vocabulary, spec/draft_vocab.h): the bias then
  // has ids.size() entries per position, entry i for token ids[i]. W1 (indexed by the
  // previous token, any id) is untouched. Call once, before any bias.
  void restrict_output(const std::vector<int32_t>& ids);
  // Entries of one position's bias: the vocabulary, or the restricted ids.
  int bias_size() const { return static_cast<int>(w2_.rows); }
  // W2 over the whole vocabulary, whatever restrict_output kept.
  const WeightView& w2_full() const { return w2_full_; }

 private:
  Type type_;
  int V_, r_, H_;
  WeightView w1_{}, w2_{}, w2_full_{}, gate_{}, joint_{};
  std::vector<uint8_t> w2_rows_;  // restrict_output's copy of the kept W2 rows
  std::vector<float> gate_bias_, joint_bias_;
};

}  // namespace dsinfer
