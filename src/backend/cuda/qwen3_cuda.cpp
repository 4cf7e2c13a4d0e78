// dsinfer CUDA backend: the Qwen3 dense model on one GPU (see cuda_backend.h).
//
// Data flow of forward(): the host validates the batch exactly as the CPU model does, then
// flattens it into rows: for every new token its id, its position (slot length + i) and
// its slot, plus the indices of the rows whose logits are wanted. That metadata is the only
// host-to-device copy (one pinned buffer). On the device: embedding gather -> RoPE tables ->
// per layer [RMSNorm + one QKV GEMM (q|k|v weights concatenated) -> q/k norm + RoPE, K/V
// into the cache -> attention over the cache -> o GEMM added into x -> RMSNorm +
// one gate|up GEMM (rows interleaved) + SwiGLU -> down GEMM added into x] -> final RMSNorm +
// LM head over the wanted rows -> (argmax). "+" marks what runs fused in one GEMM launch
// (cuda_gemm.h): six launches per layer. Back to the host: argmax ids (forward_argmax), or the logit rows,
// and captured layer outputs only when asked. With capture_to_cache (the batched engine with
// the GPU drafter) the captured rows stay on the device instead: as the forward passes each
// captured layer, one kernel stores its rows, BF16, in the paged pool's feature rows at each
// row's position (cuda_paged_kv_cache.h), inside the forward's graph, where the drafter's
// commit gathers them.
//
// Persistent decode (cuda_persistent_decode.h): a call of exactly one row (batch-1 decode)
// runs the whole forward as one kernel instead of the six launches per layer, with the same
// bits (options.persistent_decode, DSINFER_CUDA_PERSISTENT=0 turns it off); its op list
// (per cache and captured layers) is built once and lives next to the graphs.
//
// CUDA graphs: a call with at most 256 rows is padded to a bucketed row count (padding
// rows have slot -1: they touch no cache and no real row) and a bucketed logit-row count
// (graph_bucket: exact up to 8, then multiples of 4, 8 and 32; DSINFER_CUDA_GRAPH_BUCKETS=pow2
// pads to powers of two as before); the second call of a (cache, rows, logit rows, captured layers) shape captures the
// whole enqueue (layer captures into a device buffer included) into a graph and later calls
// replay it, so steady-state decode and verify steps cost one launch instead of ~10 per
// layer, with a drafter's layer capture too. Graphs bake in device addresses: growing the
// workspace or the capture buffer drops them, and each cache has its own.
//
// Numerics: weights BF16; activations F32 between kernels and rounded to BF16 only as GEMM
// inputs (as the CPU's bf16 matmul precision does); F32 accumulation everywhere; K/V stored
// BF16. Batch invariance (opts.batch_invariant): every kernel, the GEMM included, computes
// a row in an order fixed by the row alone (cuda_gemm.h, cuda_attention.h), and padding
// rows are independent rows, so graph replay and eager runs give the same bits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_drafter.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_cache.h"
#include "backend/cuda/cuda_layer_tail.h"
#include "backend/cuda/cuda_nccl.h"
#include "backend/cuda/cuda_paged_kv_cache.h"
#include "backend/cuda/cuda_persistent_decode.h"
#include "backend/cuda/cuda_sampling.h"
#include "backend/cuda/cuda_target.h"
#include "core/env.h"
#include "core/error.h"
#include "model/config.h"
#include "model/device_verify.h"
#include "model/qwen3_layer.h"
#include "model/rope_params.h"
#include "model/tensor_parallel.h"
#include "model/tensor_parallel_group.h"
#include "model/weights.h"

namespace dsinfer {

namespace cuda {
namespace {

struct LayerWeights {
  bf16 *qkv = nullptr, *o = nullptr, *gu = nullptr, *down = nullptr;
  float *qkv_bias = nullptr, *o_bias = nullptr;
  float *q_norm = nullptr, *k_norm = nullptr, *in_norm = nullptr, *post_norm = nullptr;
};

int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Rows a graph shape is padded to: graph_rows_bucket (cuda_graph.h), or powers of two
// (DSINFER_CUDA_GRAPH_BUCKETS=pow2); each (rows, logit rows, captures) shape captured once.
int graph_bucket(int n, bool pow2) { return pow2 ? pow2_at_least(n) : graph_rows_bucket(n); }

constexpr int kMaxGraphRows = 256;

// One tensor-parallel rank of a CudaQwen3Model (model/tensor_parallel.h): the whole
// model's config and the plan (to read the rank's slices), and the all-reduce of a [rows,
// hidden] F32 device buffer, ordered on the stream it is given. reduce_in_graphs: whether
// it may be captured into a CUDA graph (NCCL's is; the host-memory one is not, so its
// forwards run eagerly).
using CudaRankReduce = std::function<void(float* rows, int64_t n, cudaStream_t stream)>;
struct CudaRankSpec {
  ModelConfig full;
  TensorParallelPlan plan;
  int rank = 0;
  CudaRankReduce reduce;
  bool reduce_in_graphs = false;
};

class CudaQwen3Model final : public Model, public CudaTarget, public DeviceVerifier {
 public:
  // rank (tensor parallelism): cfg is the rank's view of the config (its head and feature
  // counts), rank->full the whole model's; the projections are the rank's share and the o
  // and down outputs go through rank->reduce (load_qwen3_cuda_tensor_parallel).
  CudaQwen3Model(const ModelConfig& cfg, const CudaModelOptions& opts, const CudaRankSpec* rank = nullptr);
  ~CudaQwen3Model() override;

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<KVCache> make_kv_cache(int max_slots, int max_tokens) const override;
  // With feature_floats > 0 the pool keeps the drafter's feature rows too (device memory).
  std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                                                    int feature_floats) const override;
  int64_t device_kv_blocks(int block_size, double prealloc_ratio, int feature_floats) const override;
  bool on_device() const override { return true; }
  // The checkpoint's embedding / LM head as host views (mapped, never copied): a drafter
  // whose frozen copies are bit-identical shares them (and runs its head through lm_head()).
  const WeightView* host_embedding() const override { return host_embed_.data ? &host_embed_ : nullptr; }
  const WeightView* host_lm_head() const override { return host_head_.data ? &host_head_ : nullptr; }
  void forward(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out) override { run(kv, batch, out, nullptr); }
  void forward_argmax(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out, std::vector<int32_t>& ids) override {
    run(kv, batch, out, &ids);
  }
  // DeviceVerifier (model/device_verify.h): sampling and rejection sampling on the GPU
  // (cuda_sampling.h); only (accepted, next token) per request crosses to the host.
  bool verifies_on_device() const override { return device_sampling_; }
  void forward_verify(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out,
                      std::vector<VerifyRequest>& reqs) override {
    run(kv, batch, out, nullptr, &reqs);
  }
  void embed(const int32_t* ids, int n, float* out) const override;
  void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const override;
  uint64_t decode_weight_bytes() const override { return decode_bytes_; }
  // CudaTarget: what the GPU drafter (cuda_drafter.h) reads from the target.
  const bf16* device_embedding() const override { return embed_; }
  const bf16* device_lm_head() const override { return head_; }
  int device_ordinal() const override { return opts_.device; }
  bool gemm_batch_invariant() const override { return opts_.batch_invariant; }
  bool graphs_enabled() const override { return opts_.use_graphs; }
  int64_t persistent_calls() const { return persistent_calls_; }
  int64_t fused_tail_calls() const { return fused_tail_calls_; }

