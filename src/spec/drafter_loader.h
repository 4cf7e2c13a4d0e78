// dsinfer speculation floor: the one entry point from a draft checkpoint directory to a
// Drafter bound to its target model.
//
// Data flow: DIR/config.json → a DeepSeek-V4 checkpoint (model_type deepseek_v4) is the
// target's own directory with its DSpark stages under mtp.* (spec/v4_dspark_drafter.h);
// otherwise dialect detection (`architectures`: DFlashDraftModel →
// z-lab DFlash; Qwen3DSparkModel → DeepSpec DFlash when markov_rank == 0 and no confidence
// head, else DSpark) → DraftConfig (backbone dimensions from the Qwen3-style fields, draft
// fields from `dflash_config` / top level) → validation against the target (hidden size,
// vocabulary, target_layer_ids range and order, mask id, block size) → the safetensors are
// mapped and every tensor's shape checked (fc [H, m·H], heads [V, r] ...) by the concrete
// drafter's constructor. Every refusal is one dsinfer::Error line naming file and field.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "spec/drafter.h"

namespace dsinfer {

class Model;

struct DrafterOptions {
  // Draft context sliding window: keep only the last window_size committed context
  // positions in the draft KV cache (RoPE positions stay absolute). 0 = unlimited.
  // CLI: --dflash-window-size.
  // -1 (default): the checkpoint's own recommendation, config.json field
  // "dsinfer_context_window" (the context length the drafter was trained on: longer contexts
  // are out of its distribution), else unlimited.
  int window_size = -1;
  // Weight storage, as LoadOptions::weight_dtype ("auto", "f32", "bf16").
  std::string weight_dtype = "auto";
  // true: a DeepSpec drafter whose target runs on a device (Model::on_device) runs there
  // too, when the target's backend registered a device drafter (below); false keeps it on
  // the host (tests compare the two).
  bool on_device = true;
  // Reduced draft vocabulary (spec/draft_vocab.h): the drafter's LM head and Markov W2 keep
  // only the draft_vocab_size most frequent ids of the ranking in draft_vocab_file.
  // -1 (default): the ranking's own default_size when a ranking is found, else the whole
  // vocabulary; 0: the whole vocabulary; N: the first N ids (a ranking must exist).
  // CLI: --draft-vocab N.
  int draft_vocab_size = -1;
  // The ranking. Empty: DRAFT_DIR/draft_vocab.json, else TARGET_DIR/draft_vocab.json, else
  // none. CLI: --draft-vocab-file.
  std::string draft_vocab_file;
  // Resolved by load_drafter from the two fields above, for the drafter constructors: the
  // draft ids, ascending (empty: the whole vocabulary).
  std::vector<int32_t> draft_vocab_ids;
};

enum class DraftDialect { ZLab, DeepSpec };

// Everything the loader reads from a draft config.json (after validation).
struct DraftConfig {
  ModelConfig base;          // Qwen3-style backbone fields (dims, eps, RoPE, attention_bias)
  DraftDialect dialect = DraftDialect::ZLab;
  int block_size = 0;        // bs, including the anchor
  int32_t mask_token_id = -1;
  std::vector<int> target_layer_ids;
  int markov_rank = 0;       // DeepSpec only
  std::string markov_head;   // "", "vanilla", "gated", "rnn"
  bool confidence_head = false;
  int confidence_with_markov = -1;  // -1: not stated (inferred from the tensor shape), 0/1
  int context_window = 0;    // "dsinfer_context_window" (0: none stated)
};

// Parses and validates DIR/config.json against the target's config (no tensors read).
DraftConfig parse_draft_config(const std::string& draft_dir, const ModelConfig& target);

std::unique_ptr<Drafter> load_drafter(const std::string& draft_dir, const Model& target,
                                      const DrafterOptions& opts = {});

// A backend whose models run on a device registers here how to build a DeepSpec drafter
// next to them (the CUDA backend does when it loads a target; this floor never links it).
// load_drafter calls it for a DeepSpec checkpoint whose target is on_device(); the factory
// returns nullptr to decline (another backend's target, DSINFER_CUDA_DRAFTER=0), and the
// host drafter is built as before. cfg.window_size is already resolved (>= 0).
using DeviceDrafterFactory = std::unique_ptr<Drafter> (*)(const DraftConfig& cfg, const Model& target,
                                                          const DrafterOptions& opts);
void register_device_drafter_factory(DeviceDrafterFactory factory);

}  // namespace dsinfer
