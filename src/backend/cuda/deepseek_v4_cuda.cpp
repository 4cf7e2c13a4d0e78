// dsinfer CUDA backend: the DeepSeek-V4 model on one GPU (load_deepseek_v4_cuda in
// cuda_backend.h), the same forward as the CPU's model/deepseek_v4.cpp with its kernels in
// cuda_v4_kernels.h.
//
// Data flow: loading parses config.json and maps the checkpoint with the CPU loader (both
// naming schemes, shape checks, FP8/FP4 detection), prints a memory plan against the
// device's free memory (refusing a model that cannot fit), then uploads every matrix as
// stored: F32/BF16 as is, FP8/FP4 as codes + scales (dequantised inside the GEMV kernels,
// never expanded), and each layer's routed experts packed into one array per projection
// so that a kernel picks expert e by offset (routing never leaves the device).
// forward(): the host validates the batch as the CPU model does and sends one block of row
// metadata (token, position, slot, logit rows, the compressor windows that close); then
// every layer runs on the device (mHC site, attention with its compressors and indexer,
// mHC, MoE, mHC) and only the logit rows (or, for forward_argmax, the ids) and captured
// layers come back. The decoding state (V4CudaState) keeps per slot every position's K=V
// row and raw compressor rows, and the compressed entries, in device memory: truncate()
// only moves the length, entries of windows that close again are recomputed from the same
// raw rows, so rollback after verification is exact, as on the CPU.
// CUDA graphs: the enqueue depends only on (cache, rows, logit rows, captured layers,
// argmax), never on which windows close (their count is read on the device), so a shape's
// second call captures it and later calls replay it (steps of up to 16 rows).
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_quant_gemv.h"
#include "backend/cuda/cuda_v4_kernels.h"
#include "core/error.h"
#include "kernels/cpu/rmsnorm.h"
#include "model/config.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v4_config.h"
#include "model/deepseek_v4_weights.h"
#include "model/rope_params.h"
#include "model/slot_state_paged_cache.h"

namespace dsinfer {

namespace cuda {
namespace {

std::string gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(b) / (1ull << 30));
  return buf;
}

uint64_t code_bytes(const QuantWeightView& q) {
  return q.format == QuantFormat::Fp4Group32 ? static_cast<uint64_t>(q.rows) * (q.cols / 2)
                                             : static_cast<uint64_t>(q.rows) * q.cols;
}
uint64_t scale_bytes(const QuantWeightView& q) {
  return q.format == QuantFormat::Fp4Group32 ? static_cast<uint64_t>(q.rows) * (q.cols / 32)
                                             : static_cast<uint64_t>((q.rows + 127) / 128) * ((q.cols + 127) / 128);
}
v4::DevLinear::Kind kind_of(const V4Linear& w) {
  if (w.quantized) return w.quant.format == QuantFormat::Fp4Group32 ? v4::DevLinear::FP4 : v4::DevLinear::FP8;
  return w.plain.dtype == DType::BF16 ? v4::DevLinear::BF16 : v4::DevLinear::F32;
}
QuantDeviceMatrix quant_matrix(const V4Linear& w) {
  return {w.quant.format, w.quant.data, w.quant.scales, w.quant.rows, w.quant.cols};
}
uint64_t plain_bytes(const WeightView& w) { return static_cast<uint64_t>(w.rows * w.cols) * dtype_size(w.dtype); }

struct DevCompressor {
  v4::DevLinear kv, gate;
  float* pos_bias = nullptr;
  float* norm = nullptr;
  int rate = 0, dim = 0;
  bool overlap = false;
  int width() const { return overlap ? 2 * dim : dim; }
};

struct DevLayer {
  V4Attn attn = V4Attn::Sliding;
  bool hash = false;
  v4::DevLinear attn_hc_fn, ffn_hc_fn;
  float *attn_hc_base = nullptr, *attn_hc_scale = nullptr, *ffn_hc_base = nullptr, *ffn_hc_scale = nullptr;
  float *in_norm = nullptr, *post_norm = nullptr;
  v4::DevLinear q_a, q_b, kv, o_b;
  // Every projection of h stacked as one matrix [q_a | kv | comp C | comp Z | idx C | idx Z]
  // (rows at off_*) when all share a format (FP8 pieces of whole 128-row blocks); w == null:
  // the pieces run one by one.
  v4::DevLinear hproj;
  int off_q = 0, off_kv = 0, off_c = 0, off_z = 0, off_ic = 0, off_iz = 0;
  v4::DevLinear o_a;  // one [o_lora, H*d/G] matrix per output group, `stride` apart (run as routed)
  float *q_a_norm = nullptr, *kv_norm = nullptr, *sinks = nullptr;
  DevCompressor comp, idx;
  v4::DevLinear idx_q_b, idx_weights;
  v4::DevLinear router;
  float* score_bias = nullptr;
  int32_t* tid2eid = nullptr;
  // Routed experts packed per projection (stride per expert). ex_gu: gate and up rows of each
  // expert as one [2I, D] matrix (one launch, rows [g | u]) when the format allows it (FP8
  // needs I % 128 == 0 for whole scale blocks); otherwise ex_gate and ex_up.
  v4::DevLinear ex_gu, ex_gate, ex_up, ex_down;
  v4::DevLinear sh_gu, sh_gate, sh_up, sh_down;  // the shared expert, the same way
};

// Per layer and kind, [max_slots][capacity][width] F32 rows in device memory.
class V4CudaState final : public KVCache {
 public:
  struct Layer {
    float* kv = nullptr;          // [cap][d]
    float* comp_raw = nullptr;    // [cap][2 cw]
    float* comp_entry = nullptr;  // [ecap][d]
    float* idx_raw = nullptr;     // [cap][2 cw_I]
    float* idx_entry = nullptr;   // [ecap_I][d_I]
    int ecap = 0, idx_ecap = 0;
  };
  V4CudaState(const void* owner, int max_slots, int max_tokens) : owner_(owner), slots_(max_slots), cap_(max_tokens) {
    len_.assign(static_cast<size_t>(max_slots), 0);
  }
  int max_slots() const override { return slots_; }
  int max_tokens() const override { return cap_; }
  int length(int slot) const override {
    check(slot);
    return len_[slot];
  }
  void truncate(int slot, int n) override {
    check(slot);
    if (n < 0 || n > len_[slot])
      throw Error("truncate: length " + std::to_string(n) + " outside [0, " + std::to_string(len_[slot]) + "] for slot " +
                  std::to_string(slot));
    len_[slot] = n;
  }
  void set_length(int slot, int n) { len_[slot] = n; }
  const void* owner() const { return owner_; }
  std::vector<Layer> layers;
  DeviceArena arena;