 private:
  void run(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out, std::vector<int32_t>* ids,
           std::vector<VerifyRequest>* reqs = nullptr);
  // forward_verify's part after the forward's LM head: uploads the requests, runs the
  // sampling kernels on the stream; finish_verify reads the results after the sync.
  void enqueue_verify(const ForwardBatch& batch, std::vector<VerifyRequest>& reqs);
  void finish_verify(std::vector<VerifyRequest>& reqs);
  bool device_sampling_ = true;  // DSINFER_CUDA_SAMPLING (default 1)
  std::vector<char> vblob_;      // host image of the verify inputs (then the results)
  void* vdev_ = nullptr;         // device copy of vblob_ (stream-ordered allocation per call)
  float* vq_ = nullptr;          // device q rows of this call
  size_t v_result_off_ = 0;
  // One caller at a time on the stream and the workspaces: forwards, and embed()/lm_head()
  // from a drafter (which may run on another thread, the engine's async prefetch).
  mutable std::mutex mu_;
  // Host views of the checkpoint's embedding and LM head for drafters (host_embedding()):
  // the BF16 tensors as mapped from the file (no copy); empty for other dtypes.
  std::unique_ptr<WeightStore> host_store_;
  WeightView host_embed_{}, host_head_{};
  // lm_head()'s device buffers (grow-only): hidden rows in, BF16 rows, logits.
  mutable DeviceArena head_ws_;
  mutable int head_rows_ = 0;
  mutable float *head_in_ = nullptr, *head_out_ = nullptr;
  mutable bf16* head_bf_ = nullptr;
  // pool: the captured layers go straight into its drafter feature rows (capture_to_cache),
  // else into cap_ (F32, for the host).
  void enqueue(const DeviceKVStorage& kv, int T, int n_logits, const std::vector<int>& capture_layers, bool with_argmax,
               CudaPagedKVCache* pool);
  // The persistent kernel's op list for (cache, captured layers, with LM head): built on
  // first use, freed with the graphs (it points into the workspace).
  const std::pair<PersistentOp*, int>& persistent_ops(const DeviceKVStorage& kv, const std::vector<int>& capture_layers,
                                                      bool head);
  int64_t persistent_calls_ = 0;
  int64_t fused_tail_calls_ = 0;
  // DSINFER_CUDA_PERSISTENT_PROFILE=1: the kernel records when each block finished each op
  // and when block 0 left each barrier (PersistentParams::timing); per op kind, the phase
  // time, the mean and slowest block's work and the barrier wait are printed at exit.
  unsigned long long* persistent_timing_ = nullptr;
  int persistent_timing_ops_ = 0;
  struct PhaseStat {
    double phase_us = 0, mean_work_us = 0, max_work_us = 0, barrier_us = 0;
    int64_t n = 0;
  };
  std::map<std::string, PhaseStat> persistent_stats_;
  int64_t persistent_profiled_ = 0;
  double persistent_total_us_ = 0;
  void collect_persistent_timing();
  // DSINFER_CUDA_ATTN_PROFILE=1: the folded attention kernel of every layer stamps its blocks
  // (entry, after the wait, q staged, done; cuda_attention.h); per one-row forward the host
  // sums the kernel's span (first entry to last done) and the time from one layer's last
  // done to the next layer's first entry (o, gate/up, down and QKV GEMMs with their launch
  // gaps), printed at exit: an in-graph timeline without Nsight Systems.
  unsigned long long* attn_timing_ = nullptr;
  struct AttnStat {
    double span_us = 0, between_us = 0;
    double step_us[7] = {};  // thread 0's steps, mean over blocks (collect_attn_timing)
    int64_t forwards = 0, layers = 0, gaps = 0;
  } attn_stat_;
  void collect_attn_timing();
  bool fold_qk_ = true;  // options.fold_qk_decode, or DSINFER_CUDA_FOLD_QK over it
  // A forward of T rows runs the q/k step inside attention: one row (its key is the only new
  // one of its slot), and no L2 window prefetch riding on the separate q/k kernel.
  bool folds_qk(int T) const { return fold_qk_ && T == 1 && pf_window_ == 0; }
  // DSINFER_CUDA_FUSED_TAIL=1 or 2: a one-row forward runs each layer's o, gate/up, down and the
  // next layer's QKV as one kernel with grid barriers (cuda_layer_tail.h; the row kernel's
  // bits, so only with --cuda-gemm rows). One barrier counter per layer, zeroed per forward.
  bool fused_tail_ = false;
  // Whether a forward of T rows (as enqueue() sees it) runs the fused tail.
  bool runs_fused_tail(int T) const { return fused_tail_ && folds_qk(T) && diag_omit_ == 0; }
  int tail_stage_unroll_ = 0;
  int tail_warps_ = 4;
  // DSINFER_CUDA_FUSED_TAIL_PROFILE=1: the fused tail's blocks stamp their phases
  // (kLayerTailStamps per block and layer, room for tail_max_blocks_ blocks), summed here.
  unsigned long long* tail_timing_ = nullptr;
  int tail_max_blocks_ = 0, tail_grid_ = 0;
  struct TailStat {
    double work_us[4] = {}, slowest_us[4] = {};   // per phase: mean block, slowest block
    double wait_us[3] = {}, release_us[3] = {};   // per barrier: mean wait, last arrival to last release
    int64_t layers = 0, qkv_layers = 0;
  } tail_stat_;
  void collect_tail_timing();
  unsigned* tail_barriers_ = nullptr;
  bool persistent_ = false;  // wanted (options.persistent_decode, or DSINFER_CUDA_PERSISTENT over it) and supported
  int persistent_max_k_ = 0;
  unsigned* persistent_barrier_ = nullptr;
  DeviceArena persistent_arena_;
  std::map<std::tuple<uint64_t, std::vector<int>, bool>, std::pair<PersistentOp*, int>> persistent_tables_;
  void ensure_workspace(int rows, int logit_rows);
  void drop_graphs();
  // DSINFER_CUDA_PROFILE=1: forwards run eagerly with a CUDA event after each stage, and
  // the per-stage times are printed to stderr when the model is destroyed.
  void mark(const char* stage);
  void collect_marks(int rows);
  void print_profile() const;
  bool profile_ = false, capturing_ = false;
  // DSINFER_CUDA_FORWARD_TIMES=1 (a diagnostic): where a forward call's wall time goes, per
  // (rows, logit rows, captured layers, graph) shape: host preparation (validation, the row
  // metadata, its upload and the block tables'), the launch call, the wait for the stream,
  // what follows, and the GPU's time between events around the launch. Printed on destruction.
  struct ForwardTimes {
    int64_t n = 0;
    double prep_us = 0, launch_us = 0, wait_us = 0, post_us = 0, gpu_us = 0, table_kb = 0;
  };
  bool forward_times_ = false;
  bool pow2_buckets_ = false;  // DSINFER_CUDA_GRAPH_BUCKETS=pow2 (graph_bucket)
  cudaEvent_t ft_start_ = nullptr, ft_end_ = nullptr;
  std::map<std::tuple<int, int, int, int>, ForwardTimes> forward_times_by_shape_;
  // DSINFER_CUDA_DIAG_OMIT (timing diagnostics only; outputs are wrong): per-layer kernels
  // left out of the forward, so that a graph replay's time with and without one measures
  // what that kernel costs inside the graph (Nsight Systems is not on the GPU machine).
  unsigned diag_omit_ = 0;
  // "add-empty" adds an empty kernel (32 blocks x 256 threads) after attention in every layer.
  enum : unsigned { kOmitQk = 1, kOmitAttn = 2, kOmitO = 4, kOmitGu = 8, kOmitDown = 16, kOmitQkv = 32, kAddEmpty = 64 };
  // L2 prefetch plan of a decode step (DSINFER_CUDA_L2_PREFETCH="W,T", MB): while the q/k
  // kernel and attention run (latency-bound, the DRAM idles) the o projection's weights
  // and the first W MB of gate/up are asked into the L2; each GEMV's tail asks for the first
  // T MB of the next GEMV's weights (beyond what was already asked). Only calls of at most
  // kPrefetchRows rows (decode, small verify blocks), where the GEMMs stream their weights.
  // ",1" after W,T (pf_side_): the window prefetch is one kernel on a side stream (forked
  // after the QKV GEMM, joined before the o GEMM) instead of extra work in the q/k kernel and
  // attention, which measured slower with it (docs/PERFORMANCE.md).
  uint64_t pf_window_ = 0, pf_tail_ = 0;
  // The QKV GEMM's tail prefetch of the o projection (DSINFER_CUDA_L2_PREFETCH_O, MB; the
  // tail T when unset): the o weights (21 MB for the 4B shape) fit the L2 and the DRAM would
  // otherwise idle while the latency-bound attention kernel runs.
  uint64_t pf_o_tail_ = 0;
  bool pf_side_ = false;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  static constexpr int kPrefetchRows = 16;
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
  std::map<std::string, std::pair<double, int64_t>> stage_ms_;
  std::map<std::string, int64_t> forwards_;

  ModelConfig cfg_;
  CudaModelOptions opts_;
  Qwen3LayerDims d_;
  // Tensor parallelism (CudaRankSpec): the all-reduce of a [rows, H] device buffer on the
  // stream, and this rank's index.
  CudaRankReduce tp_reduce_;
  int tp_rank_ = 0;
  float attention_factor_ = 1.0f;
  uint64_t decode_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;

  DeviceArena weights_;
  std::vector<LayerWeights> layers_;
  bf16* embed_ = nullptr;
  bf16* head_ = nullptr;
  float* final_norm_ = nullptr;
  float* inv_freq_ = nullptr;

  // Workspace for up to cap_rows_ rows and cap_logits_ logit rows (grow-only).
  DeviceArena ws_;
  int cap_rows_ = 0, cap_logits_ = 0;
  float *x_ = nullptr, *qkv_ = nullptr, *q_ = nullptr, *gu_ = nullptr, *cos_ = nullptr, *sin_ = nullptr,
        *logits_ = nullptr;
  bf16 *hb_ = nullptr, *attb_ = nullptr, *act_ = nullptr, *hf_ = nullptr;
  int32_t* meta_ = nullptr;              // device: tokens | pos | slot | logit rows
  unsigned long long* keys_ = nullptr;   // device: argmax key per logit row (cuda_gemm.h)
  int32_t* meta_host_ = nullptr;         // pinned mirrors
  unsigned long long* keys_host_ = nullptr;
  float* cap_ = nullptr;  // captured layer outputs [T, n_cap, H]
  size_t cap_floats_ = 0;

