// dsinfer CUDA backend: the DeepSpec drafter on the GPU (see cuda_drafter.h for the data
// flow). The per-sequence state mirrors the host's DraftContext (spec/dflash_backbone.h):
// committed rows from absolute position store_first on, a sliding window that moves
// visible_begin and compacts once the dead prefix is as large as the kept rows (so the
// compaction copy never overlaps), and the block's K/V written after the committed rows
// for one call only. A propose ends with one stream synchronisation (the caller needs the
// drafts). A context commit returns once its work is enqueued: the next call waits for the
// commit's uploads (an event) before it rewrites the pinned staging buffers, and its own
// work follows the commit's on the one stream. So a step's commit + propose costs one
// synchronisation, not two (DSINFER_CUDA_DRAFTER_COMMIT_SYNC=1 restores a synchronising
// commit, for A/B runs; the profile mode synchronises too, to time each pass).
// Captured target rows: from the host (hidden), or, in the batched engine, straight from the
// target's paged pool (its feature rows, written by the forward on the device): the commit
// gathers them by block table with one kernel and nothing crosses the PCIe bus
// (reads_cache_features; DSINFER_CUDA_DEVICE_FEATURES=0 makes the engine keep its host store,
// for A/B runs).
// CUDA graphs: a greedy pass with the device heads (the vanilla Markov head) is one graph per
// (items, drafted positions), captured at the second pass of that shape and replayed after
// (meta uploads, ~35 kernels and the id/confidence copies back in one launch); every
// per-sequence address travels in the uploaded meta, so a replay serves any sequences.
#include "backend/cuda/cuda_drafter.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_drafter_kernels.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_paged_kv_cache.h"
#include "backend/cuda/cuda_target.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/cpu/rmsnorm.h"
#include "model/model.h"
#include "model/qwen3_layer.h"
#include "model/rope_params.h"
#include "model/weights.h"
#include "spec/confidence_head.h"
#include "spec/dflash_backbone.h"
#include "spec/markov_head.h"

namespace dsinfer {
namespace cuda {
namespace {

// The drafter's stream, shared with its sequences: a sequence frees its buffer on it
// (stream-ordered, no device-wide synchronisation), so it lives as long as the last of them.
struct StreamHolder {
  cudaStream_t s = nullptr;
  ~StreamHolder() {
    if (s) cudaStreamDestroy(s);
  }
};

class CudaDraftSeq final : public DraftSequence {
 public:
  explicit CudaDraftSeq(std::shared_ptr<StreamHolder> st) : st_(std::move(st)) {}
  ~CudaDraftSeq() override {
    if (buf) cudaFreeAsync(buf, st_->s);
  }
  int context_length() const override { return length; }

  std::shared_ptr<StreamHolder> st_;
  bf16* buf = nullptr;  // [layers][2][kv_heads][cap][head_dim]
  int cap = 0;          // rows per (layer, K|V, head) segment
  int length = 0;       // committed positions so far (absolute)
  int store_first = 0;  // absolute position of store row 0
  int visible_begin = 0;
  int window_override = 0;
};

// Workspace growths so far: a pass that grew one (cudaFree synchronises the whole device,
// cudaMallocHost is slow) is profiled apart from the steady-state passes.
std::atomic<int64_t> g_growths{0};

// A commit from the pool's feature rows runs as a graph up to this many rows (a step's
// accepted rows; a prompt's whole commit runs once, eagerly), its row count padded as the
// model's forwards are (graph_rows_bucket).
constexpr int64_t kMaxCommitGraphRows = 512;

// Grow-only device / pinned host buffers of the drafter's passes.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  T* need(size_t m) {
    if (m > n) {
      if (p) cudaFree(p);
      p = nullptr;
      n = std::max(m, 2 * n);
      g_growths.fetch_add(1);
      DSINFER_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    }
    return p;
  }
};
template <typename T>
struct PinBuf {
  T* p = nullptr;
  size_t n = 0;
  PinBuf() = default;
  PinBuf(const PinBuf&) = delete;
  ~PinBuf() {
    if (p) cudaFreeHost(p);
  }
  T* need(size_t m) {
    if (m > n) {
      if (p) cudaFreeHost(p);
      p = nullptr;
      n = std::max(m, 2 * n);
      g_growths.fetch_add(1);
      DSINFER_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(T)));
    }
    return p;
  }
};

struct DraftLayer {
  bf16 *qkv = nullptr, *o = nullptr, *gu = nullptr, *down = nullptr;
  float *qkv_bias = nullptr, *o_bias = nullptr, *in_norm = nullptr, *post_norm = nullptr;
};

class CudaDeepSpecDrafter final : public Drafter {
 public:
  CudaDeepSpecDrafter(const DraftConfig& cfg, const Model& target, const CudaTarget& ct, const DrafterOptions& opts);
  ~CudaDeepSpecDrafter() override;

  const DrafterInfo& info() const override { return info_; }
  std::unique_ptr<DraftSequence> start() const override { return std::make_unique<CudaDraftSeq>(stream_); }
  void commit_context(DraftSequence& seq, const int32_t* tokens, const float* hidden, int c) const override {
    if (c < 0) throw Error("dflash commit_context: negative position count " + std::to_string(c));
    commit_context_batch({ContextBatchItem{&seq, tokens, hidden, c}});
  }
  DraftProposal propose(DraftSequence& seq, int32_t anchor, int max_tokens, const SamplingParams& params,
                        Rng& rng) const override {
    return std::move(propose_batch({DraftBatchItem{&seq, anchor, max_tokens, &params, &rng}})[0]);
  }
  std::vector<DraftProposal> propose_batch(const std::vector<DraftBatchItem>& items) const override;
  void commit_context_batch(const std::vector<ContextBatchItem>& items) const override;
  bool reads_cache_features() const override { return device_features_; }
  bool supports_window() const override { return true; }
  void set_window(DraftSequence& seq, int window) const override;
  void reserve(DraftSequence& seq, int positions) const override;

 private:
  static CudaDraftSeq& as_seq(DraftSequence& s);
  size_t seq_bytes(int cap) const { return static_cast<size_t>(L_) * 2 * NKV_ * cap * D_ * sizeof(bf16); }
  void ensure_capacity(CudaDraftSeq& s, int rows_needed) const;
  void apply_window(CudaDraftSeq& s) const;
  const bf16* upload_matrix(const WeightView& w);
  // The target's device copy when the checkpoint's [V, H] tensor is byte-identical to the
  // target's (frozen copies in DeepSpec training), else our own upload.
  const bf16* shared_or_own(const std::string& name, const WeightView* target_view, const bf16* target_device);
  // Sampled items, or a gated/rnn head: the heads on the host, from the device's base
  // logits and final-normed rows, exactly as the host drafter (spec/deepspec_drafter.cpp).
  void host_heads(const std::vector<DraftBatchItem>& items, const std::vector<int>& ns, int R, int max_n,
                  std::vector<DraftProposal>& props) const;

