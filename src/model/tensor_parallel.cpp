// dsinfer model floor: tensor- and expert-parallel splits and the shard reader (see
// tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <cstring>

#include "core/error.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace dsinfer {

namespace {

std::string split_error(const ModelConfig& cfg, const std::string& field, const std::string& what, int ranks) {
  return cfg.model_dir + "/config.json: field '" + field + "': " + what + " do not split evenly over " +
         std::to_string(ranks) + " tensor-parallel rank" + (ranks == 1 ? "" : "s");
}

bool float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

TensorParallelPlan plan_tensor_parallel(const ModelConfig& cfg, int ranks) {
  if (ranks < 1) throw Error("--tensor-parallel must be >= 1 (got " + std::to_string(ranks) + ")");
  const int nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, inter = cfg.intermediate_size;
  if (nh <= 0 || nkv <= 0 || nh % nkv != 0)
    throw Error(cfg.model_dir + "/config.json: field 'num_key_value_heads': " + std::to_string(nkv) +
                " must divide num_attention_heads (" + std::to_string(nh) + ")");
  if (nh % ranks != 0) throw Error(split_error(cfg, "num_attention_heads", std::to_string(nh) + " heads", ranks));
  if (nkv % ranks != 0 && ranks % nkv != 0)
    throw Error(split_error(cfg, "num_key_value_heads", std::to_string(nkv) + " KV heads (nor are the ranks a multiple of them)", ranks));
  if (inter <= 0 || inter % ranks != 0)
    throw Error(split_error(cfg, "intermediate_size", std::to_string(inter) + " intermediate features", ranks));
  TensorParallelPlan p;
  p.ranks = ranks;
  p.kv_replicated = ranks > nkv;
  const int q_per = nh / ranks, i_per = inter / ranks;
  for (int r = 0; r < ranks; ++r) {
    TensorParallelRank t;
    t.q_head_begin = r * q_per;
    t.q_head_end = (r + 1) * q_per;
    if (p.kv_replicated) {
      // Rank r's q heads all belong to KV head r / (ranks / nkv): the q heads of one KV
      // head (nh / nkv of them) are spread over ranks / nkv consecutive ranks.
      t.kv_head_begin = r / (ranks / nkv);
      t.kv_head_end = t.kv_head_begin + 1;
    } else {
      t.kv_head_begin = r * (nkv / ranks);
      t.kv_head_end = (r + 1) * (nkv / ranks);
    }
    t.inter_begin = r * i_per;
    t.inter_end = (r + 1) * i_per;
    p.rank.push_back(t);
  }
  return p;
}

const TensorParallelRank& TensorParallelPlan::at(int r) const {
  if (r < 0 || r >= ranks)
    throw Error("tensor-parallel rank " + std::to_string(r) + " outside [0, " + std::to_string(ranks) + ")");
  return rank[static_cast<size_t>(r)];
}

ModelConfig rank_config(const ModelConfig& full, const TensorParallelRank& share) {
  ModelConfig c = full;
  c.num_attention_heads = share.q_head_end - share.q_head_begin;
  c.num_key_value_heads = share.kv_head_end - share.kv_head_begin;
  c.intermediate_size = share.inter_end - share.inter_begin;
  return c;
}

std::vector<std::pair<int, int>> plan_expert_parallel(int n_experts, int ranks, const std::string& where) {
  if (ranks < 1) throw Error("--expert-parallel must be >= 1 (got " + std::to_string(ranks) + ")");
  if (n_experts <= 0 || n_experts % ranks != 0)
    throw Error(where + ": " + std::to_string(n_experts) + " experts do not split evenly over " + std::to_string(ranks) +
                " expert-parallel rank" + (ranks == 1 ? "" : "s"));
  std::vector<std::pair<int, int>> out;
  const int per = n_experts / ranks;
  for (int r = 0; r < ranks; ++r) out.push_back({r * per, (r + 1) * per});
  return out;
}

float WeightSlice::at(int64_t r, int64_t c) const { return load_as_f32(bytes.data(), dtype, r * cols + c); }

ShardReader::ShardReader(const std::string& model_dir)
    : dir_(model_dir), set_(SafetensorsSet::open_dir(model_dir, MappedFile::Placement::Mmap)) {}

ShardReader::~ShardReader() = default;


namespace {

const TensorLocation& locate(const SafetensorsSet& set, const std::string& dir, const std::string& name, size_t rank) {
  const TensorLocation* loc = set.find(name);
  if (!loc) throw Error(dir + ": tensor '" + name + "' not found in the checkpoint");
  const SafetensorsTensor& t = *loc->tensor;
  if (t.shape.size() != rank)
    throw Error(loc->file->path() + ": tensor '" + name + "': " + std::to_string(t.shape.size()) + " dimensions, expected " +
                std::to_string(rank));
  if (!float_dtype(t.dtype))
    throw Error(loc->file->path() + ": tensor '" + name + "': dtype " + dtype_name(t.dtype) + " not one of F32, BF16, F16");
  return *loc;
}

void check_range(const TensorLocation& loc, const std::string& name, const char* what, int64_t b, int64_t e, int64_t n) {
  if (b < 0 || e > n || b > e)
    throw Error(loc.file->path() + ": tensor '" + name + "': " + what + " [" + std::to_string(b) + ", " + std::to_string(e) +
                ") outside [0, " + std::to_string(n) + ")");
}

}  // namespace

WeightSlice ShardReader::rows(const std::string& name, int64_t r0, int64_t r1) {
  const TensorLocation& loc = locate(*set_, dir_, name, 2);
  const SafetensorsTensor& t = *loc.tensor;
  check_range(loc, name, "rows", r0, r1, t.shape[0]);
  WeightSlice s{name, t.dtype, r1 - r0, t.shape[1], {}};
  const size_t row_bytes = static_cast<size_t>(t.shape[1]) * dtype_size(t.dtype);
  s.bytes.resize(static_cast<size_t>(s.rows) * row_bytes);
  if (!s.bytes.empty()) std::memcpy(s.bytes.data(), loc.file->tensor_data(t) + static_cast<size_t>(r0) * row_bytes, s.bytes.size());
  bytes_read_ += s.bytes.size();
  return s;
}

WeightSlice ShardReader::cols(const std::string& name, int64_t c0, int64_t c1) {
  const TensorLocation& loc = locate(*set_, dir_, name, 2);
  const SafetensorsTensor& t = *loc.tensor;
  check_range(loc, name, "columns", c0, c1, t.shape[1]);
  WeightSlice s{name, t.dtype, t.shape[0], c1 - c0, {}};
  const size_t es = dtype_size(t.dtype), row_bytes = static_cast<size_t>(t.shape[1]) * es,
               part = static_cast<size_t>(c1 - c0) * es;
  s.bytes.resize(static_cast<size_t>(s.rows) * part);
  const uint8_t* src = loc.file->tensor_data(t) + static_cast<size_t>(c0) * es;
  for (int64_t r = 0; r < s.rows; ++r) std::memcpy(s.bytes.data() + r * part, src + r * row_bytes, part);
  bytes_read_ += s.bytes.size();
  return s;
}

std::vector<float> ShardReader::vector(const std::string& name, int64_t i0, int64_t i1) {
  const TensorLocation& loc = locate(*set_, dir_, name, 1);
  const SafetensorsTensor& t = *loc.tensor;
  check_range(loc, name, "elements", i0, i1, t.shape[0]);
  std::vector<float> v(static_cast<size_t>(i1 - i0));
  const uint8_t* base = loc.file->tensor_data(t);
  for (int64_t i = i0; i < i1; ++i) v[static_cast<size_t>(i - i0)] = load_as_f32(base, t.dtype, i);
  bytes_read_ += v.size() * dtype_size(t.dtype);
  return v;
}

Qwen3LayerShard read_qwen3_layer_shard(ShardReader& reader, const ModelConfig& cfg, const TensorParallelPlan& plan,
                                       int rank, int layer) {
  const TensorParallelRank& t = plan.at(rank);
  const int64_t D = cfg.head_dim;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  Qwen3LayerShard s;
  s.q = reader.rows(p + "self_attn.q_proj.weight", t.q_head_begin * D, t.q_head_end * D);
  s.k = reader.rows(p + "self_attn.k_proj.weight", t.kv_head_begin * D, t.kv_head_end * D);
  s.v = reader.rows(p + "self_attn.v_proj.weight", t.kv_head_begin * D, t.kv_head_end * D);
  s.o = reader.cols(p + "self_attn.o_proj.weight", t.q_head_begin * D, t.q_head_end * D);
  s.gate = reader.rows(p + "mlp.gate_proj.weight", t.inter_begin, t.inter_end);
  s.up = reader.rows(p + "mlp.up_proj.weight", t.inter_begin, t.inter_end);
  s.down = reader.cols(p + "mlp.down_proj.weight", t.inter_begin, t.inter_end);
  if (cfg.attention_bias) {
    s.q_bias = reader.vector(p + "self_attn.q_proj.bias", t.q_head_begin * D, t.q_head_end * D);
    s.k_bias = reader.vector(p + "self_attn.k_proj.bias", t.kv_head_begin * D, t.kv_head_end * D);
    s.v_bias = reader.vector(p + "self_attn.v_proj.bias", t.kv_head_begin * D, t.kv_head_end * D);
  }
  return s;
}

std::vector<Qwen3LayerShard> read_qwen3_shard(ShardReader& reader, const ModelConfig& cfg, const TensorParallelPlan& plan,
                                              int rank) {
  std::vector<Qwen3LayerShard> layers;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) layers.push_back(read_qwen3_layer_shard(reader, cfg, plan, rank, l));
  return layers;
}

}  // namespace dsinfer