  // (cache uid, rows, logit rows, captured layers)
  using GraphKey = std::tuple<uint64_t, int, int, std::vector<int>, bool>;  // (cache, rows, logit rows, captured, to pool)
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::map<GraphKey, int> seen_;
};

CudaQwen3Model::CudaQwen3Model(const ModelConfig& cfg, const CudaModelOptions& opts, const CudaRankSpec* rank)
    : cfg_(cfg), opts_(opts) {
  if (rank) {
    if (!rank->reduce) throw Error("tensor-parallel rank " + std::to_string(rank->rank) + ": no all-reduce given");
    tp_reduce_ = rank->reduce;
    tp_rank_ = rank->rank;
    // A reduce that cannot be captured (through host memory) runs every forward eagerly.
    if (!rank->reduce_in_graphs) opts_.use_graphs = false;
  }
  const std::string cfile = cfg.model_dir + "/config.json";
  if (cfg.hidden_act != "silu")
    throw Error(cfile + ": field 'hidden_act': '" + cfg.hidden_act + "' is not supported by Qwen3 (expected silu)");
  if (cfg.use_sliding_window)
    throw Error(cfile + ": field 'use_sliding_window': sliding-window attention is not supported for Qwen3");
  if (cfg.head_dim > 256 || cfg.head_dim % 2 != 0)
    throw Error(cfile + ": field 'head_dim': " + std::to_string(cfg.head_dim) + " not supported on CUDA (even, <= 256)");
  if (cfg.num_key_value_heads <= 0 || cfg.num_attention_heads % cfg.num_key_value_heads != 0)
    throw Error(cfile + ": field 'num_key_value_heads': must divide num_attention_heads");
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw Error("--device cuda: " + why);
  profile_ = std::getenv("DSINFER_CUDA_PROFILE") != nullptr;
  forward_times_ = env_switch("DSINFER_CUDA_FORWARD_TIMES", false);
  if (const char* e = std::getenv("DSINFER_CUDA_GRAPH_BUCKETS")) {
    const std::string v = e;
    if (v != "pow2" && v != "fine")
      throw Error("DSINFER_CUDA_GRAPH_BUCKETS: '" + v + "' is not one of pow2, fine");
    pow2_buckets_ = v == "pow2";
  }
  if (const char* e = std::getenv("DSINFER_CUDA_DIAG_OMIT")) {
    diag_omit_ = parse_name_list("DSINFER_CUDA_DIAG_OMIT", e,
                                 {{"qkv", kOmitQkv}, {"qk", kOmitQk}, {"attn", kOmitAttn}, {"o", kOmitO},
                                  {"gu", kOmitGu}, {"down", kOmitDown}, {"add-empty", kAddEmpty}});
    if (diag_omit_)
      std::fprintf(stderr, "DSINFER_CUDA_DIAG_OMIT=%s: timing diagnostic, these kernels are left out and outputs are wrong\n", e);
  }
  device_sampling_ = env_switch("DSINFER_CUDA_SAMPLING", device_sampling_);
  {
    double w_mb = 0.0, t_mb = 4.0;  // defaults: docs/PERFORMANCE.md, CUDA batch-1 third pass
    int side = 0;
    if (const char* e = std::getenv("DSINFER_CUDA_L2_PREFETCH")) {
      char tail = 0;
      const int got = std::sscanf(e, "%lf,%lf,%d%c", &w_mb, &t_mb, &side, &tail);
      if (std::string(e) == "0") w_mb = t_mb = 0.0, side = 0;
      else if ((got != 2 && got != 3) || w_mb < 0 || t_mb < 0 || side < 0 || side > 1)
        throw Error(std::string("DSINFER_CUDA_L2_PREFETCH must be 'W,T' or 'W,T,S' (MB >= 0, S 0 or 1) or 0, not '") + e + "'");
    }
    // Whole 16 KB chunks: range starts (o_tail, gu_win) stay 16-byte aligned, as the bulk
    // prefetch needs (W = 0.01 once faulted with a misaligned address).
    pf_window_ = static_cast<uint64_t>(w_mb * 1048576.0) & ~uint64_t(16383);
    pf_tail_ = static_cast<uint64_t>(t_mb * 1048576.0) & ~uint64_t(16383);
    pf_side_ = side == 1 && pf_window_ > 0;
    pf_o_tail_ = pf_tail_;
    if (const char* e = std::getenv("DSINFER_CUDA_L2_PREFETCH_O")) {
      char* end = nullptr;
      const double mb = std::strtod(e, &end);
      if (end == e || *end != '\0' || !(mb >= 0.0) || mb > 4096.0)
        throw Error(std::string("DSINFER_CUDA_L2_PREFETCH_O must be a size in MB (0 to 4096), not '") + e + "'");
      pf_o_tail_ = static_cast<uint64_t>(mb * 1048576.0) & ~uint64_t(16383);
    }
  }
  DSINFER_CUDA_CHECK(cudaSetDevice(opts.device));
  DSINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<Gemm>(opts.batch_invariant);
  if (pf_side_) {
    DSINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    DSINFER_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    DSINFER_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  }

  const RopeParams rope = compute_rope_params(cfg.rope, cfg.head_dim, cfg.max_position_embeddings);
  attention_factor_ = rope.attention_factor;
  inv_freq_ = weights_.upload(rope.inv_freq.data(), rope.inv_freq.size());

  // Host side exactly as the CPU model loads (shape/dtype checks), every matrix as BF16. A
  // rank maps the files (it reads only its slices and the replicated tensors).
  WeightStore store(cfg.model_dir, "bf16", rank ? MappedFile::Placement::Mmap : MappedFile::Placement::Auto);
  std::unique_ptr<ShardReader> reader = rank ? std::make_unique<ShardReader>(cfg.model_dir) : nullptr;
  d_ = qwen3_layer_dims(cfg);
  const int64_t H = d_.hidden, I = d_.intermediate, NQ = d_.q_width(), NKV = d_.kv_width(), V = cfg.vocab_size;
  auto bf16_ptr = [](const WeightView& w) {
    if (w.dtype != DType::BF16) throw Error("CUDA upload: expected a BF16 matrix after conversion");
    return static_cast<const bf16*>(w.data);
  };
  auto upload_rows = [&](bf16* dst, const WeightView& w) {
    DSINFER_CUDA_CHECK(cudaMemcpy(dst, bf16_ptr(w), static_cast<size_t>(w.rows * w.cols) * sizeof(bf16),
                                  cudaMemcpyHostToDevice));
    return dst + w.rows * w.cols;
  };
  uint64_t bytes = 0;
  layers_.resize(cfg.num_hidden_layers);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const Qwen3LayerWeights w = rank ? load_qwen3_layer_share(store, *reader, rank->full, rank->plan, rank->rank, l)
                                     : load_qwen3_layer(store, "model.layers." + std::to_string(l) + ".", d_, cfg.attention_bias);
    LayerWeights& L = layers_[l];
    L.qkv = weights_.alloc<bf16>((NQ + 2 * NKV) * H);
    upload_rows(upload_rows(upload_rows(L.qkv, w.q), w.k), w.v);
    L.o = weights_.alloc<bf16>(H * NQ);
    upload_rows(L.o, w.o);
    // gate and up interleaved by row (gate_0, up_0, gate_1, ...): the GEMM's SwiGLU epilogue
    // takes each feature pair from one warp (Gemm::run_silu).
    L.gu = weights_.alloc<bf16>(2 * I * H);
    DSINFER_CUDA_CHECK(cudaMemcpy2D(L.gu, 2 * H * sizeof(bf16), bf16_ptr(w.gate), H * sizeof(bf16), H * sizeof(bf16), I,
                                    cudaMemcpyHostToDevice));
    DSINFER_CUDA_CHECK(cudaMemcpy2D(L.gu + H, 2 * H * sizeof(bf16), bf16_ptr(w.up), H * sizeof(bf16), H * sizeof(bf16), I,
                                    cudaMemcpyHostToDevice));
    L.down = weights_.alloc<bf16>(H * I);
    upload_rows(L.down, w.down);
    if (cfg.attention_bias) {
      std::vector<float> b(w.q_bias);
      b.insert(b.end(), w.k_bias.begin(), w.k_bias.end());
      b.insert(b.end(), w.v_bias.begin(), w.v_bias.end());
      L.qkv_bias = weights_.upload(b.data(), b.size());
      L.o_bias = weights_.upload(w.o_bias.data(), w.o_bias.size());
    }
    L.q_norm = weights_.upload(w.q_norm.data(), w.q_norm.size());
    L.k_norm = weights_.upload(w.k_norm.data(), w.k_norm.size());
    L.in_norm = weights_.upload(w.in_norm.data(), w.in_norm.size());
    L.post_norm = weights_.upload(w.post_norm.data(), w.post_norm.size());
    bytes += static_cast<uint64_t>((NQ + 2 * NKV) * H + H * NQ + 3 * I * H) * sizeof(bf16) +
             static_cast<uint64_t>(2 * d_.head_dim + 2 * H) * sizeof(float);
  }
  const WeightView emb = store.matrix("model.embed_tokens.weight", V, H);
  embed_ = weights_.alloc<bf16>(V * H);
  upload_rows(embed_, emb);
  const std::vector<float> fn = store.vector_f32("model.norm.weight", H);
  final_norm_ = weights_.upload(fn.data(), fn.size());
  if (cfg.tie_word_embeddings) {
    head_ = embed_;  // transformers ties lm_head to embed_tokens
  } else if (store.has("lm_head.weight")) {
    head_ = weights_.alloc<bf16>(V * H);
    upload_rows(head_, store.matrix("lm_head.weight", V, H));
  } else {
    throw Error(cfg.model_dir + ": tensor 'lm_head.weight' not found and config.json field 'tie_word_embeddings' is false");
  }
  bytes += static_cast<uint64_t>(V * H + H) * sizeof(bf16) + H * sizeof(float);  // head + one embedding row + norm
  decode_bytes_ = bytes;
  // Drafters with frozen copies of the embedding / LM head compare them with these views.
  host_store_ = std::make_unique<WeightStore>(cfg.model_dir, "auto", MappedFile::Placement::Mmap);
  auto host_view = [&](const std::string& name) {
    const WeightInfo w = host_store_->require(name, {DType::BF16, DType::F32, DType::F16}, {V, H});
    if (w.dtype != DType::BF16 || reinterpret_cast<uintptr_t>(w.data) % 2 != 0) return WeightView{};
    return WeightView{w.data, DType::BF16, V, H};
  };
  host_embed_ = host_view("model.embed_tokens.weight");
  host_head_ = cfg.tie_word_embeddings ? host_embed_ : host_view("lm_head.weight");

  const bool fold = env_switch("DSINFER_CUDA_FOLD_QK", opts.fold_qk_decode);
  fold_qk_ = fold && cfg.head_dim % 8 == 0;

  // The fixed-order GEMM for every launch from here on (process-wide, see CudaModelOptions).
  GemvShape shape = gemv_shape();
  shape.mma = env_switch("DSINFER_CUDA_GEMV_MMA", opts.tensor_core_gemm);
  set_gemv_shape(shape);