  // DSINFER_CUDA_DRAFTER_PROFILE=1: wall time of every pass (enqueue to the end of its
  // synchronisation), summed per (call, rows bucket) and printed to stderr at destruction.
  bool profile_ = false;
  bool commit_sync_ = false;             // DSINFER_CUDA_DRAFTER_COMMIT_SYNC=1
  // DSINFER_CUDA_DRAFTER_TIMES=1 (a diagnostic; graphs stay on): per propose pass, by item
  // count rounded up to a power of two, the host time of the commit call before it, the
  // propose call's host preparation, launch and wait, and GPU times between events (the
  // commit's kernels, the idle gap until the propose pass starts, the propose pass).
  struct PassTimes {
    int64_t n = 0, commits = 0;
    double commit_host_us = 0, commit_gpu_us = 0, gap_us = 0, prep_us = 0, launch_us = 0, wait_us = 0, gpu_us = 0;
  };
  bool times_ = false;
  cudaEvent_t tev_[4] = {};
  mutable bool commit_timed_ = false;
  mutable double commit_host_us_ = 0;
  mutable std::map<int, PassTimes> times_by_items_;
  bool device_features_ = true;          // DSINFER_CUDA_DEVICE_FEATURES=0 turns it off
  // CUDA graphs of the greedy device-head propose pass, per (items, drafted positions): the
  // second pass of a shape is captured, later ones replay it (one launch instead of ~35).
  // Workspaces are grow-only and graphs bake their addresses in, so any growth (g_growths)
  // drops them all. Off with the target's --cuda-graphs off or DSINFER_CUDA_DRAFTER_GRAPHS=0.
  bool use_graphs_ = true;
  mutable std::map<std::pair<int, int>, cudaGraphExec_t> graphs_;
  mutable std::map<std::pair<int, int>, int> graph_seen_;
  mutable int64_t graphs_growths_ = -1;
  // CUDA graphs of the context commit from a device pool's feature rows, per padded row
  // count (graph_rows_bucket) and pool: a commit was ~8 launches and three uploads, 50-65 us
  // of host launching that the GPU waited on at every drafting step. Padding rows gather the
  // pool's row 0 and store nothing (their buffer base is 0).
  bool use_commit_graphs_ = true;  // DSINFER_CUDA_COMMIT_GRAPHS=0 turns them off (A/B)
  mutable std::map<std::pair<int, const void*>, cudaGraphExec_t> commit_graphs_;
  mutable std::map<std::pair<int, const void*>, int> commit_graph_seen_;
  void drop_graphs() const {
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
    for (auto& [k, g] : commit_graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
    graph_seen_.clear();
    commit_graphs_.clear();
    commit_graph_seen_.clear();
  }
  cudaEvent_t staged_ = nullptr;         // recorded after a commit's uploads from pinned staging
  mutable bool staged_pending_ = false;  // a commit's uploads may still read the staging buffers
  // Before the host rewrites (or grows) the pinned staging buffers.
  void wait_staging() const {
    if (!staged_pending_) return;
    DSINFER_CUDA_CHECK(cudaEventSynchronize(staged_));
    staged_pending_ = false;
  }
  mutable std::map<std::pair<std::string, int>, std::pair<double, int64_t>> prof_;
  // growths0: g_growths when the pass began.
  void record(const char* what, int n, std::chrono::steady_clock::time_point t0, int64_t growths0) const {
    if (!profile_) return;
    int b = 1;
    while (b < n) b <<= 1;
    auto& e = prof_[{std::string(what) + (g_growths.load() != growths0 ? " (grew)" : ""), b}];
    e.first += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    e.second += 1;
  }

  DrafterInfo info_;
  int H_ = 0, I_ = 0, L_ = 0, NH_ = 0, NKV_ = 0, D_ = 0, m_ = 0, bs_ = 0, window_ = 0, V_ = 0, rank_ = 0;
  float eps_ = 1e-6f, attention_factor_ = 1.0f, conf_b_ = 0.0f;
  bool vanilla_ = false, conf_with_markov_ = false;

  std::unique_ptr<WeightStore> store_;  // host views (BF16) for the host heads
  std::unique_ptr<MarkovHead> markov_;
  std::unique_ptr<ConfidenceHead> conf_;
  std::vector<float> final_norm_host_;

  std::shared_ptr<StreamHolder> stream_;
  std::unique_ptr<Gemm> gemm_;
  mutable std::mutex mu_;
  DeviceArena weights_;  // the drafter's device matrices, freed with it
  const bf16 *embed_ = nullptr, *head_ = nullptr, *fc_ = nullptr, *kv_all_ = nullptr, *w1_ = nullptr, *w2_ = nullptr;
  float *kv_bias_all_ = nullptr, *hidden_norm_ = nullptr, *final_norm_ = nullptr, *q_norm_all_ = nullptr,
        *k_norm_all_ = nullptr, *inv_freq_ = nullptr, *conf_w_ = nullptr;
  std::vector<DraftLayer> layers_;

  // Workspaces (grow-only; one pass at a time under mu_).
  mutable DevBuf<float> feat_, ctx_, kvrows_, cos_, sin_, x_, qkv_, q_, gu_, logits_, hdot_, z_;
  mutable DevBuf<bf16> feat_bf_, hb_, attb_, act_, e_;
  mutable DevBuf<int32_t> meta_, ids_;
  mutable DevBuf<unsigned long long> bases_, keys_;
  mutable PinBuf<float> feat_h_, z_h_, logits_h_, x_h_;
  mutable PinBuf<int32_t> meta_h_, ids_h_;
  mutable PinBuf<unsigned long long> bases_h_;
  // The commit's own pinned staging (its uploads may still be pending when a propose pass
  // writes its own), and device copies of it.
  mutable PinBuf<int32_t> cmeta_h_;
  mutable PinBuf<unsigned long long> cbases_h_;
  mutable DevBuf<int32_t> cmeta_;
  mutable DevBuf<unsigned long long> cbases_;
};

CudaDeepSpecDrafter::CudaDeepSpecDrafter(const DraftConfig& cfg, const Model& target, const CudaTarget& ct,
                                         const DrafterOptions& opts) {
  const ModelConfig& b = cfg.base;
  const std::string cfile = b.model_dir + "/config.json";
  H_ = b.hidden_size;
  I_ = b.intermediate_size;
  L_ = b.num_hidden_layers;
  NH_ = b.num_attention_heads;
  NKV_ = b.num_key_value_heads;
  D_ = b.head_dim;
  m_ = static_cast<int>(cfg.target_layer_ids.size());
  bs_ = cfg.block_size;
  V_ = target.config().vocab_size;
  eps_ = static_cast<float>(b.rms_norm_eps);
  if (const char* p = std::getenv("DSINFER_CUDA_DRAFTER_PROFILE")) profile_ = std::string(p) == "1";
  times_ = env_switch("DSINFER_CUDA_DRAFTER_TIMES", false);
  if (times_)
    for (cudaEvent_t& e : tev_) DSINFER_CUDA_CHECK(cudaEventCreate(&e));
  commit_sync_ = env_switch("DSINFER_CUDA_DRAFTER_COMMIT_SYNC", false);
  use_graphs_ = ct.graphs_enabled() && env_switch("DSINFER_CUDA_DRAFTER_GRAPHS", true);
  use_commit_graphs_ = use_graphs_ && env_switch("DSINFER_CUDA_COMMIT_GRAPHS", true);
  device_features_ = env_switch("DSINFER_CUDA_DEVICE_FEATURES", true);
  window_ = opts.window_size >= 0 ? opts.window_size : cfg.context_window;
  if (D_ > 256 || D_ % 2 != 0)
    throw Error(cfile + ": field 'head_dim': " + std::to_string(D_) + " not supported on CUDA (even, <= 256)");
  if (NKV_ <= 0 || NH_ % NKV_ != 0)
    throw Error(cfile + ": field 'num_key_value_heads': must divide num_attention_heads");
  DSINFER_CUDA_CHECK(cudaSetDevice(ct.device_ordinal()));
  stream_ = std::make_shared<StreamHolder>();
  DSINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_->s, cudaStreamNonBlocking));
  DSINFER_CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  gemm_ = std::make_unique<Gemm>(ct.gemm_batch_invariant());

  store_ = std::make_unique<WeightStore>(b.model_dir, "bf16");
  const RopeParams rope = compute_rope_params(b.rope, D_, b.max_position_embeddings);
  attention_factor_ = rope.attention_factor;
  inv_freq_ = weights_.upload(rope.inv_freq.data(), rope.inv_freq.size());
  const int64_t H = H_, F = int64_t{m_} * H;
  fc_ = upload_matrix(store_->matrix("fc.weight", H, F));
  const std::vector<float> hn = store_->vector_f32("hidden_norm.weight", H);
  hidden_norm_ = weights_.upload(hn.data(), hn.size());
  final_norm_host_ = store_->vector_f32("norm.weight", H);
  final_norm_ = weights_.upload(final_norm_host_.data(), final_norm_host_.size());

  const Qwen3LayerDims d = qwen3_layer_dims(b);
  const int64_t NQ = d.q_width(), NK = d.kv_width(), I = d.intermediate;
  std::vector<bf16> kv_all;  // every layer's k then v rows: one GEMM at commit time
  std::vector<float> kv_bias, qn, kn;
  auto bf16_rows = [](const WeightView& w) {
    if (w.dtype != DType::BF16) throw Error("CUDA drafter upload: expected a BF16 matrix after conversion");
    return static_cast<const bf16*>(w.data);
  };
  layers_.resize(L_);
  for (int l = 0; l < L_; ++l) {
    const Qwen3LayerWeights w = load_qwen3_layer(*store_, "layers." + std::to_string(l) + ".", d, b.attention_bias);
    DraftLayer& Lw = layers_[l];
    bf16* qkv = weights_.alloc<bf16>((NQ + 2 * NK) * H);
    DSINFER_CUDA_CHECK(cudaMemcpy(qkv, bf16_rows(w.q), NQ * H * sizeof(bf16), cudaMemcpyHostToDevice));
    DSINFER_CUDA_CHECK(cudaMemcpy(qkv + NQ * H, bf16_rows(w.k), NK * H * sizeof(bf16), cudaMemcpyHostToDevice));
    DSINFER_CUDA_CHECK(cudaMemcpy(qkv + (NQ + NK) * H, bf16_rows(w.v), NK * H * sizeof(bf16), cudaMemcpyHostToDevice));
    Lw.qkv = qkv;
    Lw.o = const_cast<bf16*>(upload_matrix(w.o));
    // gate and up interleaved by row, as the target (Gemm::run_silu's SwiGLU epilogue).
    bf16* gu = weights_.alloc<bf16>(2 * I * H);
    DSINFER_CUDA_CHECK(cudaMemcpy2D(gu, 2 * H * sizeof(bf16), bf16_rows(w.gate), H * sizeof(bf16), H * sizeof(bf16), I,
                                    cudaMemcpyHostToDevice));
    DSINFER_CUDA_CHECK(cudaMemcpy2D(gu + H, 2 * H * sizeof(bf16), bf16_rows(w.up), H * sizeof(bf16), H * sizeof(bf16), I,
                                    cudaMemcpyHostToDevice));
    Lw.gu = gu;
    Lw.down = const_cast<bf16*>(upload_matrix(w.down));
    kv_all.insert(kv_all.end(), bf16_rows(w.k), bf16_rows(w.k) + NK * H);
    kv_all.insert(kv_all.end(), bf16_rows(w.v), bf16_rows(w.v) + NK * H);
    if (b.attention_bias) {
      std::vector<float> bq(w.q_bias);
      bq.insert(bq.end(), w.k_bias.begin(), w.k_bias.end());
      bq.insert(bq.end(), w.v_bias.begin(), w.v_bias.end());
      Lw.qkv_bias = weights_.upload(bq.data(), bq.size());
      Lw.o_bias = weights_.upload(w.o_bias.data(), w.o_bias.size());
      kv_bias.insert(kv_bias.end(), w.k_bias.begin(), w.k_bias.end());
      kv_bias.insert(kv_bias.end(), w.v_bias.begin(), w.v_bias.end());
    }
    qn.insert(qn.end(), w.q_norm.begin(), w.q_norm.end());
    kn.insert(kn.end(), w.k_norm.begin(), w.k_norm.end());
    Lw.in_norm = weights_.upload(w.in_norm.data(), w.in_norm.size());
    Lw.post_norm = weights_.upload(w.post_norm.data(), w.post_norm.size());
  }
  kv_all_ = weights_.upload(kv_all.data(), kv_all.size());
  if (!kv_bias.empty()) kv_bias_all_ = weights_.upload(kv_bias.data(), kv_bias.size());
  q_norm_all_ = weights_.upload(qn.data(), qn.size());
  k_norm_all_ = weights_.upload(kn.data(), kn.size());

  embed_ = shared_or_own("embed_tokens.weight", target.host_embedding(), ct.device_embedding());
  head_ = shared_or_own("lm_head.weight", target.host_lm_head(), ct.device_lm_head());

  if (cfg.markov_rank > 0) {
    rank_ = cfg.markov_rank;
    const MarkovHead::Type t = cfg.markov_head == "gated" ? MarkovHead::Type::Gated
                               : cfg.markov_head == "rnn" ? MarkovHead::Type::Rnn
                                                          : MarkovHead::Type::Vanilla;
    markov_ = std::make_unique<MarkovHead>(*store_, t, V_, rank_, H_);
    vanilla_ = t == MarkovHead::Type::Vanilla;
    w1_ = upload_matrix(store_->matrix("markov_head.markov_w1.weight", V_, rank_));
    w2_ = upload_matrix(store_->matrix("markov_head.markov_w2.weight", V_, rank_));
  }
  if (cfg.confidence_head) {
    conf_with_markov_ = cfg.confidence_with_markov < 0 ? cfg.markov_rank > 0 : cfg.confidence_with_markov == 1;
    const int re = conf_with_markov_ ? rank_ : 0;
    conf_ = std::make_unique<ConfidenceHead>(*store_, H_, re);
    std::vector<float> w(static_cast<size_t>(H_) + re);
    weight_row_to_f32(store_->matrix("confidence_head.proj.weight", 1, int64_t{H_} + re), 0, w.data());
    conf_w_ = weights_.upload(w.data(), w.size());
    conf_b_ = store_->vector_f32("confidence_head.proj.bias", 1)[0];
  }
  info_.kind = (markov_ || conf_) ? "dspark" : "dflash-deepspec";
  info_.block_size = bs_;
  info_.max_draft_tokens = bs_;
  info_.target_layer_ids = cfg.target_layer_ids;
  info_.mask_token_id = cfg.mask_token_id;
  info_.markov_head = markov_ ? MarkovHead::type_name(markov_->type()) : "";
  info_.confidence_head = conf_ != nullptr;
  info_.on_device = true;
}

