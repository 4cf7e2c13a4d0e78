// dsinfer CUDA backend: the DeepSpec drafter (DeepSpec DFlash, DSpark) on the GPU, next to
// a CUDA target, behind the same Drafter interface as the host drafter
// (spec/deepspec_drafter.h). load_drafter builds it for a DeepSpec checkpoint whose target
// runs on the GPU (the backend registers make_cuda_deepspec_drafter when it loads a target;
// DSINFER_CUDA_DRAFTER=0 keeps the host drafter).
//
// Data flow (all on the device; the host sends token ids, positions, the captured target
// rows, and gets draft ids and confidences back):
//   commit_context_batch: captured target rows [C, m·H] (host) --upload--> BF16 --fc GEMM-->
//     ctx [C, H] --hidden_norm fused into ONE GEMM over every layer's k|v weights--> k, v
//     --k_norm, RoPE at the absolute positions--> each sequence's K/V buffer (BF16,
//     [layers][K|V][kv_heads][cap][head_dim], sliding window as on the host).
//   propose_batch: [anchor, MASK × (bs−1)] per item --embedding (the target's when shared)-->
//     x [R·bs, H] --2 Qwen3 layers: RMSNorm + QKV GEMM, q/k norm + RoPE (block K/V written
//     after the committed rows, never kept), NON-causal attention over [visible context ;
//     block], o GEMM (+= x), RMSNorm + gate|up GEMM + SwiGLU, down GEMM (+= x)--> final norm
//     fused into the LM head GEMM (the target's matrix when shared) over the drafted rows,
//     ordered (position, item) --> per position k: Markov step (prev = the anchor or the
//     argmax of k − 1, e = W1[prev], the confidence logit) then the W2 GEMM accumulated into
//     the base logits with the argmax folded in (vanilla Markov head) --> ids, confidences.
//   Sampled items, or a gated/rnn Markov head: the base logits and final-normed rows come
//   back and the host heads sample exactly as the host drafter does (q stays exact).
// Batch invariance: in the target's batch-invariant GEMM mode (the default) every kernel
// computes a row in an order fixed by that row, so an item's drafts do not depend on the
// other items of the batch.
#pragma once
#include <memory>

#include "spec/drafter.h"
#include "spec/drafter_loader.h"

namespace dsinfer {

// nullptr when the target is not a CUDA model or DSINFER_CUDA_DRAFTER=0 (any other value
// than 0 or 1 is refused by name).
std::unique_ptr<Drafter> make_cuda_deepspec_drafter(const DraftConfig& cfg, const Model& target,
                                                    const DrafterOptions& opts);

}  // namespace dsinfer
