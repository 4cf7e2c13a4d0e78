// dsinfer speculation floor: the DSpark confidence head (see confidence_head.h). The dot
// product is the batch-invariant matmul over one row, so z_k is thread-count independent.
#include "spec/confidence_head.h"

#include <cmath>
#include <cstring>

#include "model/weights.h"

namespace dsinfer {

ConfidenceHead::ConfidenceHead(WeightStore& store, int hidden, int markov_rank, const std::string& prefix,
                               bool optional_bias)
    : H_(hidden), r_(markov_rank) {
  w_ = store.matrix(prefix + "confidence_head.proj.weight", 1, int64_t{H_} + r_);
  const std::string b = prefix + "confidence_head.proj.bias";
  if (!optional_bias || store.has(b)) b_ = store.vector_f32(b, 1)[0];
}

float ConfidenceHead::logit(const float* h, const float* e) const {
  std::vector<float> z(static_cast<size_t>(H_) + r_);
  std::memcpy(z.data(), h, sizeof(float) * H_);
  if (r_ > 0) std::memcpy(z.data() + H_, e, sizeof(float) * r_);
  float y = 0.0f;
  matmul(z.data(), 1, w_, &y);
  return y + b_;
}

float ConfidenceHead::sigmoid(float z) { return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(z)))); }

}  // namespace dsinfer