CudaDeepSpecDrafter::~CudaDeepSpecDrafter() {
  if (stream_ && stream_->s) cudaStreamSynchronize(stream_->s);
  drop_graphs();
  if (staged_) cudaEventDestroy(staged_);
  for (cudaEvent_t e : tev_)
    if (e) cudaEventDestroy(e);
  if (!times_by_items_.empty()) {
    std::fprintf(stderr, "DSINFER_CUDA_DRAFTER_TIMES (us per propose pass; commit: the commit call before it, host | GPU; gap: GPU idle from the commit's end to the pass's start):\n");
    for (const auto& [b, t] : times_by_items_) {
      const double f = 1.0 / static_cast<double>(t.n), fc = t.commits ? 1.0 / static_cast<double>(t.commits) : 0.0;
      std::fprintf(stderr, "  items <= %4d: %7lld passes (%lld after a commit)  commit host %6.1f gpu %6.1f  gap %6.1f  propose prep %6.1f launch %6.1f wait %7.1f gpu %7.1f\n",
                   b, static_cast<long long>(t.n), static_cast<long long>(t.commits), t.commit_host_us * fc,
                   t.commit_gpu_us * fc, t.gap_us * fc, t.prep_us * f, t.launch_us * f, t.wait_us * f, t.gpu_us * f);
    }
  }
  if (!prof_.empty()) {
    std::fprintf(stderr, "DSINFER_CUDA_DRAFTER_PROFILE (wall ms per pass, by batch size rounded up to a power of two; (grew): passes that grew a workspace):\n");
    for (const auto& [k, v] : prof_)
      std::fprintf(stderr, "  %-15s items <= %4d: %7lld passes, %8.3f ms each\n", k.first.c_str(), k.second,
                   static_cast<long long>(v.second), v.first / static_cast<double>(v.second));
  }
}

