// dsinfer speculation floor: the DSpark confidence head, drafters_spec.md §2.5.
//
// Data flow: for block position k, the backbone output h_k (after the final norm) and,
// when the head was trained with the Markov feature, e = W1[x_{k−1}] (the Markov head's
// embedding of the previous SAMPLED token, the anchor for k = 0) give the logit
// z_k = w · [h_k ; e] + b  (w = confidence_head.proj.weight [1, H (+ r)], b = .bias [1]).
// c_k = sigmoid(z_k) is the probability that draft k survives verification given that
// drafts 0..k−1 did.
#pragma once
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace dsinfer {

class WeightStore;

class ConfidenceHead {
 public:
  // markov_rank > 0: the head takes [h ; e] (proj [1, H + r]); 0: h only (proj [1, H]).
  // prefix: "" (DeepSpec) or "mtp.2." (DeepSeek-V4 DSpark, whose proj has no bias: b = 0
  // when optional_bias and the checkpoint has none).
  ConfidenceHead(WeightStore& store, int hidden, int markov_rank, const std::string& prefix = "",
                 bool optional_bias = false);
  bool with_markov() const { return r_ > 0; }
  // z = w·[h ; e] + b. e is ignored (may be null) without the Markov feature.
  float logit(const float* h, const float* e) const;
  static float sigmoid(float z);

 private:
  int H_, r_;
  WeightView w_{};
  float b_ = 0.0f;
};

}  // namespace dsinfer
