// dsinfer model floor: DeepSeek-V4 MoE (see deepseek_v4_moe.h).
#include "model/deepseek_v4_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsinfer {

namespace {

// Clamped SwiGLU expert over `rows` rows of x [rows, D] → y [rows, D].
void swiglu_expert(const V4Expert& e, float limit, const float* x, int64_t rows, int64_t D, int64_t I, float* y,
                   std::vector<float>& gbuf, std::vector<float>& ubuf) {
  gbuf.resize(static_cast<size_t>(rows * I));
  ubuf.resize(static_cast<size_t>(rows * I));
  v4_matmul(x, rows, e.gate, gbuf.data());
  v4_matmul(x, rows, e.up, ubuf.data());
  for (int64_t i = 0; i < rows * I; ++i) {
    const float g = std::fmin(gbuf[i], limit);
    const float u = std::fmax(std::fmin(ubuf[i], limit), -limit);
    gbuf[i] = g / (1.0f + std::exp(-g)) * u;
  }
  v4_matmul(gbuf.data(), rows, e.down, y);
}

float score_of(float logit, bool sigmoid) {
  if (sigmoid) return 1.0f / (1.0f + std::exp(-logit));
  const float sp = logit > 20.0f ? logit : std::log1p(std::exp(logit));  // torch softplus, threshold 20
  return std::sqrt(sp);
}

}  // namespace

void v4_moe(const V4LayerWeights& L, const DeepseekV4Config& c, const float* g, const int32_t* tokens, int64_t T,
            float* out, const V4MoeShare* share) {
  const int64_t D = c.hidden, I = c.moe_inter;
  const int E = c.experts, K = c.top_k;
  const float limit = static_cast<float>(c.swiglu_limit);
  std::vector<float> logits(static_cast<size_t>(T * E));
  v4_matmul(g, T, L.router, logits.data());
  std::vector<int> idx(static_cast<size_t>(T * K));
  std::vector<float> wts(static_cast<size_t>(T * K));
  std::vector<float> s(E);
  std::vector<int> order(E);
  for (int64_t r = 0; r < T; ++r) {
    for (int e = 0; e < E; ++e) s[e] = score_of(logits[r * E + e], c.sigmoid_scores);
    int* ir = idx.data() + r * K;
    if (L.hash) {
      for (int k = 0; k < K; ++k) ir[k] = L.tid2eid[static_cast<size_t>(tokens[r]) * K + k];
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) {
        const float va = s[a] + L.score_bias[a], vb = s[b] + L.score_bias[b];
        return va > vb || (va == vb && a < b);
      });
      for (int k = 0; k < K; ++k) ir[k] = order[k];
    }
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += s[ir[k]];
    for (int k = 0; k < K; ++k) wts[r * K + k] = s[ir[k]] / (sum + 1e-20f) * static_cast<float>(c.routed_scale);
  }
  // Per expert: gather its rows, run it once, scatter weighted results to (row, k) slots.
  std::vector<float> contrib(static_cast<size_t>(T * K * D));
  std::vector<float> xb, yb, gb, ub;
  std::vector<int64_t> slots;
  for (int e = 0; e < E; ++e) {
    if (share && (e < share->expert_begin || e >= share->expert_end)) continue;  // another rank's (its slots stay 0)
    slots.clear();
    for (int64_t i = 0; i < T * K; ++i)
      if (idx[i] == e) slots.push_back(i);
    if (slots.empty()) continue;
    const int64_t n = static_cast<int64_t>(slots.size());
    xb.resize(static_cast<size_t>(n * D));
    yb.resize(static_cast<size_t>(n * D));
    for (int64_t j = 0; j < n; ++j) std::copy_n(g + (slots[j] / K) * D, D, xb.data() + j * D);
    swiglu_expert(L.experts[e], limit, xb.data(), n, D, I, yb.data(), gb, ub);
    for (int64_t j = 0; j < n; ++j) {
      const float w = wts[slots[j]];
      float* dst = contrib.data() + slots[j] * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = yb[j * D + d] * w;
    }
  }
  std::vector<float> shared(static_cast<size_t>(T * D));
  swiglu_expert(L.shared, limit, g, T, D, I, shared.data(), gb, ub);
  std::vector<int> ks(K);
  for (int64_t r = 0; r < T; ++r) {
    std::iota(ks.begin(), ks.end(), 0);
    const int* ir = idx.data() + r * K;
    std::stable_sort(ks.begin(), ks.end(), [&](int a, int b) { return ir[a] < ir[b]; });
    float* o = out + r * D;
    std::fill(o, o + D, 0.0f);
    for (int k : ks)
      for (int64_t d = 0; d < D; ++d) o[d] += contrib[(r * K + k) * D + d];
  }
  if (share && share->reduce) (*share->reduce)(out, T * D);
  for (int64_t i = 0; i < T * D; ++i) out[i] += shared[static_cast<size_t>(i)];
}

}  // namespace dsinfer
