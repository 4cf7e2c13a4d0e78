// dsinfer model floor: load_model(), the one entry point from a model directory to a Model.
// It parses config.json and dispatches on config.json's 'architectures' (falling back to
// 'model_type'); each architecture's loader then checks its own tensors.
#include "model/model.h"

#include "core/error.h"
#include "model/deepseek_v4.h"
#include "model/paged_kv_cache.h"
#include "model/qwen3.h"

namespace dsinfer {

std::unique_ptr<BlockKVCache> Model::make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots,
                                                         int max_tokens, int feature_floats) const {
  // Host models give no feature rows (feature_floats() == 0): a host drafter reads the
  // engine's own store, in the same memory.
  (void)feature_floats;
  const ModelConfig& c = config();
  return std::make_unique<PagedKVCache>(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, block_size, num_blocks,
                                        max_slots, max_tokens, kv_dtype());
}

void forward_entry_error(const ForwardBatch& batch, size_t entry, const std::string& why) {
  throw Error("forward: entry " + std::to_string(entry) + " (slot " + std::to_string(batch.entries[entry].slot) + "): " + why);
}

void forward_capture_error(int layer, int layers) {
  throw Error("forward: capture layer " + std::to_string(layer) + " outside [-1, " + std::to_string(layers) + ")");
}

std::unique_ptr<Model> load_model(const std::string& model_dir, const LoadOptions& opts) {
  ModelConfig cfg = load_model_config(model_dir);
  const bool qwen3 = is_qwen3(cfg);
  if (qwen3) return load_qwen3(cfg, opts);
  const bool v4 = is_deepseek_v4(cfg);
  if (v4) return load_deepseek_v4(cfg, opts);
  const std::string got = cfg.architecture.empty() ? "model_type '" + cfg.model_type + "'" : "'" + cfg.architecture + "'";
  throw Error(model_dir + "/config.json: field 'architectures': unsupported architecture " + got +
              " (supported: Qwen3ForCausalLM, DeepseekV4ForCausalLM)");
}

}  // namespace dsinfer
