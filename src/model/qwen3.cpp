// dsinfer model floor: Qwen3 dense forward on the CPU (see qwen3.h for the data flow).
//
// Loading checks every tensor's dtype and shape against config.json before anything runs.
// The forward pass keeps its activations in a grow-only workspace owned by the model, so
// steady-state decoding allocates nothing; weights are used in place from the mmap.
// Batch invariance holds because every kernel used here computes a row (or a (query,
// head) pair) with an operation order that depends only on that row: the batch decides
// how many rows there are, never how one of them is computed.
// K/V go into the cache in its element type: copied (F32) or rounded by kv_round_bf16
// (BF16, the cache of bf16 matmul precision); attention reads whichever it holds.
#include "model/qwen3.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/silu_mul.h"
#include "model/kv_cache.h"
#include "model/paged_kv_cache.h"
#include "model/qwen3_layer.h"
#include "model/rope_params.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace dsinfer {

namespace {

class Qwen3Model final : public Model {
 public:
  Qwen3Model(const ModelConfig& cfg, const LoadOptions& opts);
  // One tensor-parallel rank (load_qwen3_rank): cfg_ is the rank's view of the config (its
  // head and feature counts), the projections are its slices, every layer's o and down
  // outputs go through rank.reduce.
  Qwen3Model(const ModelConfig& cfg, const LoadOptions& opts, const Qwen3RankOptions& rank);

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<KVCache> make_kv_cache(int max_slots, int max_tokens) const override {
    return std::make_unique<DenseKVCache>(cfg_.num_hidden_layers, cfg_.num_key_value_heads, cfg_.head_dim, max_slots,
                                          max_tokens, kv_dtype());
  }
  // BF16 K/V exactly when the K and V projections run as Bf16Dot (their outputs already
  // come from BF16-rounded activations): half the cache, and vdpbf16ps attention scores.
  DType kv_dtype() const override {
    const bool bf16 = matmul_precision() == MatmulPrecision::Bf16Dot && !layers_.empty() &&
                      layers_[0].k.dtype == DType::BF16 && layers_[0].v.dtype == DType::BF16;
    return bf16 ? DType::BF16 : DType::F32;
  }
  void forward(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out) override;
  void embed(const int32_t* ids, int n, float* out) const override;
  void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const override;
  const WeightView* host_embedding() const override { return &embed_; }
  const WeightView* host_lm_head() const override { return &head_; }
  uint64_t decode_weight_bytes() const override { return decode_bytes_; }

 private:
  ModelConfig cfg_;
  std::unique_ptr<WeightStore> store_;
  std::vector<Qwen3LayerWeights> layers_;
  Qwen3LayerDims dims_;
  WeightView embed_{}, head_{};
  std::vector<float> final_norm_;
  RopeParams rope_;
  uint64_t decode_bytes_ = 0;

  // Workspace (grow-only). x: residual stream; h: normed input of a sub-block; q/k/v:
  // projections; att: attention output; g/u: MLP gate/up; t: sub-block output before the add.
  std::vector<float> x_, h_, q_, k_, v_, att_, g_, u_, t_, cos_, sin_, rows_;
  std::vector<int32_t> pos_;
  std::vector<AttentionBlock> blocks_;

  // Tensor-parallel rank: the sum over the group after o and down.
  RankReduce reduce_;

