// dsinfer model floor: DeepSeek-V4 manifold-constrained hyper-connections (mHC).
//
// The residual of a V4 model is n_hc parallel streams per token, X [T, n_hc, D]. Around
// each sub-block (attention, MoE) one mHC site (spec §3.2):
//   hc_pre:  f = rms(flatten(X_t)); z = fn·f; pre = σ(z_pre·s0 + b) + eps;
//            post = 2σ(z_post·s1 + b); comb = Sinkhorn(softmax_rows(z_comb·s2 + b));
//            u_t = Σ_j pre_j X_t[j]            (the sub-block's input)
//   hc_post: X_t[k] ← post_k · y_t + Σ_j comb[j][k] · X_t[j]   (y = sub-block output)
// and before the head, hc_head collapses the streams with its own σ weights. All of it is
// F32 per row (the projection is one batch-invariant matmul over the rows), so a token's
// result depends on nothing else in the batch.
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek_v4_weights.h"

namespace dsinfer {

struct V4HcSite {
  const V4Linear* fn;
  const float* base;
  const float* scale;
};

struct V4HcParams {
  int n = 4;          // hc_mult
  int64_t D = 0;      // hidden
  int iters = 20;     // Sinkhorn iterations
  float hc_eps = 1e-6f, eps = 1e-6f;
};

// X [T, n, D] in; post [T, n], comb [T, n, n], u [T, D] out. scratch grows as needed.
void v4_hc_pre(const V4HcSite& site, const V4HcParams& p, const float* X, int64_t T, float* post, float* comb,
               float* u, std::vector<float>& scratch);
// X [T, n, D] updated in place with the sub-block output y [T, D].
void v4_hc_post(const V4HcParams& p, const float* post, const float* comb, const float* y, int64_t T, float* X);
// Final collapse: h [T, D] from X [T, n, D].
void v4_hc_head(const V4Linear& fn, const float* base, const float* scale, const V4HcParams& p, const float* X,
                int64_t T, float* h, std::vector<float>& scratch);

}  // namespace dsinfer