const bf16* CudaDeepSpecDrafter::upload_matrix(const WeightView& w) {
  if (w.dtype != DType::BF16) throw Error("CUDA drafter upload: expected a BF16 matrix after conversion");
  return weights_.upload(static_cast<const bf16*>(w.data), static_cast<size_t>(w.rows * w.cols));
}

const bf16* CudaDeepSpecDrafter::shared_or_own(const std::string& name, const WeightView* t, const bf16* td) {
  const WeightInfo raw = store_->require(name, {DType::BF16, DType::F32, DType::F16}, {V_, H_});
  if (t && t->data && td && raw.dtype == DType::BF16 && t->dtype == DType::BF16 && t->rows == V_ && t->cols == H_ &&
      std::memcmp(t->data, raw.data, raw.nbytes) == 0) {
    info_.shared_with_target.push_back(name);
    return td;
  }
  return upload_matrix(store_->matrix(name, V_, H_));
}

CudaDraftSeq& CudaDeepSpecDrafter::as_seq(DraftSequence& s) {
  auto* c = dynamic_cast<CudaDraftSeq*>(&s);
  if (!c) throw Error("dflash drafter (CUDA): sequence state was not created by this drafter's start()");
  return *c;
}

void CudaDeepSpecDrafter::ensure_capacity(CudaDraftSeq& s, int rows_needed) const {
  if (rows_needed <= s.cap) return;
  const int new_cap = std::max({rows_needed, 2 * s.cap, 64});
  void* nb = nullptr;
  DSINFER_CUDA_CHECK(cudaMallocAsync(&nb, seq_bytes(new_cap), stream_->s));
  const int used = s.length - s.store_first;
  if (s.buf && used > 0)
    DSINFER_CUDA_CHECK(cudaMemcpy2DAsync(nb, static_cast<size_t>(new_cap) * D_ * sizeof(bf16), s.buf,
                                         static_cast<size_t>(s.cap) * D_ * sizeof(bf16),
                                         static_cast<size_t>(used) * D_ * sizeof(bf16), static_cast<size_t>(L_) * 2 * NKV_,
                                         cudaMemcpyDeviceToDevice, stream_->s));
  if (s.buf) DSINFER_CUDA_CHECK(cudaFreeAsync(s.buf, stream_->s));
  s.buf = static_cast<bf16*>(nb);
  s.cap = new_cap;
}