  void load_common(const LoadOptions& opts, MappedFile::Placement placement);
  void finish_load();
};

void Qwen3Model::load_common(const LoadOptions& opts, MappedFile::Placement placement) {
  const ModelConfig& cfg = cfg_;
  const std::string cfile = cfg.model_dir + "/config.json";
  if (cfg.hidden_act != "silu")
    throw Error(cfile + ": field 'hidden_act': '" + cfg.hidden_act + "' is not supported by Qwen3 (expected silu)");
  if (cfg.use_sliding_window)
    throw Error(cfile + ": field 'use_sliding_window': sliding-window attention is not supported for Qwen3");
  rope_ = compute_rope_params(cfg.rope, cfg.head_dim, cfg.max_position_embeddings);
  store_ = std::make_unique<WeightStore>(cfg.model_dir, opts.weight_dtype, placement);
  dims_ = qwen3_layer_dims(cfg);
  embed_ = store_->matrix("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size);
}

Qwen3Model::Qwen3Model(const ModelConfig& cfg, const LoadOptions& opts) : cfg_(cfg) {
  load_common(opts, MappedFile::Placement::Auto);
  layers_.resize(cfg.num_hidden_layers);
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    layers_[l] = load_qwen3_layer(*store_, "model.layers." + std::to_string(l) + ".", dims_, cfg.attention_bias);
  finish_load();
}

Qwen3Model::Qwen3Model(const ModelConfig& full, const LoadOptions& opts, const Qwen3RankOptions& rank)
    : cfg_(rank_config(full, rank.plan.at(rank.rank))), reduce_(rank.reduce) {
  const TensorParallelPlan& plan = rank.plan;
  if (!reduce_) throw Error("tensor-parallel rank " + std::to_string(rank.rank) + ": no all-reduce given");
  // Mapped, not copied: the replicated tensors are read from the checkpoint's pages, the
  // split ones through ShardReader, so the rank reads its share and the replicated part.
  load_common(opts, MappedFile::Placement::Mmap);
  ShardReader reader(full.model_dir);
  layers_.resize(full.num_hidden_layers);
  for (int l = 0; l < full.num_hidden_layers; ++l)
    layers_[l] = load_qwen3_layer_share(*store_, reader, full, plan, rank.rank, l);
  finish_load();
}

void Qwen3Model::finish_load() {
  const ModelConfig& cfg = cfg_;
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, D = cfg.head_dim;
  uint64_t bytes = 0;
  auto mbytes = [](const WeightView& w) { return static_cast<uint64_t>(w.rows * w.cols) * dtype_size(w.dtype); };
  for (const Qwen3LayerWeights& L : layers_) {
    for (const WeightView* w : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) bytes += mbytes(*w);
    bytes += static_cast<uint64_t>(2 * D + 2 * H) * 4;
  }
  final_norm_ = store_->vector_f32("model.norm.weight", H);
  if (cfg.tie_word_embeddings) {
    // transformers ties lm_head to embed_tokens and ignores a stored lm_head.weight.
    head_ = embed_;
  } else if (store_->has("lm_head.weight")) {
    head_ = store_->matrix("lm_head.weight", V, H);
  } else {
    throw Error(cfg.model_dir + ": tensor 'lm_head.weight' not found and config.json field 'tie_word_embeddings' is false");
  }
  bytes += mbytes(head_) + static_cast<uint64_t>(H) * (4 + dtype_size(embed_.dtype));  // + final norm + one embedding row
  decode_bytes_ = bytes;
}

void Qwen3Model::embed(const int32_t* ids, int n, float* out) const {
  for (int i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= cfg_.vocab_size)
      throw Error("embed: token id " + std::to_string(ids[i]) + " outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
    weight_row_to_f32(embed_, ids[i], out + static_cast<int64_t>(i) * cfg_.hidden_size);
  }
}

void Qwen3Model::lm_head(const float* hidden, int n, float* logits, bool apply_norm) const {
  if (n <= 0) return;
  const int64_t H = cfg_.hidden_size;
  if (!apply_norm) {
    matmul(hidden, n, head_, logits);
    return;
  }
  // const method: its own buffer (drafter use, not the target's hot decode path).
  std::vector<float> normed(static_cast<size_t>(n) * H);
  rmsnorm(hidden, H, n, H, final_norm_.data(), static_cast<float>(cfg_.rms_norm_eps), normed.data(), H);
  matmul(normed.data(), n, head_, logits);
}

void Qwen3Model::forward(KVCache& kv_base, const ForwardBatch& batch, ForwardOutput& out) {
  // Two storages: the dense per-slot cache (generate, tools) and the paged one (the
  // batched engine); they differ only in where position p of a slot lives.
  auto* dense = dynamic_cast<DenseKVCache*>(&kv_base);
  auto* paged = dense ? nullptr : dynamic_cast<PagedKVCache*>(&kv_base);
  if (!dense && !paged) throw Error("forward: KV cache is neither a DenseKVCache nor a PagedKVCache");
  KVCache* kv = &kv_base;
  const int L = cfg_.num_hidden_layers;
  if (dense ? (dense->n_layers() != L || dense->n_kv_heads() != cfg_.num_key_value_heads || dense->head_dim() != cfg_.head_dim)
            : (paged->n_layers() != L || paged->n_kv_heads() != cfg_.num_key_value_heads || paged->head_dim() != cfg_.head_dim))
    throw Error("forward: KV cache geometry does not match the model");
  auto capacity = [&](int slot) { return dense ? dense->max_tokens() : paged->capacity(slot); };
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, V = cfg_.vocab_size, D = cfg_.head_dim;
  const int NH = cfg_.num_attention_heads, NKVH = cfg_.num_key_value_heads;
  const int64_t NQ = NH * D, NKV = NKVH * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);

  // ---- validate everything before the cache is touched --------------------------------
  const ForwardBatchSize bs = check_forward_batch(batch, *kv, V, L, capacity);
  const int64_t T = bs.rows, n_logits = bs.logit_rows;
  const int64_t n_cap = static_cast<int64_t>(batch.capture_layers.size());

  out.vocab_size = static_cast<int>(V);
  out.hidden_size = static_cast<int>(H);
  out.logits.resize(static_cast<size_t>(n_logits * V));
  out.captured.resize(static_cast<size_t>(T * n_cap * H));
  if (T == 0) return;

  // ---- embeddings, positions, RoPE tables --------------------------------------------------
  float* x = grow(x_, T * H);
  if (pos_.size() < static_cast<size_t>(T)) pos_.resize(T);
  int32_t* pos = pos_.data();
  {
    int64_t r = 0;
    for (const ForwardEntry& en : batch.entries) {
      const int start = kv->length(en.slot);
      for (size_t i = 0; i < en.tokens.size(); ++i, ++r) {
        pos[r] = start + static_cast<int32_t>(i);
        weight_row_to_f32(embed_, en.tokens[i], x + r * H);
      }
    }
  }
  const int half = static_cast<int>(D / 2);
  float* cos_t = grow(cos_, T * half);
  float* sin_t = grow(sin_, T * half);
  rope_tables(rope_.inv_freq.data(), half, pos, T, rope_.attention_factor, cos_t, sin_t);

  auto capture = [&](int layer_id) {
    for (int64_t c = 0; c < n_cap; ++c) {
      if (batch.capture_layers[c] != layer_id) continue;
      for (int64_t r = 0; r < T; ++r)
        std::memcpy(out.captured.data() + (r * n_cap + c) * H, x + r * H, H * sizeof(float));
    }
  };
  capture(-1);

  float* h = grow(h_, T * H);
  float* q = grow(q_, T * NQ);
  float* k = grow(k_, T * NKV);
  float* v = grow(v_, T * NKV);
  float* att = grow(att_, T * NQ);
  float* g = grow(g_, T * I);
  float* u = grow(u_, T * I);
  float* t = grow(t_, T * H);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t hs = dense ? dense->head_stride() : paged->head_stride();
  const int P = paged ? paged->block_size() : 0;
  const bool kv_bf16 = (dense ? dense->dtype() : paged->dtype()) == DType::BF16;

  for (int l = 0; l < L; ++l) {
    const Qwen3LayerWeights& W = layers_[l];
    qwen3_attention_inputs(W, dims_, x, T, cos_t, sin_t, h, q, k, v);
    blocks_.clear();
    int64_t r0 = 0;
    for (const ForwardEntry& en : batch.entries) {
      const int n = static_cast<int>(en.tokens.size());
      if (n == 0) continue;
      const int start = kv->length(en.slot);
      AttentionBlock b;
      // Row i of this entry, KV head gq -> element offset `at` of the cache (F32 or BF16).
      auto store = [&](auto* kc, auto* vc, int i, int gq, int64_t at) {
        const float* ks = k + (r0 + i) * NKV + gq * D;
        const float* vs = v + (r0 + i) * NKV + gq * D;
        if constexpr (sizeof(*kc) == sizeof(float)) {
          std::memcpy(kc + at, ks, D * sizeof(float));
          std::memcpy(vc + at, vs, D * sizeof(float));
        } else {
          kv_round_bf16(ks, D, kc + at);
          kv_round_bf16(vs, D, vc + at);
        }
      };
      if (dense) {
        auto fill = [&](auto* kc, auto* vc) {
          for (int i = 0; i < n; ++i)
            for (int gq = 0; gq < NKVH; ++gq) store(kc, vc, i, gq, gq * hs + (start + i) * D);
        };
        if (kv_bf16) {
          fill(dense->k_bf16(l, en.slot), dense->v_bf16(l, en.slot));
          b.k_bf16 = dense->k_bf16(l, en.slot);
          b.v_bf16 = dense->v_bf16(l, en.slot);
        } else {
          fill(dense->k(l, en.slot), dense->v(l, en.slot));
          b.k = dense->k(l, en.slot);
          b.v = dense->v(l, en.slot);
        }
      } else {
        // Position p in block ids[p / P] at offset p % P (bind() checked the ids).
        const int32_t* ids = paged->blocks(en.slot).data();
        const int64_t bs = paged->block_stride();
        auto fill = [&](auto* kl, auto* vl) {
          for (int i = 0; i < n; ++i) {
            const int p = start + i;
            const int64_t at = ids[p / P] * bs + static_cast<int64_t>(p % P) * D;
            for (int gq = 0; gq < NKVH; ++gq) store(kl, vl, i, gq, at + gq * hs);
          }
        };
        if (kv_bf16) {
          fill(paged->k_bf16(l), paged->v_bf16(l));
          b.k_bf16 = paged->k_bf16(l);
          b.v_bf16 = paged->v_bf16(l);
        } else {
          fill(paged->k(l), paged->v(l));
          b.k = paged->k(l);
          b.v = paged->v(l);
        }
        b.block_ids = ids;
        b.block_stride = bs;
        b.page_size = P;
      }
      b.q = q + r0 * NQ;
      b.q_stride = NQ;
      b.n_q = n;
      b.start_pos = start;
      b.kv_head_stride = hs;
      b.out = att + r0 * NQ;
      b.out_stride = NQ;
      blocks_.push_back(b);
      r0 += n;
    }
    attention_causal(blocks_.data(), static_cast<int>(blocks_.size()), NH, NKVH, static_cast<int>(D), scale);
    qwen3_attention_out_mlp(W, dims_, att, T, x, h, g, u, t, reduce_ ? &reduce_ : nullptr);
    capture(l);
  }

  // ---- commit lengths, then final norm + LM head over the requested rows only -------------
  {
    int64_t r0 = 0, lr = 0;
    float* rows = grow(rows_, std::max<int64_t>(n_logits, 1) * H);
    for (const ForwardEntry& en : batch.entries) {
      for (int r : en.logit_rows) std::memcpy(rows + (lr++) * H, x + (r0 + r) * H, H * sizeof(float));
      r0 += static_cast<int64_t>(en.tokens.size());
    }
    for (const ForwardEntry& en : batch.entries) {
      const int len = kv->length(en.slot) + static_cast<int>(en.tokens.size());
      if (dense) dense->set_length(en.slot, len);
      else paged->set_length(en.slot, len);
    }
    if (n_logits > 0) {
      rmsnorm(rows, H, n_logits, H, final_norm_.data(), eps, rows, H);
      matmul(rows, n_logits, head_, out.logits.data());
    }
  }
}

}  // namespace

std::unique_ptr<Model> load_qwen3(const ModelConfig& cfg, const LoadOptions& opts) {
  return std::make_unique<Qwen3Model>(cfg, opts);
}

std::unique_ptr<Model> load_qwen3_rank(const ModelConfig& cfg, const LoadOptions& opts, const Qwen3RankOptions& rank) {
  return std::make_unique<Qwen3Model>(cfg, opts, rank);
}

}  // namespace dsinfer