 private:
  void check(int slot) const {
    if (slot < 0 || slot >= slots_)
      throw Error("slot " + std::to_string(slot) + " outside [0, " + std::to_string(slots_) + ")");
  }
  const void* owner_;
  int slots_, cap_;
  std::vector<int> len_;
};

class DeepseekV4Cuda final : public Model, public DeepseekV4Info {
 public:
  DeepseekV4Cuda(const ModelConfig& g, const CudaModelOptions& opts);
  ~DeepseekV4Cuda() override {
    drop_graphs();
    if (stream_) cudaStreamDestroy(stream_);
    if (pinned_) cudaFreeHost(pinned_);
  }

  const ModelConfig& config() const override { return gcfg_; }
  std::unique_ptr<KVCache> make_kv_cache(int max_slots, int max_tokens) const override;
  // The batched engine's storage: this model's V4CudaState behind the paged interface
  // (model/slot_state_paged_cache.h); the state holds every slot's full capacity from the
  // start, the blocks only account for it, with no prefix sharing.
  std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                                                    int feature_floats) const override {
    (void)feature_floats;  // the engine keeps the drafter's rows in its host store
    return std::make_unique<SlotStatePagedCache>(make_kv_cache(max_slots, max_tokens), block_size, num_blocks);
  }
  PagedStateShape paged_state_shape() const override { return {std::max<uint64_t>(state_bytes_per_token_, 1), 0, false}; }
  bool on_device() const override { return true; }
  void forward(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out) override {
    run(kv, batch, out, nullptr);
  }
  void forward_argmax(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out, std::vector<int32_t>& ids) override {
    run(kv, batch, out, &ids);
  }
  // The drafters' pieces run on the host copy of the (memory-mapped) checkpoint.
  void embed(const int32_t* ids, int n, float* out) const override {
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= cfg_.vocab)
        throw Error("embed: token id " + std::to_string(ids[i]) + " outside the vocabulary [0, " +
                    std::to_string(cfg_.vocab) + ")");
      weight_row_to_f32(hw_.embed, ids[i], out + static_cast<int64_t>(i) * cfg_.hidden);
    }
  }
  void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const override {
    if (n <= 0) return;
    const int64_t D = cfg_.hidden;
    if (!apply_norm) return v4_matmul(hidden, n, hw_.head, logits);
    std::vector<float> normed(static_cast<size_t>(n) * D);
    rmsnorm(hidden, D, n, D, hw_.final_norm.data(), static_cast<float>(cfg_.eps), normed.data(), D);
    v4_matmul(normed.data(), n, hw_.head, logits);
  }
  uint64_t decode_weight_bytes() const override { return decode_bytes_; }
  const DeepseekV4Config& v4() const override { return cfg_; }
  const V4TensorIndex& index() const override { return *index_; }
  uint64_t weight_bytes() const override { return hw_.matrix_bytes; }

 private:
  v4::DevLinear up(const V4Linear& w);
  v4::DevLinear up_grouped(const V4Linear& w, int groups);
  v4::DevLinear up_stacked(const std::vector<const V4Linear*>& parts);
  v4::DevLinear up_experts(const std::vector<V4Expert>& ex, const V4Linear V4Expert::*which);
  // gate|up of each expert as one matrix (rows [gate | up]); kind F32 with w == nullptr when
  // the format cannot be stacked so.
  v4::DevLinear up_experts_gu(const std::vector<const V4Expert*>& ex);
  float* upf(const std::vector<float>& v) { return v.empty() ? nullptr : weights_.upload(v.data(), v.size()); }
  DevCompressor up_comp(const V4Compressor& c, bool with_matrices);
  void ensure_scratch(int T, int n_logits, int n_cap);
  void run(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out, std::vector<int32_t>* ids);
  void enqueue(V4CudaState& st, int T, int n_logits, const std::vector<int>& caps, bool argmax);
  void attention(const DevLayer& L, int l, V4CudaState& st, int T);
  void moe(const DevLayer& L, int T);
  void drop_graphs() {
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
    seen_.clear();
  }

  ModelConfig gcfg_;
  DeepseekV4Config cfg_;
  CudaModelOptions opts_;
  std::unique_ptr<V4TensorIndex> index_;
  std::deque<std::vector<uint8_t>> owned_;
  V4Weights hw_;  // host views (mmap): embed() and lm_head() for drafters, and the upload source
  uint64_t decode_bytes_ = 0;
  uint64_t state_bytes_per_token_ = 0;  // device state per token of context (every row kept)

  DeviceArena weights_;
  const void* embed_ = nullptr;
  bool embed_bf16_ = false;
  v4::DevLinear head_, hc_head_fn_;
  float *hc_head_base_ = nullptr, *hc_head_scale_ = nullptr, *final_norm_ = nullptr;
  float *main_inv_ = nullptr, *compress_inv_ = nullptr;
  std::vector<DevLayer> layers_;
  cudaStream_t stream_ = nullptr;

  // Row metadata: host pinned staging and its device copy (fixed addresses for graphs).
  struct Meta {
    int32_t *token, *pos, *slot, *logit_row, *njobs;  // njobs[0] CSA-rate jobs, [1] HCA-rate jobs
    v4::PoolJob *jobs_csa, *jobs_hca;
  };
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  DeviceArena scratch_;
  int scratch_T_ = 0, scratch_logits_ = 0, scratch_cap_ = 0;
  Meta meta_{};
  size_t meta_bytes_ = 0;
  float *X_, *z_, *post_, *comb_, *h_, *y_, *qres_, *q_, *kvt_, *C_, *Z_, *iq_, *iw_, *att_, *cat_, *stage_;
  float *elog_, *wts_, *g_, *u_, *act_, *yp_, *sg_, *su_, *sact_, *shared_, *cap_buf_, *rows_, *zh_, *hh_, *logits_;
  float *umix_, *uparts_, *gu_, *sgu_, *hp_;
  double* xparts_;
  int32_t *sel_, *nsel_, *eid_, *ids_, *eid_groups_;
  int64_t stage_floats_ = 0;

  std::map<std::tuple<const void*, int, int, std::vector<int>, bool>, cudaGraphExec_t> graphs_;
  std::map<std::tuple<const void*, int, int, std::vector<int>, bool>, int> seen_;
};

