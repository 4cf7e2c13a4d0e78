// dsinfer speculation floor: DSpark Markov heads (see markov_head.h for the formulas).
// Every product is a matmul over one row with the batch-invariant kernel, so the bias of a
// position depends only on its inputs, never on the thread count.
#include "spec/markov_head.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/weights.h"
#include "spec/draft_vocab.h"

namespace dsinfer {

namespace {
inline float sigmoidf(float x) { return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))); }
}  // namespace

const char* MarkovHead::type_name(Type t) {
  switch (t) {
    case Type::Vanilla: return "vanilla";
    case Type::Gated: return "gated";
    case Type::Rnn: return "rnn";
  }
  return "?";
}

MarkovHead::MarkovHead(WeightStore& store, Type type, int vocab, int rank, int hidden, const std::string& prefix)
    : type_(type), V_(vocab), r_(rank), H_(hidden) {
  const std::string p = prefix + "markov_head.";
  w1_ = store.matrix(p + "markov_w1.weight", V_, r_);
  w2_ = store.matrix(p + "markov_w2.weight", V_, r_);
  w2_full_ = w2_;
  if (type_ == Type::Gated) {
    gate_ = store.matrix(p + "gate_proj.weight", r_, int64_t{H_} + r_);
    gate_bias_ = store.vector_f32(p + "gate_proj.bias", r_);
  } else if (type_ == Type::Rnn) {
    joint_ = store.matrix(p + "joint_proj.weight", int64_t{3} * r_, int64_t{2} * r_ + H_);
    joint_bias_ = store.vector_f32(p + "joint_proj.bias", int64_t{3} * r_);
  }
}

void MarkovHead::embed(int32_t prev, float* e) const {
  if (prev < 0 || prev >= V_)
    throw Error("markov head: previous token " + std::to_string(prev) + " outside the vocabulary [0, " + std::to_string(V_) + ")");
  weight_row_to_f32(w1_, prev, e);
}

void MarkovHead::features(int32_t prev, const float* h, std::vector<float>& state, float* f, float* e_out) const {
  std::vector<float> e(r_);
  embed(prev, e.data());
  if (e_out) std::memcpy(e_out, e.data(), sizeof(float) * r_);
  switch (type_) {
    case Type::Vanilla:
      std::memcpy(f, e.data(), sizeof(float) * r_);
      break;
    case Type::Gated: {
      std::vector<float> z(static_cast<size_t>(H_) + r_), g(r_);
      std::memcpy(z.data(), h, sizeof(float) * H_);
      std::memcpy(z.data() + H_, e.data(), sizeof(float) * r_);
      matmul(z.data(), 1, gate_, g.data());
      for (int j = 0; j < r_; ++j) f[j] = sigmoidf(g[j] + gate_bias_[j]) * e[j];
      break;
    }
    case Type::Rnn: {
      if (static_cast<int>(state.size()) != r_) reset(state);
      std::vector<float> z(static_cast<size_t>(2) * r_ + H_), y(static_cast<size_t>(3) * r_);
      std::memcpy(z.data(), state.data(), sizeof(float) * r_);
      std::memcpy(z.data() + r_, e.data(), sizeof(float) * r_);
      std::memcpy(z.data() + 2 * r_, h, sizeof(float) * H_);
      matmul(z.data(), 1, joint_, y.data());
      for (int j = 0; j < 3 * r_; ++j) y[j] += joint_bias_[j];
      for (int j = 0; j < r_; ++j) {
        const float a = sigmoidf(y[j]);
        const float cand = std::tanh(y[r_ + j]);
        f[j] = std::tanh(y[2 * r_ + j]);
        state[j] = a * state[j] + (1.0f - a) * cand;
      }
      break;
    }
  }
}

void MarkovHead::restrict_output(const std::vector<int32_t>& ids) {
  if (!w2_rows_.empty()) throw Error("markov head: output rows restricted twice");
  w2_ = gather_rows(w2_, ids, w2_rows_);
}

void MarkovHead::bias(int32_t prev, const float* h, std::vector<float>& state, float* bias_out, float* e_out) const {
  std::vector<float>* states[1] = {&state};
  bias_rows(1, &prev, h, states, bias_out, e_out);
}

void MarkovHead::bias_rows(int m, const int32_t* prev, const float* h, std::vector<float>* const* states,
                           float* bias_out, float* e_out, float* f_out) const {
  if (m <= 0) return;
  std::vector<float> f_own;
  if (!f_out) f_own.resize(static_cast<size_t>(m) * r_);
  float* f = f_out ? f_out : f_own.data();
  for (int i = 0; i < m; ++i)
    features(prev[i], h + static_cast<size_t>(i) * H_, *states[i], f + static_cast<size_t>(i) * r_,
             e_out ? e_out + static_cast<size_t>(i) * r_ : nullptr);
  matmul(f, m, w2_, bias_out);
}

}  // namespace dsinfer
