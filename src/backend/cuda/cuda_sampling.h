// dsinfer CUDA backend: sampling and the lossless speculative verification rule on the GPU,
// so that a step with sampled requests brings back token ids, not vocabulary-wide rows.
//
// The host rule is spec/verify.h's verify_drafts over sampling/sampler.h's
// sampling_distribution and sample_from; these kernels compute the same decisions from
// the same uniform draws (the host pre-draws them from a copy of the request's Rng and then
// advances the Rng by the count verify_drafts would have used), so a request's tokens do not
// depend on where it was verified, up to the summation order of doubles (a different
// association of the same sums; a decision could flip only when a uniform falls within
// ~1e-15 of a boundary).
//
// Data flow (CudaQwen3Model::forward_verify, after the forward's LM head wrote logit rows
// and their argmax keys on the device):
//   1. row_dist (one block per sampled logit row): the row's distribution summarised as
//      RowDist {threshold key, max, 1/T, kept sum}: p_j = bf(e_j / kept) for key(j) >= thr,
//      0 otherwise, e_j = exp(l_j / T - max) in double. key(j) orders (logit, then lower id)
//      as the host's sort does; top-k's threshold is the k-th largest key (radix select on
//      counts), top-p's the key where the sorted cumulative mass first reaches top_p (radix
//      select on fixed-point masses, 2^-56 per unit: integer sums, so any order gives the
//      same bits, and the run is reproducible).
//   2. verify (one block per item): greedy items from the argmax keys; sampled items test
//      draft i with u_i < min(1, p_i(d_i) / max(q_i(d_i), 1e-8)), and at the first rejection
//      draw from the residual max(0, p - q) (p itself when its mass is <= 1e-8) with
//      u_{i+1}; with all drafts accepted, from p_n with u_n. p is recomputed from the logits
//      and the RowDist on the fly (no [rows, vocab] buffer); q rows are the drafter's
//      distributions, uploaded (nullptr: point masses on the drafts).
//   3. (accepted, next token) per item back to the host.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::cuda {

struct SampleParamsDev {
  float temperature = 0.0f;  // <= 0: greedy (row_dist skips the row)
  int top_k = 0;
  float top_p = 1.0f;
};

struct RowDist {
  unsigned long long thr = 0;  // keep key(j) >= thr
  double mx = 0.0, inv_t = 1.0, kept = 1.0;
};

struct VerifyItemDev {
  int greedy = 0;
  int n = 0;            // drafts
  int draft_off = 0;    // into drafts[]
  int q_off = -1;       // first q row (into q[]), -1: point masses on the drafts
  int u_off = 0;        // into uniforms[] (n + 1 of them; sampled items only)
  int row0 = 0;         // logit row of p_0 (rows row0 .. row0 + n), into logits / keys
  int dist0 = 0;        // RowDist of p_0 (sampled items only: dist0 .. dist0 + n)
};

// dist[i] for logit row rows[i] (params[i]) of logits [*, V] (row stride ld).
void row_dist(const float* logits, int64_t ld, int V, const int32_t* rows, const SampleParamsDev* params, int n_rows,
              RowDist* dist, cudaStream_t stream);

// result[2i] = accepted, result[2i + 1] = next token of item i.
void verify_items(const float* logits, int64_t ld, int V, const unsigned long long* argmax_keys, const RowDist* dist,
                  const VerifyItemDev* items, int n_items, const int32_t* drafts, const float* q, const double* uniforms,
                  int32_t* result, cudaStream_t stream);

}  // namespace dsinfer::cuda
