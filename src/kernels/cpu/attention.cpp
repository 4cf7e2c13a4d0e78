// dsinfer kernels: causal GQA attention, scalar core and the (block, head) work split
// (see attention.h). Work items are (block, head) pairs; each item walks its block's
// queries in order with a per-thread scratch row for the scores.
#include "kernels/cpu/attention.h"

#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/softmax.h"

namespace dsinfer {

void attend_row_scalar(const float* q, const float* k, const float* v, int n_keys, int head_dim, float scale,
                       float* scores, float* out) {
  for (int j = 0; j < n_keys; ++j) {
    const float* kj = k + static_cast<int64_t>(j) * head_dim;
    float d = 0.0f;
    for (int i = 0; i < head_dim; ++i) d += q[i] * kj[i];
    scores[j] = d * scale;
  }
  const float sum = exp_shifted_sum_scalar(scores, scores, n_keys);
  for (int i = 0; i < head_dim; ++i) out[i] = 0.0f;
  for (int j = 0; j < n_keys; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * head_dim;
    const float p = scores[j];
    for (int i = 0; i < head_dim; ++i) out[i] += p * vj[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < head_dim; ++i) out[i] *= inv;
}

void attention_causal(const AttentionBlock* blocks, int n_blocks, int n_heads, int n_kv_heads, int head_dim,
                      float scale, ThreadPool* pool) {
  if (!pool) pool = &ThreadPool::global();
  const bool avx2 = isa_level() >= IsaLevel::Avx2;
  const int group = n_heads / n_kv_heads;
  const size_t items = static_cast<size_t>(n_blocks) * static_cast<size_t>(n_heads);
  pool->parallel_for(items, [&](size_t begin, size_t end) {
    // Grown, never shrunk: after warm-up no allocation happens per call.
    thread_local std::vector<float> scores;
    for (size_t it = begin; it < end; ++it) {
      const AttentionBlock& b = blocks[it / n_heads];
      const int h = static_cast<int>(it % n_heads);
      const int g = h / group;
      const size_t need = static_cast<size_t>(b.start_pos + b.n_q);
      if (scores.size() < need) scores.resize(need);
      const float* kg = b.k + g * b.kv_head_stride;
      const float* vg = b.v + g * b.kv_head_stride;
      for (int i = 0; i < b.n_q; ++i) {
        const float* q = b.q + i * b.q_stride + static_cast<int64_t>(h) * head_dim;
        float* o = b.out + i * b.out_stride + static_cast<int64_t>(h) * head_dim;
        const int n_keys = b.start_pos + i + 1;
        if (avx2) attend_row_avx2(q, kg, vg, n_keys, head_dim, scale, scores.data(), o);
        else attend_row_scalar(q, kg, vg, n_keys, head_dim, scale, scores.data(), o);
      }
    }
  });
}

}  // namespace dsinfer