  // The persistent decode kernel: the row kernel's batch-invariant GEMMs (it computes their
  // bits), no biases (Qwen3 has none), even feature counts and K % 8 == 0 (16-byte rows), a
  // shape that fits.
  const bool want = env_switch("DSINFER_CUDA_PERSISTENT", opts.persistent_decode);
  persistent_ = want && opts.batch_invariant && !cfg.attention_bias && !shape.mma && !tp_reduce_;
  if (want && opts.batch_invariant && shape.mma)
    std::fprintf(stderr, "dsinfer: persistent decode off: it computes the row kernel's bits (--cuda-gemm rows), "
                         "not the tensor-core GEMM's\n");
  persistent_max_k_ = static_cast<int>(std::max({H, NQ, I}));
  if (persistent_) {
    const char* why = nullptr;
    persistent_ = H % 8 == 0 && NQ % 8 == 0 && I % 8 == 0 && V % 2 == 0 &&
                  persistent_decode_supported(d_.head_dim, persistent_max_k_, d_.heads, &why);
    if (!persistent_ && why)
      std::fprintf(stderr, "dsinfer: persistent decode off: %s\n", why);
  }
  if (persistent_) persistent_barrier_ = weights_.alloc<unsigned>(1);
  // DSINFER_CUDA_FUSED_TAIL=1 or 2: the fused tail's staging loads in flight per thread.
  tail_stage_unroll_ = env_choice("DSINFER_CUDA_FUSED_TAIL", {0, 1, 2}, opts.fused_layer_tail);
  tail_warps_ = env_choice("DSINFER_CUDA_FUSED_TAIL_WARPS", {4, 8, 12, 16}, opts.fused_layer_tail_warps);
  if (tail_stage_unroll_ < 0 || tail_stage_unroll_ > 2)
    throw Error("CUDA model options: fused_layer_tail must be 0, 1 or 2, not " + std::to_string(tail_stage_unroll_));
  if (tail_warps_ != 4 && tail_warps_ != 8 && tail_warps_ != 12 && tail_warps_ != 16)
    throw Error("CUDA model options: fused_layer_tail_warps must be 4, 8, 12 or 16, not " + std::to_string(tail_warps_));
  const bool want_tail = tail_stage_unroll_ > 0;
  fused_tail_ = want_tail && opts.batch_invariant && !shape.mma && !tp_reduce_ && fold_qk_ && !cfg.attention_bias &&
                H % 8 == 0 && NQ % 8 == 0 && I % 8 == 0;
  if (want_tail && !fused_tail_)
    std::fprintf(stderr, "dsinfer: fused layer tail off: it computes the row kernel's bits (--cuda-gemm rows, "
                         "one GPU, the folded q/k step) for shapes without biases whose widths are multiples of 8\n");
  if (fused_tail_) tail_barriers_ = weights_.alloc<unsigned>(static_cast<size_t>(cfg.num_hidden_layers));
  if (fused_tail_ && std::getenv("DSINFER_CUDA_FUSED_TAIL_PROFILE")) {
    int dev = 0, sms = 0;
    DSINFER_CUDA_CHECK(cudaGetDevice(&dev));
    DSINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    tail_max_blocks_ = 16 * sms;  // more than any block shape's resident blocks
    tail_timing_ = weights_.alloc<unsigned long long>(static_cast<size_t>(cfg.num_hidden_layers) * tail_max_blocks_ *
                                                       kLayerTailStamps);
  }
  if (fold_qk_ && std::getenv("DSINFER_CUDA_ATTN_PROFILE"))
    attn_timing_ = weights_.alloc<unsigned long long>(static_cast<size_t>(cfg.num_hidden_layers) * cfg.num_attention_heads *
                                                       kAttnProfileStamps);
  if (persistent_ && std::getenv("DSINFER_CUDA_PERSISTENT_PROFILE")) {
    const int max_ops = 2 + 5 * cfg.num_hidden_layers;
    persistent_timing_ = weights_.alloc<unsigned long long>(1 + max_ops + static_cast<size_t>(max_ops) * persistent_decode_grid());
  }
}

void CudaQwen3Model::collect_persistent_timing() {
  const int n = persistent_timing_ops_, G = persistent_decode_grid();
  std::vector<unsigned long long> t(1 + n + static_cast<size_t>(n) * G);
  DSINFER_CUDA_CHECK(cudaMemcpy(t.data(), persistent_timing_, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  static const char* kLayerOps[] = {"qkv (+rmsnorm)", "q/k + attention", "o (+= x)", "gate|up (+rmsnorm, swiglu)",
                                    "down (+= x)"};
  const int L = cfg_.num_hidden_layers;
  for (int i = 0; i < n; ++i) {
    const std::string name = i == 0 ? "embed" : i <= 5 * L ? kLayerOps[(i - 1) % 5] : "lm head (+rmsnorm, argmax)";
    const double start = static_cast<double>(t[i]);  // t[0] = kernel start, t[i] = release of op i - 1
    const double end = i + 1 < n ? static_cast<double>(t[1 + i]) : 0.0;
    double sum = 0, mx = 0;
    for (int b = 0; b < G; ++b) {
      const double w = static_cast<double>(t[1 + n + static_cast<size_t>(i) * G + b]) - start;
      sum += w;
      mx = std::max(mx, w);
    }
    PhaseStat& st = persistent_stats_[name];
    st.mean_work_us += sum / G / 1e3;
    st.max_work_us += mx / 1e3;
    if (end > 0) {
      st.phase_us += (end - start) / 1e3;
      st.barrier_us += (end - start - mx) / 1e3;
    } else {
      st.phase_us += mx / 1e3;
    }
    st.n += 1;
  }
  persistent_total_us_ += (static_cast<double>(t[1 + n + static_cast<size_t>(n - 1) * G]) - static_cast<double>(t[0])) / 1e3;
  ++persistent_profiled_;
}

void CudaQwen3Model::collect_attn_timing() {
  const int L = cfg_.num_hidden_layers, NH = cfg_.num_attention_heads, S = kAttnProfileStamps;
  std::vector<unsigned long long> t(static_cast<size_t>(L) * NH * S);
  DSINFER_CUDA_CHECK(cudaMemcpy(t.data(), attn_timing_, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  double prev_done = 0;
  for (int l = 0; l < L; ++l) {
    const unsigned long long* b = t.data() + static_cast<size_t>(l) * NH * S;
    double first = 1e300, last = 0;
    for (int h = 0; h < NH; ++h) {
      const unsigned long long* st = b + static_cast<size_t>(h) * S;
      first = std::min(first, static_cast<double>(st[0]));
      last = std::max(last, static_cast<double>(st[3]));
      // Thread 0's path: entry, wait, q staged, barrier, scores, V sums, combine, done.
      const int order[8] = {0, 1, 2, 4, 5, 6, 7, 3};
      for (int k = 1; k < 8; ++k)
        attn_stat_.step_us[k - 1] += (static_cast<double>(st[order[k]]) - static_cast<double>(st[order[k - 1]])) / 1e3 / NH;
    }
    attn_stat_.span_us += (last - first) / 1e3;
    ++attn_stat_.layers;
    if (l > 0) {
      attn_stat_.between_us += (first - prev_done) / 1e3;
      ++attn_stat_.gaps;
    }
    prev_done = last;
  }
  ++attn_stat_.forwards;
}

void CudaQwen3Model::collect_tail_timing() {
  const int L = cfg_.num_hidden_layers, S = kLayerTailStamps, nb = tail_grid_;
  if (nb <= 0) return;
  std::vector<unsigned long long> t(static_cast<size_t>(L) * tail_max_blocks_ * S);
  DSINFER_CUDA_CHECK(cudaMemcpy(t.data(), tail_timing_, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  for (int l = 0; l < L; ++l) {
    const unsigned long long* b0 = t.data() + static_cast<size_t>(l) * tail_max_blocks_ * S;
    const bool qkv = l + 1 < L;
    // (phase start, phase done) stamp pairs, and (done, barrier passed) pairs
    const int starts[4] = {0, 2, 4, 6}, dones[4] = {1, 3, 5, 7};
    for (int ph = 0; ph < (qkv ? 4 : 3); ++ph) {
      double sum = 0, mx = 0;
      for (int b = 0; b < nb; ++b) {
        const double w = (static_cast<double>(b0[b * S + dones[ph]]) - static_cast<double>(b0[b * S + starts[ph]])) / 1e3;
        sum += w;
        mx = std::max(mx, w);
      }
      tail_stat_.work_us[ph] += sum / nb;
      tail_stat_.slowest_us[ph] += mx;
    }
    for (int br = 0; br < (qkv ? 3 : 2); ++br) {
      double sum = 0, last_in = 0, last_out = 0;
      for (int b = 0; b < nb; ++b) {
        const double in = static_cast<double>(b0[b * S + dones[br]]), out = static_cast<double>(b0[b * S + starts[br + 1]]);
        sum += (out - in) / 1e3;
        last_in = std::max(last_in, in);
        last_out = std::max(last_out, out);
      }
      tail_stat_.wait_us[br] += sum / nb;
      tail_stat_.release_us[br] += (last_out - last_in) / 1e3;
    }
    ++tail_stat_.layers;
    if (qkv) ++tail_stat_.qkv_layers;
  }
}

CudaQwen3Model::~CudaQwen3Model() {
  print_profile();
  if (ft_start_) cudaEventDestroy(ft_start_);
  if (ft_end_) cudaEventDestroy(ft_end_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  drop_graphs();
  if (meta_host_) cudaFreeHost(meta_host_);
  if (keys_host_) cudaFreeHost(keys_host_);
  if (cap_) cudaFree(cap_);
  if (stream_) cudaStreamDestroy(stream_);
  if (side_) cudaStreamDestroy(side_);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
}

void CudaQwen3Model::drop_graphs() {
  for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
  seen_.clear();
  persistent_tables_.clear();
  persistent_arena_.release();
}

const std::pair<PersistentOp*, int>& CudaQwen3Model::persistent_ops(const DeviceKVStorage& kv,
                                                                    const std::vector<int>& capture_layers, bool head) {
  const auto key = std::make_tuple(kv.uid(), capture_layers, head);
  auto it = persistent_tables_.find(key);
  if (it != persistent_tables_.end()) return it->second;
  const int H = static_cast<int>(d_.hidden), I = static_cast<int>(d_.intermediate);
  const int NQ = static_cast<int>(d_.q_width()), NKV = static_cast<int>(d_.kv_width());
  auto capture_index = [&](int layer_id) {
    for (size_t c = 0; c < capture_layers.size(); ++c)
      if (capture_layers[c] == layer_id) return static_cast<int>(c);
    return -1;
  };
  std::vector<PersistentOp> ops;
  PersistentOp e;
  e.kind = PersistentOp::Embed;
  e.capture = capture_index(-1);
  ops.push_back(e);
  auto gemv = [&](const bf16* W, int N, int K, int input, const bf16* in, const float* norm_w, int output, float* y,
                  bf16* act) {
    PersistentOp g;
    g.kind = PersistentOp::Gemv;
    g.W = W, g.N = N, g.K = K, g.input = input, g.in_bf16 = in, g.norm_w = norm_w, g.output = output, g.y = y, g.act = act;
    ops.push_back(g);
  };
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerWeights& W = layers_[l];
    gemv(W.qkv, NQ + 2 * NKV, H, PersistentOp::InRmsNorm, nullptr, W.in_norm, PersistentOp::OutSet, qkv_, nullptr);
    PersistentOp a;
    a.kind = PersistentOp::Attention;
    a.q_norm = W.q_norm, a.k_norm = W.k_norm, a.kv = kv.layer(l);
    ops.push_back(a);
    gemv(W.o, H, NQ, PersistentOp::InBf16, attb_, nullptr, PersistentOp::OutAdd, x_, nullptr);
    gemv(W.gu, 2 * I, H, PersistentOp::InRmsNorm, nullptr, W.post_norm, PersistentOp::OutSilu, nullptr, act_);
    gemv(W.down, H, I, PersistentOp::InBf16, act_, nullptr, PersistentOp::OutAdd, x_, nullptr);
    ops.back().capture = capture_index(l);
  }
  if (head) gemv(head_, cfg_.vocab_size, H, PersistentOp::InRmsNorm, nullptr, final_norm_, PersistentOp::OutHead, logits_, nullptr);
  PersistentOp* dev = persistent_arena_.upload(ops.data(), ops.size());
  return persistent_tables_.emplace(key, std::make_pair(dev, static_cast<int>(ops.size()))).first->second;
}

// The model's device current on this thread while it lives, the caller's again after:
// caches are allocated where the model runs (a tensor-parallel group's ranks are made and
// asked for caches from one thread, each rank on its own GPU).
struct DeviceScope {
  int previous = -1;
  explicit DeviceScope(int device) {
    DSINFER_CUDA_CHECK(cudaGetDevice(&previous));
    if (previous != device) DSINFER_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous); }
};

std::unique_ptr<KVCache> CudaQwen3Model::make_kv_cache(int max_slots, int max_tokens) const {
  DeviceScope on(opts_.device);
  check(max_slots >= 1, "CUDA KV cache: max_slots must be >= 1");
  const double ratio = opts_.cache_prealloc_ratio;
  check(ratio > 0.0 && ratio <= 1.0, "--cache-prealloc-ratio must be in (0, 1] (got " + std::to_string(ratio) + ")");
  size_t free_b = 0, total_b = 0;
  DSINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double budget = ratio * static_cast<double>(free_b);
  const uint64_t per_slot_token =
      CudaKVCache::bytes_per_token(cfg_.num_hidden_layers, cfg_.num_key_value_heads, cfg_.head_dim);
  const double per_token = static_cast<double>(per_slot_token) * max_slots;
  if (max_tokens <= 0) {
    const double fit = std::floor(budget / per_token);
    max_tokens = static_cast<int>(std::min<double>(fit, cfg_.max_position_embeddings > 0 ? cfg_.max_position_embeddings : fit));
    check(max_tokens >= 1, "--cache-prealloc-ratio " + std::to_string(ratio) + ": no room for one token per slot");
  } else if (per_token * max_tokens > budget) {
    throw Error("CUDA KV cache: " + std::to_string(max_slots) + " slots x " + std::to_string(max_tokens) + " tokens need " +
                std::to_string(static_cast<uint64_t>(per_token * max_tokens) >> 20) + " MiB, more than --cache-prealloc-ratio " +
                std::to_string(ratio) + " of the " + std::to_string(free_b >> 20) + " MiB free on the device");
  }
  return std::make_unique<CudaKVCache>(cfg_.num_hidden_layers, cfg_.num_key_value_heads, cfg_.head_dim, max_slots,
                                       max_tokens);
}

int64_t CudaQwen3Model::device_kv_blocks(int block_size, double prealloc_ratio, int feature_floats) const {
  DeviceScope on(opts_.device);
  check(block_size >= 1, "--kv-block-size: must be >= 1 (got " + std::to_string(block_size) + ")");
  check(prealloc_ratio > 0.0 && prealloc_ratio <= 1.0,
        "--cache-prealloc-ratio must be in (0, 1] (got " + std::to_string(prealloc_ratio) + ")");
  size_t free_b = 0, total_b = 0;
  DSINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t per_block = CudaPagedKVCache::bytes_per_block(cfg_.num_hidden_layers, cfg_.num_key_value_heads,
                                                               cfg_.head_dim, block_size, std::max(feature_floats, 0));
  const int64_t blocks = static_cast<int64_t>(std::floor(prealloc_ratio * static_cast<double>(free_b) / per_block));
  check(blocks >= 1, "--cache-prealloc-ratio " + std::to_string(prealloc_ratio) + ": no room for one KV block in the " +
                         std::to_string(free_b >> 20) + " MiB free on the device");
  return blocks;
}

std::unique_ptr<BlockKVCache> CudaQwen3Model::make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots,
                                                                  int max_tokens, int feature_floats) const {
  DeviceScope on(opts_.device);
  check(block_size >= 1 && num_blocks >= 1, "CUDA paged KV cache: block_size and num_blocks must be >= 1");
  check(feature_floats >= 0, "CUDA paged KV cache: negative feature row width");
  size_t free_b = 0, total_b = 0;
  DSINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t per_block = CudaPagedKVCache::bytes_per_block(cfg_.num_hidden_layers, cfg_.num_key_value_heads,
                                                               cfg_.head_dim, block_size, feature_floats);
  const long double need = static_cast<long double>(per_block) * num_blocks;
  if (need > static_cast<long double>(free_b))
    throw Error("--kv-blocks: " + std::to_string(num_blocks) + " KV blocks of " + std::to_string(block_size) +
                " tokens need " + std::to_string(static_cast<uint64_t>(need) >> 20) + " MiB, more than the " +
                std::to_string(free_b >> 20) + " MiB free on the device");
  return std::make_unique<CudaPagedKVCache>(cfg_.num_hidden_layers, cfg_.num_key_value_heads, cfg_.head_dim, block_size,
                                            num_blocks, max_slots, max_tokens, feature_floats);
}

void CudaQwen3Model::ensure_workspace(int rows, int logit_rows) {
  if (rows <= cap_rows_ && logit_rows <= cap_logits_) return;
  drop_graphs();  // they point into the old buffers
  ws_.release();
  if (meta_host_) cudaFreeHost(meta_host_);
  if (keys_host_) cudaFreeHost(keys_host_);
  meta_host_ = nullptr;
  keys_host_ = nullptr;
  cap_rows_ = std::max({rows, 16, cap_rows_});
  cap_logits_ = std::max({logit_rows, 16, cap_logits_});
  const int64_t T = cap_rows_, Lr = cap_logits_;
  const int64_t H = d_.hidden, I = d_.intermediate, NQ = d_.q_width(), NKV = d_.kv_width(), V = cfg_.vocab_size;
  x_ = ws_.alloc<float>(T * H);
  hb_ = ws_.alloc<bf16>(T * H);
  qkv_ = ws_.alloc<float>(T * (NQ + 2 * NKV));
  q_ = ws_.alloc<float>(T * NQ);
  attb_ = ws_.alloc<bf16>(T * NQ);
  gu_ = ws_.alloc<float>(T * 2 * I);
  act_ = ws_.alloc<bf16>(T * I);
  cos_ = ws_.alloc<float>(T * (d_.head_dim / 2));
  sin_ = ws_.alloc<float>(T * (d_.head_dim / 2));
  hf_ = ws_.alloc<bf16>(Lr * H);
  logits_ = ws_.alloc<float>(Lr * V);
  keys_ = ws_.alloc<unsigned long long>(Lr);
  meta_ = ws_.alloc<int32_t>(3 * T + Lr);
  DSINFER_CUDA_CHECK(cudaMallocHost(&meta_host_, (3 * T + Lr) * sizeof(int32_t)));
  DSINFER_CUDA_CHECK(cudaMallocHost(&keys_host_, Lr * sizeof(unsigned long long)));
}

void CudaQwen3Model::enqueue(const DeviceKVStorage& kv, int T, int n_logits, const std::vector<int>& capture_layers,
                             bool with_argmax, CudaPagedKVCache* pool) {
  cudaStream_t s = stream_;
  const int H = static_cast<int>(d_.hidden), I = static_cast<int>(d_.intermediate);
  const int NQ = static_cast<int>(d_.q_width()), NKV = static_cast<int>(d_.kv_width()), NQKV = NQ + 2 * NKV;
  const int D = d_.head_dim, NH = d_.heads, NKVH = d_.kv_heads, V = cfg_.vocab_size;
  const float eps = d_.eps;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const int32_t* tok = meta_;
  const int32_t* pos = meta_ + cap_rows_;
  const int32_t* slot = meta_ + 2 * cap_rows_;
  const int32_t* lrows = meta_ + 3 * cap_rows_;
  const int n_cap = static_cast<int>(capture_layers.size());
  // A captured layer's rows: into the pool's feature rows at each row's position (one kernel,
  // inside the forward and so inside its graph; padding rows have slot -1 and are skipped),
  // or into cap_.
  auto capture = [&](int layer_id) {
    for (int c = 0; c < n_cap; ++c)
      if (capture_layers[c] == layer_id) {
        if (pool)
          store_feature_columns(x_, H, T, int64_t{n_cap} * H, int64_t{c} * H, H, pos, slot, pool->device_tables(),
                                pool->table_stride(), pool->block_size(), pool->feature_plane(), s);
        else
          DSINFER_CUDA_CHECK(cudaMemcpy2DAsync(cap_ + static_cast<size_t>(c) * H, sizeof(float) * n_cap * H, x_,
                                               sizeof(float) * H, sizeof(float) * H, T, cudaMemcpyDeviceToDevice, s));
      }
  };

  if (persistent_ && T == 1 && n_logits <= 1 && !profile_) {
    if (n_logits > 0 && with_argmax) DSINFER_CUDA_CHECK(cudaMemsetAsync(keys_, 0, sizeof(unsigned long long), s));
    const auto& [ops, n_ops] = persistent_ops(kv, capture_layers, n_logits > 0);
    PersistentParams p;
    p.token = tok, p.pos = pos, p.slot = slot;
    p.embed = embed_, p.inv_freq = inv_freq_, p.attention_factor = attention_factor_, p.eps = eps, p.scale = scale;
    p.H = H, p.NH = NH, p.NKVH = NKVH, p.D = D;
    p.x = x_, p.qkv = qkv_, p.attb = attb_;
    p.keys = n_logits > 0 && with_argmax ? keys_ : nullptr;
    p.cap = cap_, p.barrier = persistent_barrier_;
    p.timing = persistent_timing_;
    persistent_timing_ops_ = n_ops;
    persistent_decode(ops, n_ops, persistent_max_k_, p, s);
    if (pool && n_cap > 0)  // the persistent kernel captures into cap_
      store_feature_rows(cap_, T, int64_t{n_cap} * H, pos, slot, pool->device_tables(), pool->table_stride(),
                         pool->block_size(), pool->feature_plane(), s);
    return;
  }
  mark("start");
  // Greedy callers get argmax keys folded into the LM head GEMM (only they cross to the host);
  // zeroed first thing, so the kernels after it chain by programmatic dependent launch.
  if (n_logits > 0 && with_argmax) DSINFER_CUDA_CHECK(cudaMemsetAsync(keys_, 0, sizeof(unsigned long long) * n_logits, s));
  const bool tail = runs_fused_tail(T);
  if (tail) DSINFER_CUDA_CHECK(cudaMemsetAsync(tail_barriers_, 0, sizeof(unsigned) * cfg_.num_hidden_layers, s));
  embed_rows(embed_, H, tok, T, x_, s);
  rope_table(inv_freq_, D / 2, pos, T, attention_factor_, cos_, sin_, s);
  capture(-1);
  mark("embed+rope");
  // L2 prefetch ranges (see pf_window_): [first, first + bytes) of a matrix, clamped to it.
  const bool pf = T <= kPrefetchRows && (pf_window_ > 0 || pf_tail_ > 0 || pf_o_tail_ > 0);
  auto range = [&](const bf16* w, uint64_t size, uint64_t first, uint64_t bytes) {
    L2Prefetch r;
    if (!pf || first >= size || bytes == 0) return r;
    r.p = reinterpret_cast<const char*>(w) + first;
    r.bytes = std::min(bytes, size - first);
    return r;
  };
  const uint64_t b_qkv = 2ull * NQKV * H, b_o = 2ull * H * NQ, b_gu = 4ull * I * H, b_down = 2ull * H * I;
  const uint64_t o_tail = std::min(pf_o_tail_, b_o), gu_win = pf_window_ > 0 ? std::min(pf_window_, b_gu) : 0;
  const bool fold = folds_qk(T);
  bool qkv_ready = false;  // this layer's QKV came from the previous layer's fused tail
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerWeights& W = layers_[l];
    const KVLayerView kvl = kv.layer(l);
    const bool last = l + 1 == cfg_.num_hidden_layers;
    const L2Prefetch after_down = last ? range(head_, 2ull * V * H, 0, pf_tail_) : range(layers_[l + 1].qkv, b_qkv, 0, pf_tail_);
    // The input RMSNorm, SwiGLU and the residual adds are fused into the GEMMs (cuda_gemm.h).
    if (!(diag_omit_ & kOmitQkv) && !qkv_ready)
      gemm_->run(GemmInput::rmsnorm_rows(x_, H, W.in_norm, eps), W.qkv, NQKV, H, qkv_, NQKV, T, false, hb_, s, nullptr,
                 range(W.o, b_o, 0, o_tail));
    if (W.qkv_bias && !qkv_ready) add_bias_rows(qkv_, NQKV, T, NQKV, W.qkv_bias, s);
    if (!qkv_ready) mark("gemm qkv (+rmsnorm)");
    qkv_ready = false;
    const L2Prefetch win_o = pf_window_ > 0 ? range(W.o, b_o, o_tail, b_o) : L2Prefetch{};
    const L2Prefetch win_gu = range(W.gu, b_gu, 0, gu_win);
    const bool side = pf_side_ && pf;
    if (side) {  // fork: the side stream's prefetch runs beside the next two kernels
      DSINFER_CUDA_CHECK(cudaEventRecord(fork_, s));
      DSINFER_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
      l2_prefetch(win_o, win_gu, 32, side_);
      DSINFER_CUDA_CHECK(cudaEventRecord(join_, side_));
    }
    if (fold && !(diag_omit_ & kOmitAttn)) {
      // One row: the q/k step runs in attention's prologue (same bits, one launch fewer).
      attention_rows_fold_qk(qkv_, W.q_norm, W.k_norm, eps, cos_, sin_, kvl, slot, pos, T, NH, NKVH, D, scale, attb_, s,
                             attn_timing_ ? attn_timing_ + static_cast<size_t>(l) * NH * kAttnProfileStamps : nullptr);
      mark("q/k + attention");
    } else if (!fold) {
      if (!(diag_omit_ & kOmitQk))
        qk_norm_rope_store(qkv_, T, NH, NKVH, D, W.q_norm, W.k_norm, eps, cos_, sin_, slot, pos, q_, kvl, s,
                           side ? L2Prefetch{} : win_o);
      mark("qk norm + rope + kv store");
      if (!(diag_omit_ & kOmitAttn))
        attention_rows(q_, kvl, slot, pos, T, NH, NKVH, D, scale, attb_, s, side ? L2Prefetch{} : win_gu);
      mark("attention");
    }
    if (tail) {
      LayerTailArgs a;
      a.attb = attb_, a.w_o = W.o, a.post_norm = W.post_norm, a.w_gu = W.gu, a.act = act_, a.w_down = W.down;
      a.x = x_, a.barrier = tail_barriers_ + l;
      a.H = static_cast<int>(H), a.NQ = static_cast<int>(NQ), a.I = static_cast<int>(I), a.eps = eps;
      a.evict_first = gemv_shape().evict_first_weights;
      a.stage_unroll = tail_stage_unroll_;
      a.warps = tail_warps_;
      if (tail_timing_) a.timing = tail_timing_ + static_cast<size_t>(l) * tail_max_blocks_ * kLayerTailStamps;
      if (!last) {
        a.next_norm = layers_[l + 1].in_norm, a.w_qkv = layers_[l + 1].qkv, a.qkv = qkv_, a.NQKV = static_cast<int>(NQKV);
      }
      tail_grid_ = layer_tail_one_row(a, s);
      if (tail_timing_ && tail_grid_ > tail_max_blocks_) throw Error("CUDA fused layer tail: grid larger than its profile room");
      qkv_ready = !last;
      mark(qkv_ready ? "fused o, gate|up, down, next qkv" : "fused o, gate|up, down");
      capture(l);  // x after this layer's down: the QKV phase does not touch it
      continue;
    }
    if (diag_omit_ & kAddEmpty) empty_launch(32, 256, s);
    if (side) DSINFER_CUDA_CHECK(cudaStreamWaitEvent(s, join_, 0));  // join before the o GEMM
    // Tensor parallelism: rank 0 adds its partial o (and down) output to x as usual, the
    // other ranks overwrite x with theirs, and the all-reduce leaves x + every rank's part
    // in every rank's x; the o bias after it, once.
    const bool into_x = !tp_reduce_ || tp_rank_ == 0;
    if (!(diag_omit_ & kOmitO))
      gemm_->run(GemmInput::bf16_rows(attb_, NQ), W.o, H, NQ, x_, H, T, into_x, nullptr, s, nullptr,
                 range(W.gu, b_gu, gu_win, pf_tail_));
    if (tp_reduce_) tp_reduce_(x_, T * H, s);
    if (W.o_bias) add_bias_rows(x_, H, T, H, W.o_bias, s);
    mark("gemm o (+= x)");
    if (!(diag_omit_ & kOmitGu))
      gemm_->run_silu(GemmInput::rmsnorm_rows(x_, H, W.post_norm, eps), W.gu, 2 * I, H, act_, I, T, gu_, hb_, s,
                      range(W.down, b_down, 0, pf_tail_));
    mark("gemm gate|up (+rmsnorm, swiglu)");
    if (!(diag_omit_ & kOmitDown))
      gemm_->run(GemmInput::bf16_rows(act_, I), W.down, H, I, x_, H, T, into_x, nullptr, s, nullptr, after_down);
    if (tp_reduce_) tp_reduce_(x_, T * H, s);
    mark("gemm down (+= x)");
    capture(l);
  }
  if (n_logits > 0) {
    gemm_->run(GemmInput::rmsnorm_rows(x_, H, final_norm_, eps, lrows), head_, V, H, logits_, V, n_logits, false, hf_,
               s, with_argmax ? keys_ : nullptr);
    mark("lm head (+rmsnorm, argmax)");
  }
}

void CudaQwen3Model::mark(const char* stage) {
  if (!profile_ || capturing_) return;
  if (next_event_ == events_.size()) {
    cudaEvent_t e;
    DSINFER_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  cudaEvent_t e = events_[next_event_++];
  DSINFER_CUDA_CHECK(cudaEventRecord(e, stream_));
  marks_.push_back({stage, e});
}

void CudaQwen3Model::collect_marks(int rows) {
  if (!profile_) return;
  const std::string prefix = "rows " + std::to_string(rows) + ": ";
  for (size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0;
    DSINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second));
    auto& st = stage_ms_[prefix + marks_[i].first];
    st.first += ms;
    st.second += 1;
  }
  if (!marks_.empty()) forwards_[prefix] += 1;
  marks_.clear();
  next_event_ = 0;
}

void CudaQwen3Model::print_profile() const {
  if (persistent_profiled_ > 0) {
    const double f = 1.0 / static_cast<double>(persistent_profiled_);
    std::fprintf(stderr, "DSINFER_CUDA_PERSISTENT_PROFILE: %lld persistent forwards, %.1f us each (kernel start to block 0's last op)\n",
                 static_cast<long long>(persistent_profiled_), persistent_total_us_ * f);
    std::fprintf(stderr, "  %-28s %12s %12s %12s %12s  (us per forward, summed over layers)\n", "op", "phase", "mean block", "slowest", "barrier");
    for (const auto& [name, st] : persistent_stats_)
      std::fprintf(stderr, "  %-28s %12.1f %12.1f %12.1f %12.1f\n", name.c_str(), st.phase_us * f, st.mean_work_us * f,
                   st.max_work_us * f, st.barrier_us * f);
  }
  if (tail_stat_.layers > 0) {
    const double fl = 1.0 / static_cast<double>(tail_stat_.layers);
    const double fq = tail_stat_.qkv_layers ? 1.0 / static_cast<double>(tail_stat_.qkv_layers) : 0.0;
    std::fprintf(stderr, "DSINFER_CUDA_FUSED_TAIL_PROFILE: %d blocks; per layer, us (mean block / slowest block):", tail_grid_);
    static const char* kPhases[4] = {"o", "gate/up", "down", "next qkv"};
    for (int ph = 0; ph < 4; ++ph) {
      const double f = ph == 3 ? fq : fl;
      std::fprintf(stderr, " %s %.2f / %.2f;", kPhases[ph], tail_stat_.work_us[ph] * f, tail_stat_.slowest_us[ph] * f);
    }
    std::fprintf(stderr, " barriers (mean wait / last arrival to last release):");
    for (int br = 0; br < 3; ++br) {
      const double f = br == 2 ? fq : fl;
      std::fprintf(stderr, " %d: %.2f / %.2f;", br + 1, tail_stat_.wait_us[br] * f, tail_stat_.release_us[br] * f);
    }
    std::fprintf(stderr, "\n");
  }
  if (attn_stat_.layers > 0) {
    const double fl = 1.0 / static_cast<double>(attn_stat_.layers);
    std::fprintf(stderr,
                 "DSINFER_CUDA_ATTN_PROFILE: %lld one-row forwards; folded attention per layer: span %.2f us (first "
                 "block in to last block done); last attention block done to the next layer's first one in (o, "
                 "gate/up, down, QKV): %.2f us; thread 0 of a block (mean), us:",
                 static_cast<long long>(attn_stat_.forwards), attn_stat_.span_us * fl,
                 attn_stat_.gaps ? attn_stat_.between_us / static_cast<double>(attn_stat_.gaps) : 0.0);
    static const char* kSteps[7] = {"tile loads issued + wait", "q staged", "prologue barrier", "scores",
                                    "V sums",                   "combine barrier", "output"};
    for (int k = 0; k < 7; ++k) std::fprintf(stderr, " %s %.2f;", kSteps[k], attn_stat_.step_us[k] * fl);
    std::fprintf(stderr, "\n");
  }
  if (!forward_times_by_shape_.empty()) {
    std::fprintf(stderr, "DSINFER_CUDA_FORWARD_TIMES (us per forward call: host prep incl. uploads | launch | wait | after | GPU between events; block tables uploaded KB):\n");
    for (const auto& [k, t] : forward_times_by_shape_) {
      const double f = 1.0 / static_cast<double>(t.n);
      std::fprintf(stderr, "  rows %4d logit rows %4d captured %d graph %d: %7lld calls  prep %6.1f  launch %6.1f  wait %7.1f  after %5.1f  gpu %7.1f  tables %6.1f KB\n",
                   std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), static_cast<long long>(t.n),
                   t.prep_us * f, t.launch_us * f, t.wait_us * f, t.post_us * f, t.gpu_us * f, t.table_kb * f);
    }
  }
  if (!profile_ || stage_ms_.empty()) return;
  std::fprintf(stderr, "DSINFER_CUDA_PROFILE (eager, CUDA events between stages; per forward):\n");
  for (const auto& [prefix, n] : forwards_) {
    double total = 0;
    for (const auto& [name, st] : stage_ms_)
      if (name.rfind(prefix, 0) == 0) total += st.first;
    std::fprintf(stderr, "  %s%lld forwards, %.1f us each\n", prefix.c_str(), static_cast<long long>(n), 1e3 * total / n);
    for (const auto& [name, st] : stage_ms_)
      if (name.rfind(prefix, 0) == 0)
        std::fprintf(stderr, "    %-40s %9.1f us/forward  %5.1f%%\n", name.c_str() + prefix.size(), 1e3 * st.first / n,
                     100.0 * st.first / total);
  }
}

void CudaQwen3Model::run(KVCache& kv_base, const ForwardBatch& batch, ForwardOutput& out, std::vector<int32_t>* ids,
                         std::vector<VerifyRequest>* reqs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tp_reduce_) DSINFER_CUDA_CHECK(cudaSetDevice(opts_.device));  // a tensor-parallel rank runs on its own thread
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t_entry = forward_times_ ? Clock::now() : Clock::time_point{};
  // The dense per-slot cache (make_kv_cache) or the engine's paged pool (make_paged_kv_cache).
  auto* kv = dynamic_cast<DeviceKVStorage*>(&kv_base);
  if (!kv) throw Error("forward: KV cache was not created by this CUDA model's make_kv_cache / make_paged_kv_cache");
  const int L = cfg_.num_hidden_layers, V = cfg_.vocab_size;
  const int64_t H = d_.hidden;
  if (kv->storage_layers() != L || kv->storage_kv_heads() != cfg_.num_key_value_heads ||
      kv->storage_head_dim() != cfg_.head_dim)
    throw Error("forward: KV cache geometry does not match the model");

  // ---- validate everything before the cache is touched (same rules as the CPU model) ----
  const ForwardBatchSize bs =
      check_forward_batch(batch, kv_base, V, L, [&](int slot) { return int64_t(kv->slot_capacity(slot)); });
  const int64_t T = bs.rows, n_logits = bs.logit_rows;
  const int64_t n_cap = static_cast<int64_t>(batch.capture_layers.size());
  check(T < (1 << 30), "forward: too many rows in one batch");
  // capture_to_cache: the captured rows go to the paged pool's feature rows, not the host.
  CudaPagedKVCache* feature_pool = nullptr;
  if (batch.capture_to_cache && n_cap > 0) {
    feature_pool = dynamic_cast<CudaPagedKVCache*>(&kv_base);
    if (!feature_pool || feature_pool->feature_floats() != n_cap * H)
      throw Error("forward: capture_to_cache needs a paged KV cache with feature rows of " + std::to_string(n_cap * H) +
                  " floats (" + std::to_string(n_cap) + " captured layers x hidden " + std::to_string(H) + "), got " +
                  std::to_string(feature_pool ? feature_pool->feature_floats() : 0));
  }

  // Verify requests: checked before the cache is touched too.
  auto fail = [&](size_t e, const std::string& why) { forward_entry_error(batch, e, why); };
  if (reqs) {
    for (const VerifyRequest& q : *reqs) {
      if (q.entry < 0 || q.entry >= static_cast<int>(batch.entries.size()))
        throw Error("forward_verify: request for entry " + std::to_string(q.entry) + " outside the batch");
      const int nl = static_cast<int>(batch.entries[q.entry].logit_rows.size());
      if (q.n_drafts < 0 || q.first_row < 0 || q.first_row + q.n_drafts >= nl)
        fail(q.entry, "verify rows " + std::to_string(q.first_row) + " .. " + std::to_string(q.first_row + q.n_drafts) +
                          " outside its " + std::to_string(nl) + " logit rows");
      for (int i = 0; i < q.n_drafts; ++i)
        if (q.drafts[i] < 0 || q.drafts[i] >= V)
          fail(q.entry, "draft " + std::to_string(i + 1) + " token id " + std::to_string(q.drafts[i]) +
                            " outside the vocabulary [0, " + std::to_string(V) + ")");
      validate_sampling_params(q.params);
      if (!q.params.greedy() && !q.rng) fail(q.entry, "a sampled verify request needs its Rng");
    }
  }
  out.vocab_size = V;
  out.hidden_size = static_cast<int>(H);
  out.captured.resize(feature_pool ? 0 : static_cast<size_t>(T * n_cap * H));
  if (ids || reqs) {
    if (ids) ids->clear();
    out.logits.clear();
  } else {
    out.logits.resize(static_cast<size_t>(n_logits * V));
  }
  if (T == 0) return;

  // ---- rows: (token, position, slot); graph shapes are padded to powers of two ----------
  const bool graph = opts_.use_graphs && !profile_ && T <= kMaxGraphRows;
  const int rows = graph ? graph_bucket(static_cast<int>(T), pow2_buckets_) : static_cast<int>(T);
  const int lrows =
      graph ? (n_logits ? graph_bucket(static_cast<int>(n_logits), pow2_buckets_) : 0) : static_cast<int>(n_logits);
  ensure_workspace(rows, lrows);
  const bool persistent_run = persistent_ && rows == 1 && lrows <= 1 && !profile_;  // enqueue's condition
  const bool tail_run = !persistent_run && runs_fused_tail(rows);
  if (persistent_run) ++persistent_calls_;
  else if (tail_run) ++fused_tail_calls_;
  int32_t* tok = meta_host_;
  int32_t* pos = meta_host_ + cap_rows_;
  int32_t* slot = meta_host_ + 2 * cap_rows_;
  int32_t* lr = meta_host_ + 3 * cap_rows_;
  {
    int r = 0, li = 0;
    for (const ForwardEntry& en : batch.entries) {
      const int start = kv_base.length(en.slot);
      for (int lrow : en.logit_rows) lr[li++] = r + lrow;
      for (size_t i = 0; i < en.tokens.size(); ++i, ++r) {
        tok[r] = en.tokens[i];
        pos[r] = start + static_cast<int>(i);
        slot[r] = en.slot;
      }
    }
    for (; r < rows; ++r) tok[r] = 0, pos[r] = 0, slot[r] = -1;
    for (; li < lrows; ++li) lr[li] = 0;
  }
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(meta_, meta_host_, (3 * cap_rows_ + cap_logits_) * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream_));
  const double table_kb = forward_times_ ? kv->pending_table_bytes() / 1024.0 : 0.0;
  kv->upload(stream_);  // the paged pool's block tables (a fixed device address: graphs replay)
  // Captured rows (padding rows included in graph mode) go to cap_ on the device (or, with
  // capture_to_cache, straight to the pool: the persistent kernel still stages them in
  // cap_); graphs bake its address in, so growing it drops them.
  if (n_cap > 0 && cap_floats_ < static_cast<size_t>(rows * n_cap * H)) {
    drop_graphs();
    if (cap_) cudaFree(cap_);
    cap_ = nullptr;
    cap_floats_ = static_cast<size_t>(rows * n_cap * H);
    DSINFER_CUDA_CHECK(cudaMalloc(&cap_, cap_floats_ * sizeof(float)));
  }