void CudaDeepSpecDrafter::apply_window(CudaDraftSeq& s) const {
  const int w = s.window_override > 0 ? s.window_override : window_;
  s.visible_begin = w > 0 ? std::max(s.store_first, s.length - w) : s.store_first;
  if (window_ <= 0) return;
  const int keep_rows = std::max(window_, s.window_override);
  const int keep_from = std::max(s.store_first, s.length - keep_rows);
  const int drop = keep_from - s.store_first;
  if (drop < std::max(keep_rows, 32)) return;
  // drop >= keep: source rows [drop, drop + keep) and destination [0, keep) never overlap.
  const int keep = s.length - keep_from;
  if (keep > 0)
    DSINFER_CUDA_CHECK(cudaMemcpy2DAsync(s.buf, static_cast<size_t>(s.cap) * D_ * sizeof(bf16),
                                         s.buf + static_cast<size_t>(drop) * D_, static_cast<size_t>(s.cap) * D_ * sizeof(bf16),
                                         static_cast<size_t>(keep) * D_ * sizeof(bf16), static_cast<size_t>(L_) * 2 * NKV_,
                                         cudaMemcpyDeviceToDevice, stream_->s));
  s.store_first = keep_from;
}

void CudaDeepSpecDrafter::set_window(DraftSequence& seq, int window) const {
  if (window < 0) throw Error("drafter window: must be >= 0, got " + std::to_string(window));
  std::lock_guard<std::mutex> lock(mu_);
  CudaDraftSeq& s = as_seq(seq);
  s.window_override = window;
  apply_window(s);
}

