// dsinfer CUDA backend: the kernels of the DeepSeek-V4 forward on the GPU
// (deepseek_v4_cuda.cpp), one per step of the CPU forward (model/deepseek_v4*.cpp), with the
// same F32 arithmetic (activations F32 everywhere, weights as stored: F32, BF16, FP8 E4M3
// with 128x128 scales or FP4 E2M1 with per-32 scales, dequantised inside the kernels).
//
// Data flow of one layer (T rows of one forward, all on the device, no host round trip):
//   X [T, n_hc, D] -> sumsq_parts, linear(hc_fn) on X -> hc_site (1/rms, Sinkhorn, u, RMSNorm) -> h
//   h -> linear([q_a | kv | C | Z | C_I | Z_I]) (every projection of h in one launch where
//        the formats allow)
//   q_a rows -> rmsnorm_rows -> linear(q_b) -> head_rms_rope                     (queries)
//   kv rows -> kv_norm_rope_store                               (K=V row into the state)
//   CSA/HCA: C, Z rows -> store_raw -> pool_windows                  (compressed entries)
//   CSA: qres -> linear(idx_q_b), h -> linear(idx_w) -> indexer_topk     (selected entries)
//   attention_rows (window rows + entries, learned sink, inverse RoPE) -> grouped o_a, o_b
//   (all groups in one routed launch) -> hc_post; the same mHC site around the MoE:
//   linear(router) -> moe_route (top-k or hash) -> linear_routed(gate|up) -> swiglu_rows ->
//   linear_routed(down) -> hc_post_moe (the weighted expert rows + shared, then the mix-back).
// Every reduction runs in an order fixed by the row alone (never by T or by the launch), so
// a token's result does not depend on what else shares the forward (batch invariance).
//
// Decoding state layout (V4CudaState): per layer and kind, one device array
// [max_slots][capacity][width]; row (slot, p) at base + (slot * capacity + p) * width.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::cuda::v4 {

// A weight matrix [rows, cols] as uploaded. For routed experts, expert e's matrix starts
// e * stride bytes after `w` and its scales e * scale_stride bytes after `scales`.
struct DevLinear {
  enum Kind { F32, BF16, FP8, FP4 };
  Kind kind = F32;
  const void* w = nullptr;
  const uint8_t* scales = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t stride = 0, scale_stride = 0;
};

// y[i, :rows] = x[i, :cols] . W^T for i < m (row strides ldx, ldy in floats). staging:
// device scratch of staging_floats floats (split-K partials, strided quantized rows).
void linear(const DevLinear& w, const float* x, int64_t ldx, int m, float* y, int64_t ldy, float* staging,
            int64_t staging_floats, cudaStream_t s);
// Floats of staging per row of x that linear() may use for split-K partials.
int64_t max_split_partials();
// Routed experts: y[p, :rows] = x[p / x_div, :cols] . W_{eid[p]}^T for p < pairs (x, y dense).
void linear_routed(const DevLinear& w, const int32_t* eid, int pairs, const float* x, int x_div, float* y,
                   cudaStream_t s);

// Rows are described by per-row arrays on the device: token, position, slot.
struct RowMeta {
  const int32_t* token = nullptr;
  const int32_t* pos = nullptr;
  const int32_t* slot = nullptr;
};

// X[r, j, :] = embedding row of token[r] for every stream j (emb: F32 or BF16 [V, D]).
void embed_streams(const void* emb, bool bf16, int64_t D, RowMeta rows, int T, int nhc, float* X, cudaStream_t s);
// dst[r * ld + :D] = mean over the n_hc streams of X[r] (summed in stream order).
void capture_mean(const float* X, int T, int nhc, int64_t D, float* dst, int64_t ld, cudaStream_t s);
struct HcSite {
  const float* base = nullptr;   // [(2 + n) n]
  const float* scale = nullptr;  // [3]
};
// An mHC site, every row spread over many blocks (one block per row was latency-bound: 17-29
// us per call for n*D = 16384 values on the H200): sumsq_parts gives each row's sum of
// squares in sumsq_chunks(W) chunk sums (double); the site's projection runs on X itself
// (z_raw, no normalised copy), and hc_site scales it by the row's 1/rms (the same value up to
// rounding: the rms is a per-row scalar), forms pre (and, not head, post + comb), u = sum_j
// pre_j X_j with per-block sums of squares (uparts: T x ceil(D/256) floats), then h = w *
// (u * inv_rms(u)). head: the final collapse (pre from z * scale[0] + base; no post/comb).
int sumsq_chunks(int64_t W);
void sumsq_parts(const float* X, int T, int64_t W, double* parts, cudaStream_t s);
void hc_site(const float* z_raw, HcSite site, int n, int iters, float hc_eps, const double* xparts, const float* X, int T,
             int64_t D, const float* norm_w, float eps, bool head, float* u, float* uparts, float* post, float* comb,
             float* h, cudaStream_t s);