  Clock::time_point t_prep{};
  if (forward_times_) {
    if (!ft_start_) {
      DSINFER_CUDA_CHECK(cudaEventCreate(&ft_start_));
      DSINFER_CUDA_CHECK(cudaEventCreate(&ft_end_));
    }
    t_prep = Clock::now();
    DSINFER_CUDA_CHECK(cudaEventRecord(ft_start_, stream_));
  }
  if (graph) {
    const GraphKey key{kv->uid(), rows, lrows, batch.capture_layers, feature_pool != nullptr};
    auto it = graphs_.find(key);
    if (it == graphs_.end() && seen_[key]++ >= 1) {
      // Second sighting of this shape: capture it (the first ran eagerly, which also warmed
      // up module loading and cuBLAS outside the capture).
      capturing_ = true;
      cudaGraphExec_t exec = nullptr;
      try {
        exec = capture_graph(
            stream_, [&] { enqueue(*kv, rows, lrows, batch.capture_layers, true, feature_pool); }, "cudaGraphInstantiate");
      } catch (...) {
        capturing_ = false;
        throw;
      }
      capturing_ = false;
      it = graphs_.emplace(key, exec).first;
    }
    if (it != graphs_.end()) DSINFER_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    else enqueue(*kv, rows, lrows, batch.capture_layers, true, feature_pool);
  } else {
    enqueue(*kv, static_cast<int>(T), static_cast<int>(n_logits), batch.capture_layers, ids != nullptr || reqs != nullptr,
            feature_pool);
  }
  if (reqs && n_logits > 0) enqueue_verify(batch, *reqs);
  Clock::time_point t_launch{};
  if (forward_times_) {
    DSINFER_CUDA_CHECK(cudaEventRecord(ft_end_, stream_));
    t_launch = Clock::now();
  }