void CudaDeepSpecDrafter::reserve(DraftSequence& seq, int positions) const {
  if (positions <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  CudaDraftSeq& s = as_seq(seq);
  const int keep = window_ > 0 ? std::max(window_, s.window_override) : 0;
  const int rows = keep > 0 ? std::min(positions, 2 * keep + 32) : positions;
  ensure_capacity(s, s.length - s.store_first + rows + bs_);
}

void CudaDeepSpecDrafter::commit_context_batch(const std::vector<ContextBatchItem>& items) const {
  check_batch_items(items, device_features_);
  int64_t C = 0;
  // The rows come either all from the host or all from one device pool's feature rows.
  const BlockKVCache* pool_base = nullptr;
  bool host_rows = false;
  for (const ContextBatchItem& it : items) {
    if (it.count < 0) throw Error("dflash commit_context: negative position count " + std::to_string(it.count));
    if (it.count > 0 && !it.hidden && !it.feature_cache)
      throw Error("dflash commit_context: target hidden states are required (got none)");
    if (it.count > 0 && it.feature_cache) {
      if (pool_base && pool_base != it.feature_cache)
        throw Error("dflash commit_context: items name feature rows of two different KV caches");
      pool_base = it.feature_cache;
    } else if (it.count > 0) {
      host_rows = true;
    }
    as_seq(*it.seq);
    C += it.count;
  }
  if (C == 0) return;
  if (pool_base && host_rows)
    throw Error("dflash commit_context: one batch mixes host rows and KV-cache feature rows");
  const cuda::CudaPagedKVCache* pool = nullptr;
  if (pool_base) {
    pool = dynamic_cast<const cuda::CudaPagedKVCache*>(pool_base);
    if (!pool || !pool->feature_plane() || pool->feature_floats() != int64_t{m_} * H_)
      throw Error("dflash commit_context: the KV cache named for feature rows is not a CUDA paged pool with " +
                  std::to_string(int64_t{m_} * H_) + "-float feature rows");
  }
  check(C < (1 << 28), "dflash commit_context: too many positions in one call");
  std::lock_guard<std::mutex> lock(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t growths0 = g_growths.load();
  cudaStream_t st = stream_->s;
  const int64_t H = H_, F = int64_t{m_} * H, NK = int64_t{NKV_} * D_, W = int64_t{L_} * 2 * NK;
  // From a device pool the commit runs as a graph over the row count padded to a bucket
  // (up to kMaxGraphRows: a prompt's whole commit runs once, eagerly).
  const bool graph = use_commit_graphs_ && pool && !profile_ && C <= kMaxCommitGraphRows;
  const int64_t Cr = C;
  if (graph) C = graph_rows_bucket(static_cast<int>(C));
  const int n = static_cast<int>(C);
  wait_staging();
  if (times_) DSINFER_CUDA_CHECK(cudaEventRecord(tev_[0], st));
  float* fh = pool ? nullptr : feat_h_.need(C * F);
  int32_t* mh = cmeta_h_.need(4 * C);  // pos | cap | store row | feature row in the pool
  unsigned long long* bh = cbases_h_.need(C);
  for (int64_t r = Cr; r < C; ++r) {  // padding rows: position 0, no buffer, the pool's row 0
    mh[r] = mh[C + r] = mh[2 * C + r] = mh[3 * C + r] = 0;
    bh[r] = 0;
  }
  {
    int64_t r = 0;
    for (const ContextBatchItem& it : items) {
      if (it.count == 0) continue;
      CudaDraftSeq& s = as_seq(*it.seq);
      ensure_capacity(s, s.length - s.store_first + it.count + bs_);
      if (!pool) std::memcpy(fh + r * F, it.hidden, static_cast<size_t>(it.count) * F * sizeof(float));
      for (int i = 0; i < it.count; ++i) {
        mh[r + i] = s.length + i;
        mh[C + r + i] = s.cap;
        mh[2 * C + r + i] = s.length - s.store_first + i;
        bh[r + i] = reinterpret_cast<unsigned long long>(s.buf);
        if (pool) {
          const int p = it.feature_first + i, pbs = pool->block_size();
          const int32_t b = it.feature_blocks[p / pbs];
          if (b < 0 || b >= pool->num_blocks())
            throw Error("dflash commit_context: feature block id " + std::to_string(b) + " outside the pool");
          mh[3 * C + r + i] = b * pbs + p % pbs;
        }
      }
      r += it.count;
    }
  }
  int32_t* meta = cmeta_.need(4 * C);
  unsigned long long* bases = cbases_.need(C);
  float* feat = pool ? nullptr : feat_.need(C * F);
  bf16* fb = feat_bf_.need(C * F);
  float* ctx = ctx_.need(C * H);
  float* cs = cos_.need(C * (D_ / 2));
  float* sn = sin_.need(C * (D_ / 2));
  float* kv = kvrows_.need(C * W);
  bf16* hb = hb_.need(C * H);
  if (!pool) DSINFER_CUDA_CHECK(cudaMemcpyAsync(feat, fh, C * F * sizeof(float), cudaMemcpyHostToDevice, st));
  auto enqueue = [&] {
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(meta, mh, (pool ? 4 : 3) * C * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(bases, bh, C * sizeof(unsigned long long), cudaMemcpyHostToDevice, st));
    // Host rows are rounded here; the pool's rows were rounded the same way when stored.
    if (pool) gather_feature_rows(pool->feature_plane(), F, meta + 3 * C, n, fb, st);
    else f32_to_bf16_n(feat, C * F, fb, st);
    // ctx = fc(features); hidden_norm(ctx) is fused into the k|v GEMM of every layer at once.
    gemm_->run(GemmInput::bf16_rows(fb, F), fc_, H_, static_cast<int>(F), ctx, H, n, false, nullptr, st);
    rope_table(inv_freq_, D_ / 2, meta, n, attention_factor_, cs, sn, st);
    gemm_->run(GemmInput::rmsnorm_rows(ctx, H, hidden_norm_, eps_), kv_all_, static_cast<int>(W), H_, kv, W, n, false,
               hb, st);
    if (kv_bias_all_) add_bias_rows(kv, W, n, static_cast<int>(W), kv_bias_all_, st);
    draft_qkv_store(kv, W, n, L_, 2 * NK, 0, 0, NKV_, D_, L_, q_norm_all_, k_norm_all_, eps_, cs, sn,
                    DraftRowDst{bases, meta + C, meta + 2 * C}, nullptr, st);
  };
  if (graph) {
    // Every buffer is sized above, so a capture never grows one; a growth since the graphs
    // were made (here or in a propose pass) drops them all.
    if (g_growths.load() != graphs_growths_) {
      drop_graphs();
      graphs_growths_ = g_growths.load();
    }
    const std::pair<int, const void*> key{n, pool->feature_plane()};
    auto it = commit_graphs_.find(key);
    if (it == commit_graphs_.end() && commit_graph_seen_[key]++ >= 1)
      it = commit_graphs_.emplace(key, capture_graph(st, enqueue, "cudaGraphInstantiate (drafter commit)")).first;
    if (it != commit_graphs_.end()) DSINFER_CUDA_CHECK(cudaGraphLaunch(it->second, st));
    else enqueue();
  } else {
    enqueue();
  }
  // The staging is read by the uploads at the start of what was just enqueued.
  DSINFER_CUDA_CHECK(cudaEventRecord(staged_, st));
  staged_pending_ = true;
  for (const ContextBatchItem& it : items) {
    if (it.count == 0) continue;
    CudaDraftSeq& s = as_seq(*it.seq);
    s.length += it.count;
    apply_window(s);
  }
  if (times_) {
    DSINFER_CUDA_CHECK(cudaEventRecord(tev_[1], st));
    commit_timed_ = true;
    commit_host_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  if (commit_sync_ || profile_) DSINFER_CUDA_CHECK(cudaStreamSynchronize(st));
  record("commit", static_cast<int>(items.size()), t0, growths0);
}

std::vector<DraftProposal> CudaDeepSpecDrafter::propose_batch(const std::vector<DraftBatchItem>& all) const {
  check_batch_items(all);
  std::vector<DraftProposal> out(all.size());
  std::vector<DraftBatchItem> items;
  std::vector<size_t> where;
  std::vector<int> ns;
  for (size_t i = 0; i < all.size(); ++i) {
    const DraftBatchItem& it = all[i];
    if (it.max_tokens < 0) throw Error("dflash propose: max_tokens must be >= 0, got " + std::to_string(it.max_tokens));
    const int n = std::min(it.max_tokens, bs_);
    if (n == 0) continue;
    if (it.anchor < 0 || it.anchor >= V_)
      throw Error("dspark propose: anchor token " + std::to_string(it.anchor) + " outside the vocabulary [0, " +
                  std::to_string(V_) + ")");
    as_seq(*it.seq);
    items.push_back(it);
    where.push_back(i);
    ns.push_back(n);
  }
  const int R = static_cast<int>(items.size());
  if (R == 0) return out;
  std::lock_guard<std::mutex> lock(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t growths0 = g_growths.load();
  cudaStream_t st = stream_->s;
  const int64_t H = H_, I = I_, D = D_, NQ = int64_t{NH_} * D, NK = int64_t{NKV_} * D, NQKV = NQ + 2 * NK;
  const int T = R * bs_;
  const int max_n = *std::max_element(ns.begin(), ns.end());
  const int NL = max_n * R;  // LM-head rows, ordered (position k, item i): row k * R + i
  // int32 meta: tok | pos | cap_row | dst_row | item (T each) | cap | key_begin | n_keys |
  // anchor (R each) | lm rows (NL); u64: base per row (T) | base per item (R).
  const int64_t nm = 5 * int64_t{T} + 4 * int64_t{R} + NL;
  int32_t* mh = meta_h_.need(nm);
  unsigned long long* bh = bases_h_.need(T + R);
  int32_t *tok = mh, *pos = mh + T, *cap_row = mh + 2 * T, *dst_row = mh + 3 * T, *item = mh + 4 * T;
  int32_t *cap_it = mh + 5 * T, *kb = cap_it + R, *nk = kb + R, *anc = nk + R, *lr = anc + R;
  bool greedy = true;
  for (int i = 0; i < R; ++i) {
    CudaDraftSeq& s = as_seq(*items[i].seq);
    ensure_capacity(s, s.length - s.store_first + bs_);
    const int row0 = s.length - s.store_first, vis0 = s.visible_begin - s.store_first;
    for (int j = 0; j < bs_; ++j) {
      const int r = i * bs_ + j;
      tok[r] = j == 0 ? items[i].anchor : info_.mask_token_id;
      pos[r] = s.length + j;
      cap_row[r] = s.cap;
      dst_row[r] = row0 + j;
      item[r] = i;
      bh[r] = reinterpret_cast<unsigned long long>(s.buf);
    }
    cap_it[i] = s.cap;
    kb[i] = vis0;
    nk[i] = row0 + bs_ - vis0;  // visible context, then the whole block (non-causal)
    anc[i] = items[i].anchor;
    bh[T + i] = reinterpret_cast<unsigned long long>(s.buf);
    greedy = greedy && items[i].params->greedy();
  }
  for (int k = 0; k < max_n; ++k)
    for (int i = 0; i < R; ++i) lr[k * R + i] = i * bs_ + k;
  int32_t* meta = meta_.need(nm);
  unsigned long long* bases = bases_.need(T + R);
  const int32_t *d_tok = meta, *d_pos = meta + T, *d_item = meta + 4 * T, *d_cap_it = meta + 5 * T;
  const int32_t *d_kb = d_cap_it + R, *d_nk = d_kb + R, *d_anc = d_nk + R, *d_lr = d_anc + R;
  const DraftRowDst dst{bases, meta + 2 * T, meta + 3 * T};

  float* x = x_.need(int64_t{T} * H);
  float* cs = cos_.need(int64_t{T} * (D / 2));
  float* sn = sin_.need(int64_t{T} * (D / 2));
  float* qkv = qkv_.need(int64_t{T} * NQKV);
  float* q = q_.need(int64_t{T} * NQ);
  bf16* attb = attb_.need(int64_t{T} * NQ);
  bf16* act = act_.need(int64_t{T} * I);
  float* gu = gu_.need(int64_t{T} * 2 * I);
  bf16* hb = hb_.need(int64_t{std::max(T, NL)} * std::max<int64_t>(H, NQ));
  float* logits = logits_.need(int64_t{NL} * V_);
  // Greedy items take the device heads (vanilla Markov head or none); sampled items, and
  // every item of a gated/rnn head, the host heads. Which path an item takes depends on
  // that item alone, so its drafts never depend on the rest of the batch.
  const bool device_heads = !markov_ || vanilla_;
  unsigned long long* keys = keys_.need(NL);
  float* hdot = device_heads && conf_ ? hdot_.need(NL) : nullptr;
  float* z = device_heads && conf_ ? z_.need(NL) : nullptr;
  int32_t* ids = device_heads ? ids_.need(NL) : nullptr;
  bf16* e = device_heads && markov_ ? e_.need(int64_t{R} * rank_) : nullptr;
  int32_t* ih = device_heads ? ids_h_.need(NL) : nullptr;
  float* zh = device_heads && conf_ ? z_h_.need(NL) : nullptr;
  // The pass as one CUDA graph when only the device heads run (every buffer above is
  // sized now, so a capture never grows one).
  const bool graph = use_graphs_ && device_heads && greedy && !profile_;
  if (graph && g_growths.load() != graphs_growths_) {
    drop_graphs();
    graphs_growths_ = g_growths.load();
  }
  auto enqueue_front = [&] {
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(meta, mh, nm * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(bases, bh, (T + R) * sizeof(unsigned long long), cudaMemcpyHostToDevice, st));
    embed_rows(embed_, H, d_tok, T, x, st);
    rope_table(inv_freq_, D_ / 2, d_pos, T, attention_factor_, cs, sn, st);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    for (int l = 0; l < L_; ++l) {
      const DraftLayer& W = layers_[l];
      gemm_->run(GemmInput::rmsnorm_rows(x, H, W.in_norm, eps_), W.qkv, static_cast<int>(NQKV), H_, qkv, NQKV, T, false,
                 hb, st);
      if (W.qkv_bias) add_bias_rows(qkv, NQKV, T, static_cast<int>(NQKV), W.qkv_bias, st);
      draft_qkv_store(qkv, NQKV, T, 1, 0, l, NH_, NKV_, D_, L_, q_norm_all_, k_norm_all_, eps_, cs, sn, dst, q, st);
      draft_block_attention(q, T, d_item, bases + T, d_cap_it, d_kb, d_nk, l, L_, NH_, NKV_, D_, scale, attb, st);
      gemm_->run(GemmInput::bf16_rows(attb, NQ), W.o, H_, static_cast<int>(NQ), x, H, T, true, nullptr, st);
      if (W.o_bias) add_bias_rows(x, H, T, H_, W.o_bias, st);
      gemm_->run_silu(GemmInput::rmsnorm_rows(x, H, W.post_norm, eps_), W.gu, 2 * I_, H_, act, I, T, gu, hb, st);
      gemm_->run(GemmInput::bf16_rows(act, I), W.down, H_, I_, x, H, T, true, nullptr, st);
    }
    // Base logits of the drafted rows, the final norm fused into the LM head GEMM.
    if (device_heads) DSINFER_CUDA_CHECK(cudaMemsetAsync(keys, 0, NL * sizeof(unsigned long long), st));
    gemm_->run(GemmInput::rmsnorm_rows(x, H, final_norm_, eps_, d_lr), head_, V_, H_, logits, V_, NL, false, hb, st,
               device_heads && !markov_ ? keys : nullptr);
  };
  // The device heads: the Markov steps, ids and confidences back to pinned host memory.
  auto enqueue_heads = [&] {
    if (conf_) draft_conf_hdot(x, H, d_lr, NL, final_norm_, eps_, conf_w_, hdot, st);
    // Position k needs the argmax of k - 1 (its Markov bias and confidence condition on it):
    // positions run in order, each over all items, without leaving the device.
    for (int k = 0; k < max_n; ++k) {
      if (markov_ || conf_)
        draft_markov_step(k, R, d_anc, keys, ids, w1_, rank_, e, hdot, conf_with_markov_ ? conf_w_ + H_ : nullptr,
                          conf_b_, z, st);
      if (markov_)
        gemm_->run(GemmInput::bf16_rows(e, rank_), w2_, V_, rank_, logits + int64_t{k} * R * V_, V_, R, true, nullptr, st,
                   keys + int64_t{k} * R);
    }
    draft_keys_to_ids(keys, NL, ids, st);
    DSINFER_CUDA_CHECK(cudaMemcpyAsync(ih, ids, NL * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    if (conf_) DSINFER_CUDA_CHECK(cudaMemcpyAsync(zh, z, NL * sizeof(float), cudaMemcpyDeviceToHost, st));
  };
  std::vector<DraftProposal> props(items.size());
  const auto t_prep = times_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (times_) DSINFER_CUDA_CHECK(cudaEventRecord(tev_[2], st));
  if (graph) {
    const std::pair<int, int> key{R, max_n};
    auto it = graphs_.find(key);
    if (it == graphs_.end() && graph_seen_[key]++ >= 1) {
      // Second sighting of this shape: capture it (the first ran eagerly and sized everything).
      const cudaGraphExec_t exec = capture_graph(
          st,
          [&] {
            enqueue_front();
            enqueue_heads();
          },
          "cudaGraphInstantiate (drafter propose)");
      it = graphs_.emplace(key, exec).first;
    }
    if (it != graphs_.end()) {
      DSINFER_CUDA_CHECK(cudaGraphLaunch(it->second, st));
    } else {
      enqueue_front();
      enqueue_heads();
    }
  } else {
    enqueue_front();
    if (!device_heads || !greedy) host_heads(items, ns, R, max_n, props);  // before the Markov GEMMs add into logits
    if (device_heads) enqueue_heads();
  }
  if (times_) {
    DSINFER_CUDA_CHECK(cudaEventRecord(tev_[3], st));
    const auto t_launch = std::chrono::steady_clock::now();
    DSINFER_CUDA_CHECK(cudaStreamSynchronize(st));
    auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
    int b = 1;
    while (b < R) b <<= 1;
    PassTimes& t = times_by_items_[b];
    ++t.n;
    t.prep_us += us(t0, t_prep);
    t.launch_us += us(t_prep, t_launch);
    t.wait_us += us(t_launch, std::chrono::steady_clock::now());
    float ms = 0;
    DSINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, tev_[2], tev_[3]));
    t.gpu_us += 1e3 * ms;
    if (commit_timed_) {
      ++t.commits;
      t.commit_host_us += commit_host_us_;
      DSINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, tev_[0], tev_[1]));
      t.commit_gpu_us += 1e3 * ms;
      DSINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, tev_[1], tev_[2]));
      t.gap_us += 1e3 * ms;
      commit_timed_ = false;
    }
  }
  if (device_heads) {
    DSINFER_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < R; ++i) {
      if (!items[i].params->greedy()) continue;
      DraftProposal& p = props[i];
      p = DraftProposal{};
      p.tokens.resize(ns[i]);
      if (conf_) {
        p.confidence.resize(ns[i]);
        p.confidence_logits.resize(ns[i]);
      }
      for (int k = 0; k < ns[i]; ++k) {
        p.tokens[k] = ih[k * R + i];
        if (conf_) {
          p.confidence_logits[k] = zh[k * R + i];
          p.confidence[k] = ConfidenceHead::sigmoid(zh[k * R + i]);
        }
      }
    }
  }
  for (size_t j = 0; j < props.size(); ++j) out[where[j]] = std::move(props[j]);
  record("propose", R, t0, growths0);
  return out;
}

