// dsinfer model floor: the DeepSeek-V4 MoE block (spec §3.8).
//
// Data flow over T rows g [T, D] (the normed collapsed stream) and their token ids:
//   router logits λ = W_gate·g; scores s = sqrt(softplus(λ)) (or σ(λ));
//   experts: hash layers take tid2eid[token]; learned layers take the top-K of
//   s + e_score_correction_bias (ties → lower expert id); weights w = s[idx] / (Σ + 1e-20)
//   × routed_scaling_factor; expert e: down(silu(min(gate·g, L)) ⊙ clamp(up·g, −L, L));
//   out = Σ_k w_k expert_k(g) (summed in ascending expert id, as transformers'
//   index_add_ loop does) + the shared expert (same clamped SwiGLU).
// Each expert runs one matmul over exactly the rows routed to it; the matmul kernels are
// batch-invariant, so a row's result never depends on which other rows chose that expert.
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek_v4_weights.h"
#include "model/tensor_parallel.h"

namespace dsinfer {

// One expert-parallel rank's part (model/tensor_parallel.h): only experts [expert_begin,
// expert_end) run here, the routed sums of every rank are added by reduce (in place, rank
// order), and the shared expert then joins on every rank. Routing runs whole on each rank.
struct V4MoeShare {
  int expert_begin = 0, expert_end = 0;
  const RankReduce* reduce = nullptr;
};

void v4_moe(const V4LayerWeights& L, const DeepseekV4Config& cfg, const float* g, const int32_t* tokens, int64_t T,
            float* out, const V4MoeShare* share = nullptr);

}  // namespace dsinfer