  // ---- results back: ids or logit rows, and captured layers -----------------------------
  if (ids && n_logits > 0) {
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(keys_host_, keys_, n_logits * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                       stream_));
  } else if (!ids && !reqs && n_logits > 0) {
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(out.logits.data(), logits_, n_logits * V * sizeof(float), cudaMemcpyDeviceToHost,
                                       stream_));
  }
  if (n_cap > 0 && !feature_pool)
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(out.captured.data(), cap_, T * n_cap * H * sizeof(float), cudaMemcpyDeviceToHost,
                                       stream_));
  DSINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const Clock::time_point t_sync = forward_times_ ? Clock::now() : Clock::time_point{};
  collect_marks(static_cast<int>(T));
  if (persistent_timing_ && persistent_ && rows == 1 && lrows <= 1) collect_persistent_timing();
  // (only forwards that ran the folded attention kernel stamped the buffer)
  if (attn_timing_ && folds_qk(static_cast<int>(T)) && !(diag_omit_ & kOmitAttn) && !(persistent_ && lrows <= 1))
    collect_attn_timing();
  if (tail_timing_ && tail_run) collect_tail_timing();
  if (reqs && n_logits > 0) finish_verify(*reqs);
  if (ids) {
    ids->resize(n_logits);
    for (int64_t i = 0; i < n_logits; ++i) (*ids)[i] = argmax_from_key(keys_host_[i]);
  }
  for (const ForwardEntry& en : batch.entries)
    kv->set_length(en.slot, kv_base.length(en.slot) + static_cast<int>(en.tokens.size()));
  if (forward_times_) {
    float gpu_ms = 0;
    DSINFER_CUDA_CHECK(cudaEventElapsedTime(&gpu_ms, ft_start_, ft_end_));
    auto us = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
    ForwardTimes& t = forward_times_by_shape_[{rows, lrows, static_cast<int>(n_cap), graph ? 1 : 0}];
    ++t.n;
    t.prep_us += us(t_entry, t_prep);
    t.launch_us += us(t_prep, t_launch);
    t.wait_us += us(t_launch, t_sync);
    t.post_us += us(t_sync, Clock::now());
    t.gpu_us += 1e3 * gpu_ms;
    t.table_kb += table_kb;
  }
}

