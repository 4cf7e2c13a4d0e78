// dsinfer model floor: how a model's weights split over tensor-parallel and expert-parallel
// ranks (issue 10), and the reader that loads one rank's share of a checkpoint.
//
// Tensor parallelism (Megatron-style) for a Qwen3 layer: q/k/v and gate/up are split by
// output rows ("column-parallel": a rank owns whole attention heads and a contiguous slice
// of the intermediate features), o and down by input columns ("row-parallel": a rank owns
// the columns that match its heads / features and produces a partial sum of the full
// hidden row). So a layer costs two all-reduces (after o, after down) and nothing else
// crosses ranks: attention for a head needs only that head's q and its KV head's k, v. When
// there are more ranks than KV heads, each KV head is replicated on ranks / kv_heads ranks
// (its q heads are spread over them). Norm weights, the embedding and the LM head are
// replicated; a row-parallel bias (o_proj.bias) is added once, after the reduction.
//
// Expert parallelism for MoE layers: each rank owns a contiguous range of experts.
//
// ShardReader copies exactly a rank's slices out of the memory-mapped safetensors (row
// ranges are one copy, column ranges one copy per row), so a rank's process reads only
// the pages that hold its share; bytes_read() counts what was copied (the tests check it).
// The forward that uses these shards is the backend's (the CUDA tensor-parallel path, over
// NCCL); tests/unit/test_model_tensor_parallel.cpp checks the split itself against the
// unsplit reference forward.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace dsinfer {

class SafetensorsSet;

// The sum over a group's ranks of a partial output (n floats, rows of the hidden width), in
// place, the same bits on every rank: what a rank's forward calls after a row-parallel
// projection (Qwen3's o and down) or its share of the experts (DeepSeek-V4's MoE).
using RankReduce = std::function<void(float* rows, int64_t n)>;

// One rank's share of every Qwen3 layer: [begin, end) ranges.
struct TensorParallelRank {
  int q_head_begin = 0, q_head_end = 0;    // attention heads (q rows / o columns: x head_dim)
  int kv_head_begin = 0, kv_head_end = 0;  // KV heads (k, v rows: x head_dim)
  int inter_begin = 0, inter_end = 0;      // intermediate features (gate/up rows, down columns)
};

struct TensorParallelPlan {
  int ranks = 1;
  bool kv_replicated = false;  // ranks > num_key_value_heads: one KV head on ranks / kv_heads ranks
  std::vector<TensorParallelRank> rank;
  const TensorParallelRank& at(int r) const;  // Error naming r outside [0, ranks)
};

// The config as rank `share` sees it: its head, KV head and intermediate counts, so the
// rank's caches and layer geometry follow from it.
ModelConfig rank_config(const ModelConfig& full, const TensorParallelRank& share);

// The split of cfg over `ranks` ranks. Errors name config.json's field and the rank count:
// heads, KV heads (a divisor or a multiple of the ranks) and intermediate_size must split
// evenly ("<dir>/config.json: field 'num_attention_heads': 6 heads do not split evenly over
// 4 tensor-parallel ranks").
TensorParallelPlan plan_tensor_parallel(const ModelConfig& cfg, int ranks);

// Experts [first, last) of each of `ranks` ranks; n_experts must be a multiple of ranks
// (`where` names the config and field in the error).
std::vector<std::pair<int, int>> plan_expert_parallel(int n_experts, int ranks, const std::string& where);

// A slice of a 2-D checkpoint tensor in its stored dtype (row-major [rows, cols]).
struct WeightSlice {
  std::string name;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
  float at(int64_t r, int64_t c) const;  // element (r, c) as F32
};

class ShardReader {
 public:
  explicit ShardReader(const std::string& model_dir);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Rows [r0, r1) of the 2-D tensor `name` (all columns); columns [c0, c1) of every row.
  // Errors name the file, the tensor and the range.
  WeightSlice rows(const std::string& name, int64_t r0, int64_t r1);
  WeightSlice cols(const std::string& name, int64_t c0, int64_t c1);
  // Elements [i0, i1) of a 1-D tensor as F32.
  std::vector<float> vector(const std::string& name, int64_t i0, int64_t i1);
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string dir_;
  std::unique_ptr<SafetensorsSet> set_;
  uint64_t bytes_read_ = 0;
};

// One rank's share of one Qwen3 layer: the split projections and the split q/k/v biases
// (empty without attention_bias). Replicated tensors (norms, o bias) are read whole by the
// caller.
struct Qwen3LayerShard {
  WeightSlice q, k, v, o, gate, up, down;
  std::vector<float> q_bias, k_bias, v_bias;
};

// Layer `layer`'s share for `rank` of `plan` (cfg from load_model_config of the same
// directory), and every layer's.
Qwen3LayerShard read_qwen3_layer_shard(ShardReader& reader, const ModelConfig& cfg, const TensorParallelPlan& plan,
                                       int rank, int layer);
std::vector<Qwen3LayerShard> read_qwen3_shard(ShardReader& reader, const ModelConfig& cfg,
                                              const TensorParallelPlan& plan, int rank);

}  // namespace dsinfer