DeepseekV4Cuda::DeepseekV4Cuda(const ModelConfig& g, const CudaModelOptions& opts) : gcfg_(g), opts_(opts) {
  DSINFER_CUDA_CHECK(cudaSetDevice(opts.device));
  cfg_ = parse_deepseek_v4_config(g);
  if (cfg_.hc_mult > 8) throw Error(g.model_dir + "/config.json: field 'hc_mult': " + std::to_string(cfg_.hc_mult) +
                                    " streams; the CUDA backend supports up to 8");
  if (cfg_.rope_dim % 2 != 0 || cfg_.rope_dim > cfg_.head_dim)
    throw Error(g.model_dir + "/config.json: rotary width " + std::to_string(cfg_.rope_dim) + " is not even or exceeds head_dim");
  index_ = std::make_unique<V4TensorIndex>(g.model_dir);
  hw_ = load_deepseek_v4_weights(*index_, cfg_, owned_);
  decode_bytes_ = v4_decode_weight_bytes(hw_, cfg_);

  size_t free_b = 0, total_b = 0;
  DSINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int n_csa = cfg_.count(V4Attn::CSA), n_hca = cfg_.count(V4Attn::HCA);
  // State per token of context on the device (all rows kept: see V4CudaState).
  uint64_t per_tok = 0;
  for (int l = 0; l < cfg_.layers; ++l) {
    per_tok += 4ull * cfg_.head_dim;
    if (cfg_.attn[l] != V4Attn::Sliding) {
      const int m = cfg_.compress_rate(l);
      const uint64_t cw = cfg_.attn[l] == V4Attn::CSA ? 2ull * cfg_.head_dim : cfg_.head_dim;
      per_tok += 4ull * 2 * cw + 4ull * cfg_.head_dim / m + 4;
      if (cfg_.attn[l] == V4Attn::CSA) per_tok += 4ull * 2 * 2 * cfg_.idx_head_dim + 4ull * cfg_.idx_head_dim / m + 4;
    }
  }
  std::fprintf(stderr,
               "deepseek_v4 (cuda): %d layers (%d sliding, %d CSA, %d HCA); weights %s (routed experts %s), %s read per "
               "decode step; device state %llu bytes per token of context per sequence (every row kept); device memory %s free "
               "of %s\n",
               cfg_.layers, cfg_.layers - n_csa - n_hca, n_csa, n_hca, gib(hw_.matrix_bytes).c_str(),
               gib(hw_.expert_bytes).c_str(), gib(decode_bytes_).c_str(), static_cast<unsigned long long>(per_tok),
               gib(free_b).c_str(), gib(total_b).c_str());
  state_bytes_per_token_ = per_tok;
  if (hw_.matrix_bytes + (256ull << 20) > free_b)
    throw Error(g.model_dir + ": DeepSeek-V4 weights need " + gib(hw_.matrix_bytes) + " of device memory but only " +
                gib(free_b) + " is free on the GPU; refusing to load (use a GPU with more memory or a smaller checkpoint)");

  const int r = cfg_.rope_dim;
  const auto main_inv = compute_rope_params(cfg_.rope_main, r, cfg_.max_pos).inv_freq;
  const auto comp_inv = compute_rope_params(cfg_.rope_compress, r, cfg_.max_pos).inv_freq;
  main_inv_ = weights_.upload(main_inv.data(), main_inv.size());
  compress_inv_ = weights_.upload(comp_inv.data(), comp_inv.size());

  embed_bf16_ = hw_.embed.dtype == DType::BF16;
  embed_ = weights_.upload(static_cast<const uint8_t*>(hw_.embed.data), plain_bytes(hw_.embed));
  if (cfg_.tie || (!hw_.head.quantized && hw_.head.plain.data == hw_.embed.data)) {
    head_.kind = embed_bf16_ ? v4::DevLinear::BF16 : v4::DevLinear::F32;
    head_.w = embed_;
    head_.rows = cfg_.vocab;
    head_.cols = cfg_.hidden;
  } else {
    head_ = up(hw_.head);
  }
  hc_head_fn_ = up(hw_.hc_head_fn);
  hc_head_base_ = upf(hw_.hc_head_base);
  hc_head_scale_ = upf(hw_.hc_head_scale);
  final_norm_ = upf(hw_.final_norm);

  layers_.resize(cfg_.layers);
  for (int l = 0; l < cfg_.layers; ++l) {
    const V4LayerWeights& L = hw_.layers[l];
    DevLayer& d = layers_[l];
    d.attn = L.attn;
    d.hash = L.hash;
    d.attn_hc_fn = up(L.attn_hc_fn);
    d.ffn_hc_fn = up(L.ffn_hc_fn);
    d.attn_hc_base = upf(L.attn_hc_base);
    d.attn_hc_scale = upf(L.attn_hc_scale);
    d.ffn_hc_base = upf(L.ffn_hc_base);
    d.ffn_hc_scale = upf(L.ffn_hc_scale);
    d.in_norm = upf(L.in_norm);
    d.post_norm = upf(L.post_norm);
    {
      std::vector<const V4Linear*> parts{&L.q_a, &L.kv};
      if (L.attn != V4Attn::Sliding) parts.insert(parts.end(), {&L.comp.kv, &L.comp.gate});
      if (L.attn == V4Attn::CSA) parts.insert(parts.end(), {&L.idx.kv, &L.idx.gate});
      d.hproj = up_stacked(parts);
      int at = 0;
      int* offs[] = {&d.off_q, &d.off_kv, &d.off_c, &d.off_z, &d.off_ic, &d.off_iz};
      for (size_t i = 0; i < parts.size(); ++i) *offs[i] = at, at += static_cast<int>(parts[i]->rows());
    }
    if (!d.hproj.w) {
      d.q_a = up(L.q_a);
      d.kv = up(L.kv);
    }
    d.q_b = up(L.q_b);
    d.o_b = up(L.o_b);
    d.o_a = up_grouped(L.o_a, cfg_.o_groups);
    d.q_a_norm = upf(L.q_a_norm);
    d.kv_norm = upf(L.kv_norm);
    d.sinks = upf(L.sinks);
    if (L.attn != V4Attn::Sliding) d.comp = up_comp(L.comp, !d.hproj.w);
    if (L.attn == V4Attn::CSA) {
      d.idx = up_comp(L.idx, !d.hproj.w);
      d.idx_q_b = up(L.idx_q_b);
      d.idx_weights = up(L.idx_weights);
    }
    d.router = up(L.router);
    d.score_bias = upf(L.score_bias);
    if (L.hash) d.tid2eid = weights_.upload(L.tid2eid.data(), L.tid2eid.size());
    std::vector<const V4Expert*> ex;
    for (const V4Expert& e : L.experts) ex.push_back(&e);
    d.ex_gu = up_experts_gu(ex);
    if (!d.ex_gu.w) {
      d.ex_gate = up_experts(L.experts, &V4Expert::gate);
      d.ex_up = up_experts(L.experts, &V4Expert::up);
    }
    d.sh_gu = up_experts_gu({&L.shared});
    d.ex_down = up_experts(L.experts, &V4Expert::down);
    if (!d.sh_gu.w) {
      d.sh_gate = up(L.shared.gate);
      d.sh_up = up(L.shared.up);
    }
    d.sh_down = up(L.shared.down);
  }
  DSINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

v4::DevLinear DeepseekV4Cuda::up(const V4Linear& w) {
  v4::DevLinear d;
  d.kind = kind_of(w);
  d.rows = w.rows();
  d.cols = w.cols();
  if (w.quantized) {
    try {
      check_quant_gemv_shape(quant_matrix(w));
    } catch (const Error& e) {
      throw Error(gcfg_.model_dir + ": DeepSeek-V4 (cuda): " + e.what());
    }
    d.w = weights_.upload(w.quant.data, code_bytes(w.quant));
    d.scales = weights_.upload(w.quant.scales, scale_bytes(w.quant));
  } else {
    d.w = weights_.upload(static_cast<const uint8_t*>(w.plain.data), plain_bytes(w.plain));
  }
  return d;
}

// The grouped output projection: w [G * o_lora, H*d/G] as G matrices of o_lora rows, `stride`
// bytes apart, run as "routed" with group g for pair (row t, g): one launch for all groups.
v4::DevLinear DeepseekV4Cuda::up_grouped(const V4Linear& w, int groups) {
  v4::DevLinear d = up(w);
  const int64_t rows = w.rows() / groups;
  if (w.quantized && w.quant.format == QuantFormat::Fp8Block128 && groups > 1 && rows % 128 != 0)
    throw Error(gcfg_.model_dir + ": DeepSeek-V4: grouped output projection rows are not aligned to the FP8 128-row scale blocks");
  d.rows = rows;
  if (!w.quantized) {
    d.stride = rows * w.cols() * static_cast<int64_t>(dtype_size(w.plain.dtype));
  } else if (w.quant.format == QuantFormat::Fp4Group32) {
    d.stride = rows * (w.cols() / 2);
    d.scale_stride = rows * (w.cols() / 32);
  } else {
    d.stride = rows * w.cols();
    d.scale_stride = (rows / 128) * ((w.cols() + 127) / 128);
  }
  return d;
}

v4::DevLinear DeepseekV4Cuda::up_stacked(const std::vector<const V4Linear*>& parts) {
  v4::DevLinear d;
  const V4Linear& p0 = *parts[0];
  int64_t rows = 0;
  for (const V4Linear* p : parts) {
    if (kind_of(*p) != kind_of(p0) || p->cols() != p0.cols()) return d;
    if (p->quantized && p->quant.format == QuantFormat::Fp8Block128 && p->rows() % 128 != 0) return d;
    rows += p->rows();
  }
  d.kind = kind_of(p0);
  d.rows = rows;
  d.cols = p0.cols();
  if (p0.quantized) {
    try {
      check_quant_gemv_shape({p0.quant.format, nullptr, nullptr, rows, p0.cols()});
    } catch (const Error& err) {
      throw Error(gcfg_.model_dir + ": DeepSeek-V4 (cuda): " + err.what());
    }
  }
  uint64_t cb = 0, sb = 0;
  for (const V4Linear* p : parts) {
    cb += p->quantized ? code_bytes(p->quant) : plain_bytes(p->plain);
    sb += p->quantized ? scale_bytes(p->quant) : 0;
  }
  auto* codes = weights_.alloc<uint8_t>(cb);
  auto* scales = sb ? weights_.alloc<uint8_t>(sb) : nullptr;
  uint64_t co = 0, so = 0;
  for (const V4Linear* p : parts) {
    if (p->quantized) {
      DSINFER_CUDA_CHECK(cudaMemcpy(codes + co, p->quant.data, code_bytes(p->quant), cudaMemcpyHostToDevice));
      DSINFER_CUDA_CHECK(cudaMemcpy(scales + so, p->quant.scales, scale_bytes(p->quant), cudaMemcpyHostToDevice));
      co += code_bytes(p->quant);
      so += scale_bytes(p->quant);
    } else {
      DSINFER_CUDA_CHECK(cudaMemcpy(codes + co, p->plain.data, plain_bytes(p->plain), cudaMemcpyHostToDevice));
      co += plain_bytes(p->plain);
    }
  }
  d.w = codes;
  d.scales = scales;
  return d;
}

v4::DevLinear DeepseekV4Cuda::up_experts_gu(const std::vector<const V4Expert*>& ex) {
  v4::DevLinear d;
  const V4Linear& g0 = ex[0]->gate;
  for (const V4Expert* e : ex)
    if (kind_of(e->gate) != kind_of(g0) || kind_of(e->up) != kind_of(g0) || e->gate.rows() != g0.rows() ||
        e->up.rows() != g0.rows() || e->gate.cols() != g0.cols() || e->up.cols() != g0.cols())
      return d;
  if (g0.quantized && g0.quant.format == QuantFormat::Fp8Block128 && g0.rows() % 128 != 0) return d;
  if (g0.quantized) {
    try {
      check_quant_gemv_shape(quant_matrix(g0));
    } catch (const Error& err) {
      throw Error(gcfg_.model_dir + ": DeepSeek-V4 (cuda) experts: " + err.what());
    }
  }
  d.kind = kind_of(g0);
  d.rows = 2 * g0.rows();
  d.cols = g0.cols();
  const uint64_t cb = g0.quantized ? code_bytes(g0.quant) : plain_bytes(g0.plain);
  const uint64_t sb = g0.quantized ? scale_bytes(g0.quant) : 0;
  auto* codes = weights_.alloc<uint8_t>(2 * cb * ex.size());
  auto* scales = sb ? weights_.alloc<uint8_t>(2 * sb * ex.size()) : nullptr;
  for (size_t e = 0; e < ex.size(); ++e)
    for (int h = 0; h < 2; ++h) {
      const V4Linear& w = h == 0 ? ex[e]->gate : ex[e]->up;
      uint8_t* dst = codes + (2 * e + h) * cb;
      if (w.quantized) {
        DSINFER_CUDA_CHECK(cudaMemcpy(dst, w.quant.data, cb, cudaMemcpyHostToDevice));
        DSINFER_CUDA_CHECK(cudaMemcpy(scales + (2 * e + h) * sb, w.quant.scales, sb, cudaMemcpyHostToDevice));
      } else {
        DSINFER_CUDA_CHECK(cudaMemcpy(dst, w.plain.data, cb, cudaMemcpyHostToDevice));
      }
    }
  d.w = codes;
  d.scales = scales;
  d.stride = static_cast<int64_t>(2 * cb);
  d.scale_stride = static_cast<int64_t>(2 * sb);
  return d;
}

v4::DevLinear DeepseekV4Cuda::up_experts(const std::vector<V4Expert>& ex, const V4Linear V4Expert::*which) {
  v4::DevLinear d;
  if (ex.empty()) return d;
  const V4Linear& w0 = ex[0].*which;
  d.kind = kind_of(w0);
  d.rows = w0.rows();
  d.cols = w0.cols();
  const uint64_t cb = w0.quantized ? code_bytes(w0.quant) : plain_bytes(w0.plain);
  const uint64_t sb = w0.quantized ? scale_bytes(w0.quant) : 0;
  auto* codes = weights_.alloc<uint8_t>(cb * ex.size());
  auto* scales = sb ? weights_.alloc<uint8_t>(sb * ex.size()) : nullptr;
  for (size_t e = 0; e < ex.size(); ++e) {
    const V4Linear& w = ex[e].*which;
    if (w.quantized && e == 0) {
      try {
        check_quant_gemv_shape(quant_matrix(w));
      } catch (const Error& err) {
        throw Error(gcfg_.model_dir + ": DeepSeek-V4 (cuda) experts: " + err.what());
      }
    }
    if (kind_of(w) != d.kind || w.rows() != d.rows || w.cols() != d.cols)
      throw Error("DeepSeek-V4 (cuda): expert " + std::to_string(e) +
                  " is stored in another format than expert 0 of its layer; the CUDA backend packs a layer's experts "
                  "in one format");
    if (w.quantized) {
      DSINFER_CUDA_CHECK(cudaMemcpy(codes + e * cb, w.quant.data, cb, cudaMemcpyHostToDevice));
      DSINFER_CUDA_CHECK(cudaMemcpy(scales + e * sb, w.quant.scales, sb, cudaMemcpyHostToDevice));
    } else {
      DSINFER_CUDA_CHECK(cudaMemcpy(codes + e * cb, w.plain.data, cb, cudaMemcpyHostToDevice));
    }
  }
  d.w = codes;
  d.scales = scales;
  d.stride = static_cast<int64_t>(cb);
  d.scale_stride = static_cast<int64_t>(sb);
  return d;
}

DevCompressor DeepseekV4Cuda::up_comp(const V4Compressor& c, bool with_matrices) {
  DevCompressor d;
  if (with_matrices) {
    d.kv = up(c.kv);
    d.gate = up(c.gate);
  }
  d.pos_bias = upf(c.pos_bias);
  d.norm = upf(c.norm);
  d.rate = c.rate;
  d.dim = c.dim;
  d.overlap = c.overlap;
  return d;
}

std::unique_ptr<KVCache> DeepseekV4Cuda::make_kv_cache(int max_slots, int max_tokens) const {
  if (max_slots <= 0 || max_tokens <= 0)
    throw Error("DeepSeek-V4 (cuda) state: slots and tokens must be positive (got " + std::to_string(max_slots) + " x " +
                std::to_string(max_tokens) + ")");
  auto st = std::make_unique<V4CudaState>(this, max_slots, max_tokens);
  const int64_t S = max_slots, cap = max_tokens, d = cfg_.head_dim, dI = cfg_.idx_head_dim;
  uint64_t need = 0;
  std::vector<std::tuple<int, int, int>> shapes;  // per layer: cw, ecap, idx_ecap
  for (int l = 0; l < cfg_.layers; ++l) {
    int cw = 0, ecap = 0, iecap = 0;
    need += S * cap * d * 4;
    if (cfg_.attn[l] != V4Attn::Sliding) {
      const int m = cfg_.compress_rate(l);
      cw = cfg_.attn[l] == V4Attn::CSA ? 2 * d : d;
      ecap = max_tokens / m + 1;
      need += S * cap * 2 * cw * 4 + S * ecap * d * 4;
      if (cfg_.attn[l] == V4Attn::CSA) {
        iecap = max_tokens / m + 1;
        if (max_tokens / m > v4::max_indexer_entries())
          throw Error("DeepSeek-V4 (cuda) state: " + std::to_string(max_tokens) + " tokens per sequence give " +
                      std::to_string(max_tokens / m) + " indexer entries, above the " +
                      std::to_string(v4::max_indexer_entries()) + " the CUDA top-k supports; lower the context length");
        need += S * cap * 2 * 2 * dI * 4 + S * iecap * dI * 4;
      }
    }
    shapes.emplace_back(cw, ecap, iecap);
  }
  size_t free_b = 0, total_b = 0;
  DSINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need > static_cast<uint64_t>(static_cast<double>(free_b) * opts_.cache_prealloc_ratio))
    throw Error("DeepSeek-V4 (cuda) state: " + std::to_string(max_slots) + " slots x " + std::to_string(max_tokens) +
                " tokens need " + gib(need) + " of device memory but only " + gib(free_b) +
                " is free (--cache-prealloc-ratio " + std::to_string(opts_.cache_prealloc_ratio) +
                "); lower the context length or the number of sequences");
  st->layers.resize(cfg_.layers);
  for (int l = 0; l < cfg_.layers; ++l) {
    auto& L = st->layers[l];
    const auto [cw, ecap, iecap] = shapes[l];
    L.kv = st->arena.alloc<float>(S * cap * d);
    if (cw) {
      L.comp_raw = st->arena.alloc<float>(S * cap * 2 * cw);
      L.comp_entry = st->arena.alloc<float>(S * ecap * d);
      L.ecap = ecap;
    }
    if (iecap) {
      L.idx_raw = st->arena.alloc<float>(S * cap * 2 * 2 * dI);
      L.idx_entry = st->arena.alloc<float>(S * iecap * dI);
      L.idx_ecap = iecap;
    }
  }
  return st;
}