void CudaQwen3Model::enqueue_verify(const ForwardBatch& batch, std::vector<VerifyRequest>& reqs) {
  const int V = cfg_.vocab_size;
  // First logit row of each entry (logits_ holds the rows in batch order).
  std::vector<int> row_base(batch.entries.size() + 1, 0);
  for (size_t e = 0; e < batch.entries.size(); ++e)
    row_base[e + 1] = row_base[e] + static_cast<int>(batch.entries[e].logit_rows.size());
  std::vector<int32_t> dist_rows, drafts;
  std::vector<SampleParamsDev> params;
  std::vector<VerifyItemDev> items;
  std::vector<double> uniforms;
  int q_rows = 0;
  for (VerifyRequest& r : reqs) {
    VerifyItemDev it;
    it.greedy = r.params.greedy() ? 1 : 0;
    it.n = r.n_drafts;
    it.draft_off = static_cast<int>(drafts.size());
    it.row0 = row_base[r.entry] + r.first_row;
    drafts.insert(drafts.end(), r.drafts, r.drafts + r.n_drafts);
    if (!it.greedy) {
      it.dist0 = static_cast<int>(dist_rows.size());
      for (int i = 0; i <= r.n_drafts; ++i) {
        dist_rows.push_back(it.row0 + i);
        params.push_back({r.params.temperature, r.params.top_k, r.params.top_p});
      }
      if (r.q && r.n_drafts > 0) {
        it.q_off = q_rows;
        q_rows += r.n_drafts;
      }
      // The uniforms verify_drafts would draw (at most n + 1), from a copy of the Rng;
      // finish_verify advances the request's own Rng by the count used.
      it.u_off = static_cast<int>(uniforms.size());
      Rng copy = *r.rng;
      for (int i = 0; i <= r.n_drafts; ++i) uniforms.push_back(copy.uniform());
    }
    items.push_back(it);
  }
  if (drafts.empty()) drafts.push_back(0);
  // One host image, one device allocation, one copy up: [rows | params | items | drafts |
  // uniforms | dist (device only) | results].
  auto align = [](size_t x) { return (x + 15) & ~size_t(15); };
  const size_t o_rows = 0, o_params = align(o_rows + dist_rows.size() * sizeof(int32_t));
  const size_t o_items = align(o_params + params.size() * sizeof(SampleParamsDev));
  const size_t o_drafts = align(o_items + items.size() * sizeof(VerifyItemDev));
  const size_t o_u = align(o_drafts + drafts.size() * sizeof(int32_t));
  const size_t o_dist = align(o_u + uniforms.size() * sizeof(double));
  const size_t o_res = align(o_dist + dist_rows.size() * sizeof(RowDist));
  const size_t total = align(o_res + items.size() * 2 * sizeof(int32_t));
  vblob_.assign(total, 0);
  std::memcpy(vblob_.data() + o_rows, dist_rows.data(), dist_rows.size() * sizeof(int32_t));
  std::memcpy(vblob_.data() + o_params, params.data(), params.size() * sizeof(SampleParamsDev));
  std::memcpy(vblob_.data() + o_items, items.data(), items.size() * sizeof(VerifyItemDev));
  std::memcpy(vblob_.data() + o_drafts, drafts.data(), drafts.size() * sizeof(int32_t));
  std::memcpy(vblob_.data() + o_u, uniforms.data(), uniforms.size() * sizeof(double));
  DSINFER_CUDA_CHECK(cudaMallocAsync(&vdev_, total, stream_));
  char* dv = static_cast<char*>(vdev_);
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(dv, vblob_.data(), o_dist, cudaMemcpyHostToDevice, stream_));
  vq_ = nullptr;
  if (q_rows > 0) {
    DSINFER_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&vq_), sizeof(float) * q_rows * V, stream_));
    for (size_t k = 0; k < reqs.size(); ++k)
      if (items[k].q_off >= 0)
        DSINFER_CUDA_CHECK(cudaMemcpyAsync(vq_ + static_cast<size_t>(items[k].q_off) * V, reqs[k].q,
                                           sizeof(float) * reqs[k].n_drafts * V, cudaMemcpyHostToDevice, stream_));
  }
  auto* dist = reinterpret_cast<RowDist*>(dv + o_dist);
  row_dist(logits_, V, V, reinterpret_cast<const int32_t*>(dv + o_rows), reinterpret_cast<const SampleParamsDev*>(dv + o_params),
           static_cast<int>(dist_rows.size()), dist, stream_);
  verify_items(logits_, V, V, keys_, dist, reinterpret_cast<const VerifyItemDev*>(dv + o_items), static_cast<int>(items.size()),
               reinterpret_cast<const int32_t*>(dv + o_drafts), vq_, reinterpret_cast<const double*>(dv + o_u),
               reinterpret_cast<int32_t*>(dv + o_res), stream_);
  v_result_off_ = o_res;
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(vblob_.data() + o_res, dv + o_res, items.size() * 2 * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream_));
  DSINFER_CUDA_CHECK(cudaFreeAsync(vdev_, stream_));
  if (vq_) DSINFER_CUDA_CHECK(cudaFreeAsync(vq_, stream_));
  vdev_ = nullptr;
  vq_ = nullptr;
}