void CudaDeepSpecDrafter::host_heads(const std::vector<DraftBatchItem>& items, const std::vector<int>& ns, int R,
                                     int max_n, std::vector<DraftProposal>& props) const {
  cudaStream_t st = stream_->s;
  const int64_t H = H_, T = int64_t{R} * bs_, NL = int64_t{max_n} * R;
  float* uh = logits_h_.need(NL * V_);
  float* xh = x_h_.need(T * H);
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(uh, logits_.p, NL * V_ * sizeof(float), cudaMemcpyDeviceToHost, st));
  DSINFER_CUDA_CHECK(cudaMemcpyAsync(xh, x_.p, T * H * sizeof(float), cudaMemcpyDeviceToHost, st));
  DSINFER_CUDA_CHECK(cudaStreamSynchronize(st));
  // h rows after the final norm, ordered as the logits (k * R + i).
  std::vector<float> hrows_all(static_cast<size_t>(NL * H));
  for (int k = 0; k < max_n; ++k)
    for (int i = 0; i < R; ++i)
      rmsnorm(xh + (int64_t{i} * bs_ + k) * H, H, 1, H, final_norm_host_.data(), eps_,
              hrows_all.data() + (int64_t{k} * R + i) * H, H);
  const int r_markov = markov_ ? markov_->rank() : 0;
  for (int i = 0; i < R; ++i) {
    DraftProposal& p = props[i];
    p.tokens.resize(ns[i]);
    if (!items[i].params->greedy()) p.q.resize(static_cast<size_t>(ns[i]) * V_);
    if (conf_) {
      p.confidence.resize(ns[i]);
      p.confidence_logits.resize(ns[i]);
    }
  }
  std::vector<std::vector<float>> states(R);
  if (markov_)
    for (auto& s : states) markov_->reset(s);
  std::vector<int32_t> prev(R), act_prev;
  for (int i = 0; i < R; ++i) prev[i] = items[i].anchor;
  std::vector<int> active;
  std::vector<std::vector<float>*> act_states;
  std::vector<float> hrows, bias, e, logits(V_), probs;
  for (int k = 0; k < max_n; ++k) {
    active.clear();
    act_states.clear();
    act_prev.clear();
    for (int i = 0; i < R; ++i)
      if (k < ns[i]) {
        active.push_back(i);
        act_states.push_back(&states[i]);
        act_prev.push_back(prev[i]);
      }
    const int m = static_cast<int>(active.size());
    if (markov_) {
      hrows.resize(static_cast<size_t>(m) * H);
      for (int a = 0; a < m; ++a)
        std::memcpy(hrows.data() + a * H, hrows_all.data() + (int64_t{k} * R + active[a]) * H, H * sizeof(float));
      bias.resize(static_cast<size_t>(m) * V_);
      e.resize(static_cast<size_t>(m) * r_markov);
      markov_->bias_rows(m, act_prev.data(), hrows.data(), act_states.data(), bias.data(), e.data());
    }
    for (int a = 0; a < m; ++a) {
      const int i = active[a];
      DraftProposal& p = props[i];
      const float* u = uh + (int64_t{k} * R + i) * V_;
      const float* h = hrows_all.data() + (int64_t{k} * R + i) * H;
      for (int j = 0; j < V_; ++j) logits[j] = markov_ ? u[j] + bias[static_cast<size_t>(a) * V_ + j] : u[j];
      if (conf_) {
        const float zk = conf_->logit(h, conf_->with_markov() ? e.data() + static_cast<size_t>(a) * r_markov : nullptr);
        p.confidence_logits[k] = zk;
        p.confidence[k] = ConfidenceHead::sigmoid(zk);
      }
      const int32_t xk = draw_draft_token(logits.data(), V_, *items[i].params, *items[i].rng, probs);
      p.tokens[k] = xk;
      if (!items[i].params->greedy()) std::copy(probs.begin(), probs.end(), p.q.begin() + static_cast<size_t>(k) * V_);
      prev[i] = xk;
    }
  }
}

}  // namespace
}  // namespace cuda

std::unique_ptr<Drafter> make_cuda_deepspec_drafter(const DraftConfig& cfg, const Model& target,
                                                    const DrafterOptions& opts) {
  if (!env_switch("DSINFER_CUDA_DRAFTER", true)) return nullptr;
  const auto* ct = dynamic_cast<const cuda::CudaTarget*>(&target);
  if (!ct) return nullptr;
  return std::make_unique<cuda::CudaDeepSpecDrafter>(cfg, target, *ct, opts);
}

}  // namespace dsinfer
