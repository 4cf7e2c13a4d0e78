// dsinfer speculation floor: the DeepSeek-V4 DSpark drafter, stored inside a V4 checkpoint
// under "mtp.{0,1,2}.*" (DeepSeek-V4-Flash-DSpark / -0731), behind the Drafter interface.
//
// Data flow (docs/DEEPSEEK_V4.md, "DSpark drafter", lists which steps are verified and
// which are our reading of the public ports):
//   commit_context: the target's captured layer outputs at dspark_target_layer_ids (each the
//     mean of the n_hc residual streams after that layer) [c, m·D] → main_x =
//     rmsw(mtp.0.main_proj · f; mtp.0.main_norm) [c, D] → for every stage s: the context
//     K=V row RoPE(rmsw(W_kv^s · main_x; kv_norm^s)) at the absolute positions → the
//     sequence's per-stage window (only the last sliding_window positions are kept).
//   propose: block [anchor, noise × (bs−1)] at positions [len, len + bs), embedded with the
//     TARGET's embedding and copied into n_hc streams → per stage a full V4 block (mHC site,
//     attn_norm, attention of the bs queries over the last sliding_window context rows plus
//     all bs block rows — non-causal, learned sink, values = keys, grouped output projection
//     — mHC mix-back; mHC site, ffn_norm, MoE with learned routing, mix-back) → the last
//     stage's hc_head collapse → rmsw(mtp.{S−1}.norm) → the TARGET's LM head (base logits
//     U_k for all bs positions) → sequential drafting as DeepSpec DSpark: ℓ_k = U_k +
//     W2·W1[x_{k−1}] (vanilla Markov head, x_{−1} = anchor), confidence z_k =
//     proj·[h_k ; W1[x_{k−1}]].
// The attention pieces, the MoE and the mHC functions are the target's own
// (model/deepseek_v4_{attention,moe,mhc}); only the key set differs. Draft-side state holds
// committed positions only, so a rejected draft needs no rollback here.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "spec/drafter.h"

namespace dsinfer {

struct DrafterOptions;
struct DeepseekV4Config;

// The DSpark fields of a V4 config.json (validated against the target's V4 config).
struct V4DSparkConfig {
  int block_size = 0;               // dspark_block_size (bs, the anchor included; bs drafts)
  int32_t noise_token_id = -1;      // dspark_noise_token_id
  std::vector<int> target_layer_ids;  // dspark_target_layer_ids
  int markov_rank = 0;              // dspark_markov_rank (0: no Markov head)
};

// True when DIR/config.json says model_type "deepseek_v4" (the drafter lives in the target).
bool is_deepseek_v4_dir(const std::string& dir);
// True when DIR is a DeepSeek-V4 checkpoint whose config carries valid dspark_* fields: the
// commands that look for a drafter by themselves (bench --compare, check-env) take its mtp.*
// stages. False for anything else, errors included.
bool has_v4_dspark_stages(const std::string& dir);

V4DSparkConfig parse_v4_dspark_config(const std::string& dir, const DeepseekV4Config& target);

// Loads the mtp.* stages of DIR against `target` (a DeepSeek-V4 model whose embedding and
// LM head the drafter shares). One-line Error naming the file and field/tensor otherwise.
std::unique_ptr<Drafter> load_v4_dspark_drafter(const std::string& dir, const Model& target,
                                                const DrafterOptions& opts);

}  // namespace dsinfer