void DeepseekV4Cuda::ensure_scratch(int T, int n_logits, int n_cap) {
  if (T <= scratch_T_ && n_logits <= scratch_logits_ && n_cap <= scratch_cap_) return;
  drop_graphs();  // graphs hold the old addresses
  scratch_.release();
  T = std::max(T, scratch_T_);
  n_logits = std::max(n_logits, scratch_logits_);
  n_cap = std::max(n_cap, scratch_cap_);
  const int64_t D = cfg_.hidden, n = cfg_.hc_mult, M = cfg_.hc_mix(), Hd = int64_t(cfg_.heads) * cfg_.head_dim;
  const int64_t cwmax = std::max<int64_t>(2 * cfg_.head_dim, 2 * cfg_.idx_head_dim);
  const int64_t PK = int64_t(T) * cfg_.top_k, I = cfg_.moe_inter, GO = int64_t(cfg_.o_groups) * cfg_.o_lora;
  const int64_t gin = Hd / std::max(cfg_.o_groups, 1);
  auto f = [&](int64_t count) { return scratch_.alloc<float>(static_cast<size_t>(count)); };
  auto i32 = [&](int64_t count) { return scratch_.alloc<int32_t>(static_cast<size_t>(count)); };
  X_ = f(T * n * D);
  z_ = f(T * M);
  post_ = f(T * n);
  comb_ = f(T * n * n);
  h_ = f(T * D);
  y_ = f(T * D);
  qres_ = f(T * int64_t(cfg_.q_lora));
  q_ = f(T * Hd);
  kvt_ = f(T * int64_t(cfg_.head_dim));
  C_ = f(T * cwmax);
  Z_ = f(T * cwmax);
  iq_ = f(T * int64_t(cfg_.idx_heads) * cfg_.idx_head_dim);
  iw_ = f(T * int64_t(cfg_.idx_heads));
  att_ = f(T * Hd);
  cat_ = f(T * GO);
  // Staging: strided quantized rows (the grouped projection) or split-K partials (at most
  // 32 chunks of 512 per output of a matrix under 1024 rows, see v4::linear).
  // Staging: strided rows for a quantized matrix (the q_a rows of the stacked projection, read
  // by q_b and the indexer's q_b: x and y of m rows) or split-K partials (see v4::linear).
  const int64_t widest = std::max<int64_t>({Hd, int64_t(cfg_.idx_heads) * cfg_.idx_head_dim, gin + cfg_.o_lora});
  stage_floats_ = std::max<int64_t>(T * (cfg_.q_lora + widest), int64_t(std::max(T, n_logits)) * v4::max_split_partials());
  stage_ = f(stage_floats_);
  elog_ = f(T * int64_t(cfg_.experts));
  wts_ = f(PK);
  g_ = f(PK * I);
  u_ = f(PK * I);
  act_ = f(PK * I);
  yp_ = f(PK * D);
  sg_ = f(T * I);
  su_ = f(T * I);
  sact_ = f(T * I);
  shared_ = f(T * D);
  cap_buf_ = f(T * int64_t(n_cap) * D);
  rows_ = f(int64_t(n_logits) * n * D);
  zh_ = f(int64_t(n_logits) * n);
  hh_ = f(int64_t(n_logits) * D);
  logits_ = f(int64_t(n_logits) * cfg_.vocab);
  const int TL = std::max(T, n_logits);
  xparts_ = scratch_.alloc<double>(static_cast<size_t>(TL) * v4::sumsq_chunks(n * D));
  umix_ = f(TL * D);
  uparts_ = f(TL * ((D + 255) / 256));
  gu_ = f(PK * 2 * I);
  {
    int64_t hrows = 0;
    for (const DevLayer& L : layers_) hrows = std::max<int64_t>(hrows, L.hproj.w ? L.hproj.rows : 0);
    hp_ = f(T * hrows);
  }
  sgu_ = f(T * 2 * I);
  {
    // Group of each (row, group) pair of the grouped output projection: p % G.
    const int G = std::max(cfg_.o_groups, 1);
    std::vector<int32_t> groups(static_cast<size_t>(T) * G);
    for (size_t p = 0; p < groups.size(); ++p) groups[p] = static_cast<int32_t>(p % G);
    eid_groups_ = i32(static_cast<int64_t>(groups.size()));
    DSINFER_CUDA_CHECK(cudaMemcpy(eid_groups_, groups.data(), groups.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  sel_ = i32(T * int64_t(std::max(cfg_.idx_topk, 1)));
  nsel_ = i32(T);
  eid_ = i32(PK);
  ids_ = i32(n_logits);
  // Row metadata: tokens, positions, slots, logit rows, 2 job counts, 2 job lists.
  meta_bytes_ = sizeof(int32_t) * (3 * size_t(T) + n_logits + 2) + sizeof(v4::PoolJob) * 2 * size_t(T);
  auto* base = scratch_.alloc<uint8_t>(meta_bytes_);
  meta_.token = reinterpret_cast<int32_t*>(base);
  meta_.pos = meta_.token + T;
  meta_.slot = meta_.pos + T;
  meta_.logit_row = meta_.slot + T;
  meta_.njobs = meta_.logit_row + n_logits;
  meta_.jobs_csa = reinterpret_cast<v4::PoolJob*>(meta_.njobs + 2);
  meta_.jobs_hca = meta_.jobs_csa + T;
  if (pinned_bytes_ < meta_bytes_) {
    if (pinned_) cudaFreeHost(pinned_);
    DSINFER_CUDA_CHECK(cudaMallocHost(&pinned_, meta_bytes_));
    pinned_bytes_ = meta_bytes_;
  }
  scratch_T_ = T;
  scratch_logits_ = n_logits;
  scratch_cap_ = n_cap;
}

void DeepseekV4Cuda::run(KVCache& kv_base, const ForwardBatch& batch, ForwardOutput& out, std::vector<int32_t>* ids) {
  // The state: a V4CudaState (make_kv_cache), or the engine's paged storage around one,
  // whose table lengths and capacities rule (make_paged_kv_cache).
  auto* paged = dynamic_cast<SlotStatePagedCache*>(&kv_base);
  auto* st = dynamic_cast<V4CudaState*>(paged ? &paged->state() : &kv_base);
  if (!st || st->owner() != this)
    throw Error("forward: KV cache was not created by this model's make_kv_cache or make_paged_kv_cache");
  if (batch.capture_to_cache) throw Error("forward: capture_to_cache is not supported by the DeepSeek-V4 CUDA model");
  const int64_t D = cfg_.hidden, V = cfg_.vocab;
  const ForwardBatchSize bs =
      paged ? paged->begin_forward(batch, V, cfg_.layers)
            : check_forward_batch(batch, *st, V, cfg_.layers, [&](int) { return int64_t(st->max_tokens()); });
  const int64_t T = bs.rows, n_logits = bs.logit_rows;
  const int n_cap = static_cast<int>(batch.capture_layers.size());
  out.vocab_size = static_cast<int>(V);
  out.hidden_size = static_cast<int>(D);
  out.logits.clear();
  out.captured.assign(static_cast<size_t>(T * n_cap * D), 0.0f);
  if (ids) ids->assign(static_cast<size_t>(n_logits), 0);
  if (!ids) out.logits.resize(static_cast<size_t>(n_logits * V));
  if (T == 0) return;

  ensure_scratch(static_cast<int>(T), static_cast<int>(n_logits), n_cap);
  // Host staging of the metadata, same layout as meta_.
  auto* h = static_cast<uint8_t*>(pinned_);
  const int Ts = scratch_T_, Ls = scratch_logits_;
  auto* token = reinterpret_cast<int32_t*>(h);
  int32_t* pos = token + Ts;
  int32_t* slot = pos + Ts;
  int32_t* lrow = slot + Ts;
  int32_t* njobs = lrow + Ls;
  auto* jobs_csa = reinterpret_cast<v4::PoolJob*>(njobs + 2);
  v4::PoolJob* jobs_hca = jobs_csa + Ts;
  njobs[0] = njobs[1] = 0;
  {
    int64_t r = 0, lr = 0;
    for (const ForwardEntry& en : batch.entries) {
      const int start = st->length(en.slot), n = static_cast<int>(en.tokens.size());
      for (int r2 : en.logit_rows) lrow[lr++] = static_cast<int32_t>(r + r2);
      for (int i = 0; i < n; ++i, ++r) {
        token[r] = en.tokens[i];
        pos[r] = start + i;
        slot[r] = en.slot;
      }
      for (int w = start / cfg_.rate_csa; w < (start + n) / cfg_.rate_csa; ++w) jobs_csa[njobs[0]++] = {en.slot, w};
      for (int w = start / cfg_.rate_hca; w < (start + n) / cfg_.rate_hca; ++w) jobs_hca[njobs[1]++] = {en.slot, w};
    }
  }
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(meta_.token, pinned_, meta_bytes_, cudaMemcpyHostToDevice, stream_));

  const bool argmax = ids != nullptr;
  const int Ti = static_cast<int>(T), Li = static_cast<int>(n_logits);
  auto key = std::make_tuple(static_cast<const void*>(st), Ti, Li, batch.capture_layers, argmax);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    DSINFER_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  } else if (opts_.use_graphs && Ti <= 16 && ++seen_[key] >= 2) {
    cudaGraphExec_t g = capture_graph(stream_, [&] { enqueue(*st, Ti, Li, batch.capture_layers, argmax); },
                                      "deepseek_v4 forward graph");
    graphs_[key] = g;
    DSINFER_CUDA_CHECK(cudaGraphLaunch(g, stream_));
  } else {
    enqueue(*st, Ti, Li, batch.capture_layers, argmax);
  }
  if (n_cap)
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(out.captured.data(), cap_buf_, sizeof(float) * out.captured.size(),
                                       cudaMemcpyDeviceToHost, stream_));
  if (argmax && n_logits)
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(ids->data(), ids_, sizeof(int32_t) * n_logits, cudaMemcpyDeviceToHost, stream_));
  if (!argmax && n_logits)
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(out.logits.data(), logits_, sizeof(float) * out.logits.size(),
                                       cudaMemcpyDeviceToHost, stream_));
  DSINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (const ForwardEntry& en : batch.entries) {
    st->set_length(en.slot, st->length(en.slot) + static_cast<int>(en.tokens.size()));
    if (paged) paged->set_length(en.slot, st->length(en.slot));
  }
}

