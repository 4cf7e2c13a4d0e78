// dsinfer model floor: the Qwen3 dense architecture (Qwen3ForCausalLM, model_type qwen3).
//
// Data flow of forward(): all new tokens of all batch entries are embedded into one
// [total_tokens, hidden] residual matrix; every linear layer is then ONE matmul over all of
// those rows (weights are streamed once per call whatever the batch), while attention runs
// per entry against that entry's KV-cache slot. Per layer: RMSNorm → q/k/v projections
// (+bias if attention_bias) → per-head q/k RMSNorm → RoPE → K/V appended to the cache →
// causal GQA attention → o_proj → residual add → RMSNorm → SwiGLU MLP → residual add.
// Then the final norm and the LM head, over only the rows whose logits were asked for.
#pragma once
#include <memory>

#include "model/model.h"
#include "model/qwen3_layer.h"
#include "model/tensor_parallel.h"

namespace dsinfer {

// Builds a Qwen3 model from an already parsed config (load_model dispatches here).
std::unique_ptr<Model> load_qwen3(const ModelConfig& cfg, const LoadOptions& opts);

// One rank of a tensor-parallel group (model/tensor_parallel.h): the model holds the rank's
// share of the projections (its heads, its intermediate features; read with ShardReader)
// and the replicated rest; its config() is the rank's view (its head and feature counts,
// so its KV caches hold its KV heads only). reduce sums a partial [rows, hidden] output
// over the group in place; the forward calls it after every layer's o and down
// projections, in the same order on every rank, so all ranks must run the same forwards.
struct Qwen3RankOptions {
  TensorParallelPlan plan;
  int rank = 0;
  RankReduce reduce;
};
std::unique_ptr<Model> load_qwen3_rank(const ModelConfig& cfg, const LoadOptions& opts, const Qwen3RankOptions& rank);

}  // namespace dsinfer
