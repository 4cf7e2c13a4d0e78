// dsinfer model floor: synthetic checkpoints for benchmarks. write_random_model() writes a
// Hugging Face-style directory (config.json, generation_config.json, model.safetensors or
// shards + model.safetensors.index.json) for a Qwen3 shape with N(0, 0.02) weights and unit
// norm weights, streamed tensor by tensor so multi-GB models never sit in memory whole.
// The numbers are meaningless as a language model but exercise exactly the bytes and the
// arithmetic of the real architecture.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/config.h"

namespace dsinfer {

// Shapes of the published Qwen3 checkpoints: "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", and "tiny" (a small
// shape for smoke tests). Throws Error naming the preset otherwise.
ModelConfig random_model_preset(const std::string& like);

// dtype: F32 or BF16. Shards when the weights exceed shard_bytes.
void write_random_model(const ModelConfig& cfg, DType dtype, const std::string& out_dir, uint64_t seed,
                        uint64_t shard_bytes = 4ull << 30);

}  // namespace dsinfer