void DeepseekV4Cuda::enqueue(V4CudaState& st, int T, int n_logits, const std::vector<int>& caps, bool argmax) {
  cudaStream_t s = stream_;
  const int64_t D = cfg_.hidden, n = cfg_.hc_mult, W = n * D, M = cfg_.hc_mix();
  const float eps = static_cast<float>(cfg_.eps), hc_eps = static_cast<float>(cfg_.hc_eps);
  const int n_cap = static_cast<int>(caps.size());
  const v4::RowMeta rows{meta_.token, meta_.pos, meta_.slot};
  auto capture = [&](int layer_id) {
    for (int c = 0; c < n_cap; ++c)
      if (caps[c] == layer_id) v4::capture_mean(X_, T, static_cast<int>(n), D, cap_buf_ + c * D, n_cap * D, s);
  };
  v4::embed_streams(embed_, embed_bf16_, D, rows, T, static_cast<int>(n), X_, s);
  capture(-1);
  for (int l = 0; l < cfg_.layers; ++l) {
    const DevLayer& L = layers_[l];
    v4::sumsq_parts(X_, T, W, xparts_, s);
    v4::linear(L.attn_hc_fn, X_, W, T, z_, M, stage_, stage_floats_, s);
    v4::hc_site(z_, {L.attn_hc_base, L.attn_hc_scale}, static_cast<int>(n), cfg_.hc_iters, hc_eps, xparts_, X_, T, D,
                L.in_norm, eps, false, umix_, uparts_, post_, comb_, h_, s);
    attention(L, l, st, T);
    v4::hc_post(post_, comb_, y_, T, static_cast<int>(n), D, X_, s);
    v4::sumsq_parts(X_, T, W, xparts_, s);
    v4::linear(L.ffn_hc_fn, X_, W, T, z_, M, stage_, stage_floats_, s);
    v4::hc_site(z_, {L.ffn_hc_base, L.ffn_hc_scale}, static_cast<int>(n), cfg_.hc_iters, hc_eps, xparts_, X_, T, D,
                L.post_norm, eps, false, umix_, uparts_, post_, comb_, h_, s);
    moe(L, T);
    v4::hc_post_moe(post_, comb_, yp_, eid_, wts_, shared_, cfg_.top_k, T, static_cast<int>(n), D, X_, s);
    capture(l);
  }
  if (n_logits == 0) return;
  v4::gather_rows(X_, W, meta_.logit_row, n_logits, rows_, s);
  v4::sumsq_parts(rows_, n_logits, W, xparts_, s);
  v4::linear(hc_head_fn_, rows_, W, n_logits, zh_, n, stage_, stage_floats_, s);
  v4::hc_site(zh_, {hc_head_base_, hc_head_scale_}, static_cast<int>(n), 0, hc_eps, xparts_, rows_, n_logits, D,
              final_norm_, eps, true, umix_, uparts_, nullptr, nullptr, hh_, s);
  v4::linear(head_, hh_, D, n_logits, logits_, cfg_.vocab, stage_, stage_floats_, s);
  if (argmax) v4::argmax_rows(logits_, n_logits, cfg_.vocab, ids_, s);
}

