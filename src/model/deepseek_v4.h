// dsinfer model floor: the DeepSeek-V4 architecture (DeepseekV4ForCausalLM, model_type
// deepseek_v4) behind the common Model interface.
//
// Data flow of forward(): all new tokens of all batch entries are embedded into one
// [T, D] matrix and copied into n_hc residual streams X [T, n_hc, D]. Per layer:
// mHC site → input norm → attention (deepseek_v4_attention: window + CSA/HCA branches,
// reading and extending the sequence's V4State) → mHC mix-back; mHC site → post-attention
// norm → MoE (deepseek_v4_moe) → mHC mix-back. Then the hc_head collapse, the final norm
// and the LM head over only the rows whose logits were asked for. A captured layer output
// (ForwardBatch::capture_layers, what the DSpark drafter drafts from) is the mean of the
// n_hc streams after that layer (-1: the embedding). Linear layers are single
// matmuls over every row of every sequence; attention and compression are per sequence.
// The decoding state is V4State (deepseek_v4_state.h), whose truncate() is exact, so
// speculative verification and rollback work as for Qwen3.
#pragma once
#include <memory>

#include "model/deepseek_v4_config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace dsinfer {

class V4TensorIndex;

std::unique_ptr<Model> load_deepseek_v4(const ModelConfig& cfg, const LoadOptions& opts);

// One expert-parallel rank (model/tensor_parallel.h): the model runs only routed experts
// [expert_begin, expert_end) of every MoE block and sums the ranks' routed outputs with
// reduce (then adds the shared expert); everything else is replicated. The checkpoint is
// mapped, not copied, so the other ranks' experts are never read.
struct V4ExpertRankOptions {
  int expert_begin = 0, expert_end = 0;
  RankReduce reduce;
};
std::unique_ptr<Model> load_deepseek_v4_rank(const ModelConfig& cfg, const LoadOptions& opts,
                                             const V4ExpertRankOptions& rank);

// What every DeepSeek-V4 model (the CPU one here, the CUDA one in backend/cuda) tells the
// DSpark drafter and the helpers below: its parsed config, the tensor index it loaded from
// and its weight bytes. Found by dynamic_cast, so Model itself stays architecture-free.
class DeepseekV4Info {
 public:
  virtual ~DeepseekV4Info() = default;
  virtual const DeepseekV4Config& v4() const = 0;
  virtual const V4TensorIndex& index() const = 0;
  virtual uint64_t weight_bytes() const = 0;
};

// The parsed V4 configuration of a model built by load_deepseek_v4 (nullptr otherwise).
const DeepseekV4Config* deepseek_v4_config(const Model& m);
// The tensor index the model loaded its weights from (nullptr for a model that is not V4):
// the DSpark drafter stored in the same checkpoint reads its mtp.* tensors through it
// rather than opening (and holding) the checkpoint a second time.
const V4TensorIndex* deepseek_v4_index(const Model& m);
// Bytes of the target's weights as held in memory (0 for a model that is not V4): the
// DSpark drafter adds its own to this for its memory check.
uint64_t deepseek_v4_weight_bytes(const Model& m);
// The memory plan's drafter line: prints the drafter's weights next to the target's and
// refuses (one-line Error naming `what`) when target + drafter cannot fit in this
// machine's memory.
void deepseek_v4_plan_drafter(const Model& target, const std::string& what, uint64_t drafter_bytes,
                              uint64_t drafter_expert_bytes);

}  // namespace dsinfer