void CudaQwen3Model::finish_verify(std::vector<VerifyRequest>& reqs) {
  const int32_t* res = reinterpret_cast<const int32_t*>(vblob_.data() + v_result_off_);
  for (size_t k = 0; k < reqs.size(); ++k) {
    VerifyRequest& r = reqs[k];
    r.accepted = res[2 * k];
    r.next_token = res[2 * k + 1];
    if (r.params.greedy()) continue;
    // verify_drafts' draws: one per tested draft, plus one for the token drawn.
    const int used = r.accepted < r.n_drafts ? r.accepted + 2 : r.n_drafts + 1;
    for (int i = 0; i < used; ++i) r.rng->uniform();
  }
}

void CudaQwen3Model::embed(const int32_t* ids, int n, float* out) const {
  if (n <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= cfg_.vocab_size)
      throw Error("embed: token id " + std::to_string(ids[i]) + " outside the vocabulary [0, " +
                  std::to_string(cfg_.vocab_size) + ")");
  DeviceArena tmp;
  int32_t* d_ids = tmp.upload(ids, n);
  float* d_out = tmp.alloc<float>(static_cast<size_t>(n) * d_.hidden);
  embed_rows(embed_, d_.hidden, d_ids, n, d_out, stream_);
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(out, d_out, sizeof(float) * n * d_.hidden, cudaMemcpyDeviceToHost, stream_));
  DSINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaQwen3Model::lm_head(const float* hidden, int n, float* logits, bool apply_norm) const {
  if (n <= 0) return;
  const int64_t H = d_.hidden, V = cfg_.vocab_size;
  std::lock_guard<std::mutex> lock(mu_);
  if (n > head_rows_) {
    head_ws_.release();
    head_rows_ = std::max(n, 2 * head_rows_);
    head_in_ = head_ws_.alloc<float>(static_cast<size_t>(head_rows_) * H);
    head_bf_ = head_ws_.alloc<bf16>(static_cast<size_t>(head_rows_) * H);
    head_out_ = head_ws_.alloc<float>(static_cast<size_t>(head_rows_) * V);
  }
  float* d_h = head_in_;
  bf16* d_hb = head_bf_;
  float* d_logits = head_out_;
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(d_h, hidden, sizeof(float) * n * H, cudaMemcpyHostToDevice, stream_));
  if (apply_norm) rmsnorm_rows(d_h, H, nullptr, n, static_cast<int>(H), final_norm_, d_.eps, d_hb, H, stream_);
  else f32_to_bf16_n(d_h, n * H, d_hb, stream_);
  gemm_->run(GemmInput::bf16_rows(d_hb, H), head_, static_cast<int>(V), static_cast<int>(H), d_logits, V, n, false,
             nullptr, stream_);
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(logits, d_logits, sizeof(float) * n * V, cudaMemcpyDeviceToHost, stream_));
  DSINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace
}  // namespace cuda

int64_t cuda_persistent_decode_calls(const Model& model) {
  const auto* m = dynamic_cast<const cuda::CudaQwen3Model*>(&model);
  return m ? m->persistent_calls() : 0;
}

int64_t cuda_fused_tail_calls(const Model& model) {
  const auto* m = dynamic_cast<const cuda::CudaQwen3Model*>(&model);
  return m ? m->fused_tail_calls() : 0;
}

std::unique_ptr<Model> load_qwen3_cuda_tensor_parallel(const std::string& model_dir, int ranks,
                                                       const CudaModelOptions& opts, TensorParallelTransport transport) {
  ModelConfig cfg = load_model_config(model_dir);
  const bool qwen3 = is_qwen3(cfg);
  if (!qwen3)
    throw Error(model_dir + "/config.json: field 'architectures': tensor parallelism supports Qwen3 dense models only");
  const TensorParallelPlan plan = plan_tensor_parallel(cfg, ranks);
  const bool nccl = transport == TensorParallelTransport::Nccl;
  std::shared_ptr<cuda::NcclGroup> comms;
  if (nccl) {
    int count = 0;
    DSINFER_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (opts.device + ranks > count)
      throw Error("--tensor-parallel " + std::to_string(ranks) + ": one GPU per rank from device " +
                  std::to_string(opts.device) + " needs " + std::to_string(opts.device + ranks) + " GPUs, found " +
                  std::to_string(count));
    std::vector<int> devices;
    for (int r = 0; r < ranks; ++r) devices.push_back(opts.device + r);
    comms = std::make_shared<cuda::NcclGroup>(devices);
  }
  // The group the ranks' threads meet in (the host-memory sums; with NCCL only its
  // forward-level bookkeeping).
  auto group = std::make_shared<HostAllReduce>(ranks);
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < ranks; ++r) {
    cuda::CudaRankSpec spec;
    spec.full = cfg;
    spec.plan = plan;
    spec.rank = r;
    CudaModelOptions ro = opts;
    ro.device = nccl ? opts.device + r : opts.device;
    const int device = ro.device;
    if (nccl) {
      // An all-gather into [ranks][n] and the sum in rank order, on the rank's stream. The
      // gather buffer of a graph-sized call has one address for the model's life (graphs
      // replay it); larger calls (eager) use a second buffer that grows.
      struct Buffers {
        float* small = nullptr;
        float* large = nullptr;
        size_t small_n = 0, large_n = 0;
        ~Buffers() {
          if (small) cudaFree(small);
          if (large) cudaFree(large);
        }
      };
      auto buf = std::make_shared<Buffers>();
      buf->small_n = static_cast<size_t>(ranks) * cuda::kMaxGraphRows * static_cast<size_t>(cfg.hidden_size);
      DSINFER_CUDA_CHECK(cudaSetDevice(device));
      DSINFER_CUDA_CHECK(cudaMalloc(&buf->small, buf->small_n * sizeof(float)));
      spec.reduce = [comms, buf, r, ranks](float* rows, int64_t n, cudaStream_t s) {
        const size_t need = static_cast<size_t>(ranks) * static_cast<size_t>(n);
        float* recv = buf->small;
        if (need > buf->small_n) {
          if (need > buf->large_n) {
            DSINFER_CUDA_CHECK(cudaStreamSynchronize(s));
            if (buf->large) DSINFER_CUDA_CHECK(cudaFree(buf->large));
            DSINFER_CUDA_CHECK(cudaMalloc(&buf->large, need * sizeof(float)));
            buf->large_n = need;
          }
          recv = buf->large;
        }
        comms->all_gather(r, rows, recv, static_cast<size_t>(n), s);
        cuda::sum_rank_rows(recv, ranks, n, rows, s);
      };
      spec.reduce_in_graphs = true;
    } else {
      // Through host memory: the stream drained, the rows summed by HostAllReduce, copied back.
      auto host = std::make_shared<std::vector<float>>();
      spec.reduce = [group, r, host, device](float* rows, int64_t n, cudaStream_t s) {
        DSINFER_CUDA_CHECK(cudaSetDevice(device));
        host->resize(static_cast<size_t>(n));
        DSINFER_CUDA_CHECK(cudaMemcpyAsync(host->data(), rows, static_cast<size_t>(n) * sizeof(float),
                                           cudaMemcpyDeviceToHost, s));
        DSINFER_CUDA_CHECK(cudaStreamSynchronize(s));
        group->sum(r, host->data(), n);
        DSINFER_CUDA_CHECK(cudaMemcpyAsync(rows, host->data(), static_cast<size_t>(n) * sizeof(float),
                                           cudaMemcpyHostToDevice, s));
        DSINFER_CUDA_CHECK(cudaStreamSynchronize(s));
      };
      spec.reduce_in_graphs = false;
    }
    models.push_back(std::make_unique<cuda::CudaQwen3Model>(rank_config(cfg, plan.at(r)), ro, &spec));
  }
  DSINFER_CUDA_CHECK(cudaSetDevice(opts.device));  // each rank's constructor made its own device current
  return make_tensor_parallel_model(cfg, std::move(models), std::move(group));
}

std::unique_ptr<Model> load_qwen3_cuda(const std::string& model_dir, const CudaModelOptions& opts) {
  ModelConfig cfg = load_model_config(model_dir);
  const bool qwen3 = is_qwen3(cfg);
  if (!qwen3)
    throw Error(model_dir + "/config.json: field 'architectures': '" + cfg.architecture +
                "' is not supported by the CUDA backend (supported: Qwen3ForCausalLM)");
  // DeepSpec drafters of a CUDA target run on the GPU too (spec/drafter_loader.h).
  register_device_drafter_factory(&make_cuda_deepspec_drafter);
  return std::make_unique<cuda::CudaQwen3Model>(cfg, opts);
}

}  // namespace dsinfer