void DeepseekV4Cuda::attention(const DevLayer& L, int l, V4CudaState& st, int T) {
  cudaStream_t s = stream_;
  const int D = cfg_.hidden, H = cfg_.heads, d = cfg_.head_dim, qr = cfg_.q_lora;
  const int Hd = H * d, half = cfg_.rope_dim / 2;
  const float eps = static_cast<float>(cfg_.eps);
  const bool sliding = L.attn == V4Attn::Sliding, csa = L.attn == V4Attn::CSA;
  const float* inv = sliding ? main_inv_ : compress_inv_;
  const v4::RowMeta rows{meta_.token, meta_.pos, meta_.slot};
  const V4CudaState::Layer& S = st.layers[l];
  const int cap = st.max_tokens();

  // Every projection of h: one stacked launch, or one launch per piece.
  const bool stacked = L.hproj.w != nullptr;
  const int64_t ldh = stacked ? L.hproj.rows : 0;
  float* qres = stacked ? hp_ + L.off_q : qres_;
  float* kvr = stacked ? hp_ + L.off_kv : kvt_;
  const int64_t ldq = stacked ? ldh : qr, ldkv = stacked ? ldh : d;
  if (stacked) {
    v4::linear(L.hproj, h_, D, T, hp_, ldh, stage_, stage_floats_, s);
  } else {
    v4::linear(L.q_a, h_, D, T, qres_, qr, stage_, stage_floats_, s);
    v4::linear(L.kv, h_, D, T, kvt_, d, stage_, stage_floats_, s);
  }
  v4::rmsnorm_rows(qres, ldq, T, qr, L.q_a_norm, eps, s);
  v4::linear(L.q_b, qres, ldq, T, q_, Hd, stage_, stage_floats_, s);
  v4::head_rms_rope(q_, T, H, d, half, inv, meta_.pos, eps, s);
  v4::kv_norm_rope_store(kvr, ldkv, T, d, L.kv_norm, eps, half, inv, rows, S.kv, cap, s);

  if (!sliding) {
    auto compress = [&](const DevCompressor& X, int off_c, int off_z, float* raw, float* entries, int ecap) {
      const int cw = X.width();
      const float *C = C_, *Z = Z_;
      int64_t ld = cw;
      if (stacked) {
        C = hp_ + off_c, Z = hp_ + off_z, ld = ldh;
      } else {
        v4::linear(X.kv, h_, D, T, C_, cw, stage_, stage_floats_, s);
        v4::linear(X.gate, h_, D, T, Z_, cw, stage_, stage_floats_, s);
      }
      v4::store_raw(C, Z, ld, T, cw, rows, raw, cap, s);
      const bool at_csa_rate = X.rate == cfg_.rate_csa;
      v4::pool_windows(raw, cap, entries, ecap, at_csa_rate ? meta_.jobs_csa : meta_.jobs_hca,
                       meta_.njobs + (at_csa_rate ? 0 : 1), T, X.rate, X.dim, X.overlap, X.pos_bias, X.norm, eps, half,
                       compress_inv_, s);
    };
    compress(L.comp, L.off_c, L.off_z, S.comp_raw, S.comp_entry, S.ecap);
    if (csa) {
      compress(L.idx, L.off_ic, L.off_iz, S.idx_raw, S.idx_entry, S.idx_ecap);
      const int HI = cfg_.idx_heads, dI = cfg_.idx_head_dim;
      v4::linear(L.idx_q_b, qres, ldq, T, iq_, HI * dI, stage_, stage_floats_, s);
      v4::head_rope(iq_, T, HI, dI, half, compress_inv_, meta_.pos, s);
      v4::linear(L.idx_weights, h_, D, T, iw_, HI, stage_, stage_floats_, s);
      v4::indexer_topk(iq_, iw_, T, HI, dI, rows, S.idx_entry, S.idx_ecap, L.idx.rate, cfg_.idx_topk, sel_, nsel_, s);
    }
  }
  v4::attention_rows(q_, T, H, d, half, inv, rows, S.kv, cap, cfg_.window, sliding ? 0 : csa ? 1 : 2, S.comp_entry,
                     S.ecap, sliding ? 1 : L.comp.rate, sel_, nsel_, std::max(cfg_.idx_topk, 1), L.sinks, att_, s);
  const int G = cfg_.o_groups, orank = cfg_.o_lora, gin = Hd / G;
  (void)gin;
  v4::linear_routed(L.o_a, eid_groups_, T * G, att_, 1, cat_, s);
  v4::linear(L.o_b, cat_, G * orank, T, y_, D, stage_, stage_floats_, s);
}