// X[r, k] = post[r, k] * y[r] + sum_j comb[r, j, k] X[r, j] (in place).
void hc_post(const float* post, const float* comb, const float* y, int T, int n, int64_t D, float* X, cudaStream_t s);
// dst[i, :] = src[idx[i], :] (width floats).
void gather_rows(const float* src, int64_t width, const int32_t* idx, int n, float* dst, cudaStream_t s);

// y = rmsnorm(x) * w per row (ld = row stride; in place allowed).
void rmsnorm_rows(float* x, int64_t ld, int T, int n, const float* w, float eps, cudaStream_t s);
// Per row and head of q [T, H*d]: weightless RMS over d, then RoPE (+theta) on the last 2*half.
void head_rms_rope(float* q, int T, int H, int d, int half, const float* inv, const int32_t* pos, float eps,
                   cudaStream_t s);
// Per row: RoPE only, on every head's tail (the indexer's queries).
void head_rope(float* q, int T, int H, int d, int half, const float* inv, const int32_t* pos, cudaStream_t s);
// kv rows [T, d] (row stride ld): RMSNorm with w, RoPE, stored at the state row (slot, pos) of
// `state` (cap rows per slot).
void kv_norm_rope_store(const float* kv, int64_t ld, int T, int d, const float* w, float eps, int half,
                        const float* inv, RowMeta rows, float* state, int cap, cudaStream_t s);
// raw row (slot, pos) = C[r] | Z[r] (width cw each; C and Z rows ld apart).
void store_raw(const float* C, const float* Z, int64_t ld, int T, int cw, RowMeta rows, float* raw, int cap,
               cudaStream_t s);

// One window to pool: entry w of slot.
struct PoolJob {
  int slot, window;
};
// Pools each job's window from the raw rows into its entry (width dd): softmax over slots per
// channel of Z + pos_bias, weighted sum of C, RMSNorm with norm_w, RoPE at window * m. The
// job count is read on the device (*njobs <= max_jobs), so the launch does not depend on
// which windows close (a captured graph replays for every step of the same shape).
void pool_windows(const float* raw, int cap, float* entries, int ecap, const PoolJob* jobs, const int32_t* njobs,
                  int max_jobs, int m, int dd, bool overlap, const float* pos_bias, const float* norm_w, float eps,
                  int half, const float* inv, cudaStream_t s);

// CSA indexer: per row, scores of the (pos + 1) / m visible indexer entries
// (sum_h relu(q_h . k_w) / sqrt(dI) * w_h / sqrt(HI)), then the top `topk` (higher score,
// then lower index), listed in ascending entry order in sel[r * topk ..], count in nsel[r].
// A state may hold at most max_indexer_entries() indexer entries per sequence (the sort runs
// in shared memory); the model refuses longer capacities when the cache is made.
int max_indexer_entries();
void indexer_topk(const float* iq, const float* iw, int T, int HI, int dI, RowMeta rows, const float* entries,
                  int ecap, int m, int topk, int32_t* sel, int32_t* nsel, cudaStream_t s);

// Attention of every (row, head): keys = the window rows [pos - W + 1, pos] of `kv` (cap rows
// per slot), then compressed entries: HCA (kind 2) every visible one, CSA (kind 1) the
// selected ones; values = keys; one softmax with the learned sink; inverse RoPE on the
// output's tail. att [T, H*d].
void attention_rows(const float* q, int T, int H, int d, int half, const float* inv, RowMeta rows, const float* kv,
                    int cap, int W, int kind, const float* entries, int ecap, int m, const int32_t* sel,
                    const int32_t* nsel, int topk, const float* sinks, float* att, cudaStream_t s);

// MoE routing per row: scores (sqrt(softplus) or sigmoid), top-k by score + bias (or hash
// table tid2eid [V, K] by token), weights = score / sum * routed_scale. eid/wts [T, K].
void moe_route(const float* logits, int T, int E, int K, bool sigmoid, const float* bias, const int32_t* tid2eid,
               const int32_t* tokens, float routed_scale, int32_t* eid, float* wts, cudaStream_t s);
// act = silu(min(g, limit)) * clamp(u, -limit, limit), n values.
void swiglu_clamp(const float* g, const float* u, int64_t n, float limit, float* act, cudaStream_t s);
// The same from rows [g | u] of width 2I (a fused gate|up projection): act [n, I].
void swiglu_rows(const float* gu, int64_t n, int64_t I, float limit, float* act, cudaStream_t s);
// hc_post with y = the MoE output formed in place: per (row, column) the sum over k in
// ascending expert id of wts[r, k] * yp[r * K + k] (yp: [T * K, D]), then + shared[r].
void hc_post_moe(const float* post, const float* comb, const float* yp, const int32_t* eid, const float* wts,
                 const float* shared, int K, int T, int n, int64_t D, float* X, cudaStream_t s);
// ids[i] = argmax of row i of logits [n, V] (lowest index on ties).
void argmax_rows(const float* logits, int n, int V, int32_t* ids, cudaStream_t s);

}  // namespace dsinfer::cuda::v4