void DeepseekV4Cuda::moe(const DevLayer& L, int T) {
  cudaStream_t s = stream_;
  const int D = cfg_.hidden, E = cfg_.experts, K = cfg_.top_k, I = cfg_.moe_inter;
  const float limit = static_cast<float>(cfg_.swiglu_limit);
  v4::linear(L.router, h_, D, T, elog_, E, stage_, stage_floats_, s);
  v4::moe_route(elog_, T, E, K, cfg_.sigmoid_scores, L.hash ? nullptr : L.score_bias, L.hash ? L.tid2eid : nullptr,
                meta_.token, static_cast<float>(cfg_.routed_scale), eid_, wts_, s);
  const int P = T * K;
  if (L.ex_gu.w) {
    v4::linear_routed(L.ex_gu, eid_, P, h_, K, gu_, s);
    v4::swiglu_rows(gu_, P, I, limit, act_, s);
  } else {
    v4::linear_routed(L.ex_gate, eid_, P, h_, K, g_, s);
    v4::linear_routed(L.ex_up, eid_, P, h_, K, u_, s);
    v4::swiglu_clamp(g_, u_, static_cast<int64_t>(P) * I, limit, act_, s);
  }
  v4::linear_routed(L.ex_down, eid_, P, act_, 1, yp_, s);
  if (L.sh_gu.w) {
    v4::linear(L.sh_gu, h_, D, T, sgu_, 2 * I, stage_, stage_floats_, s);
    v4::swiglu_rows(sgu_, T, I, limit, sact_, s);
  } else {
    v4::linear(L.sh_gate, h_, D, T, sg_, I, stage_, stage_floats_, s);
    v4::linear(L.sh_up, h_, D, T, su_, I, stage_, stage_floats_, s);
    v4::swiglu_clamp(sg_, su_, static_cast<int64_t>(T) * I, limit, sact_, s);
  }
  v4::linear(L.sh_down, sact_, I, T, shared_, D, stage_, stage_floats_, s);
}

}  // namespace
}  // namespace cuda

std::unique_ptr<Model> load_deepseek_v4_cuda(const std::string& model_dir, const CudaModelOptions& opts) {
  const ModelConfig cfg = load_model_config(model_dir);
  return std::make_unique<cuda::DeepseekV4Cuda>(cfg, opts);
}

}  // namespace dsinfer
