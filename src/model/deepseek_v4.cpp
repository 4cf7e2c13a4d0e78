// dsinfer model floor: DeepSeek-V4 forward on the CPU (see deepseek_v4.h for the data flow).
//
// Loading parses the V4 config, maps the safetensors (either naming scheme), checks every
// tensor against the config and prints a memory plan (weights, state per token, how many
// tokens fit); a model whose weights cannot fit in this machine's memory is refused with a
// one-line Error instead of being paged to death. Everything in forward() is validated
// before the state is touched, as in Qwen3.
#include "model/deepseek_v4.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "kernels/cpu/rmsnorm.h"
#include "model/deepseek_v4_attention.h"
#include "model/deepseek_v4_mhc.h"
#include "model/deepseek_v4_moe.h"
#include "model/deepseek_v4_state.h"
#include "model/deepseek_v4_weights.h"
#include "model/rope_params.h"
#include "model/slot_state_paged_cache.h"

namespace dsinfer {

namespace {

uint64_t meminfo_kib(const char* key) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream is(line.substr(std::strlen(key)));
      uint64_t v = 0;
      is >> v;
      return v;
    }
  return 0;
}

std::string gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(b) / (1ull << 30));
  return buf;
}

class DeepseekV4Model final : public Model, public DeepseekV4Info {
 public:
  DeepseekV4Model(const ModelConfig& cfg, const LoadOptions& opts, const V4ExpertRankOptions* rank = nullptr);

  const ModelConfig& config() const override { return gcfg_; }
  // The state grows on demand, so capacity costs nothing up front; but a capacity that
  // could never be filled is refused here rather than failing mid-decode.
  std::unique_ptr<KVCache> make_kv_cache(int max_slots, int max_tokens) const override {
    const uint64_t avail = meminfo_kib("MemAvailable:") * 1024ull;
    const long double need = (static_cast<long double>(V4State::bytes_per_token(cfg_)) * max_tokens +
                              static_cast<long double>(V4State::bytes_bounded(cfg_))) * max_slots;
    if (avail > 0 && need > static_cast<long double>(avail))
      throw Error("DeepSeek-V4 state: " + std::to_string(max_slots) + " slots x " + std::to_string(max_tokens) +
                  " tokens need " + gib(static_cast<uint64_t>(need)) + " but only " + gib(avail) +
                  " of memory is available; lower the context length or the number of sequences");
    return std::make_unique<V4State>(cfg_, max_slots, max_tokens);
  }
  // The batched engine's storage: this model's V4State behind the paged interface
  // (slot_state_paged_cache.h); the blocks account for the state's memory at its per-token
  // rate, with no prefix sharing.
  std::unique_ptr<BlockKVCache> make_paged_kv_cache(int block_size, int64_t num_blocks, int max_slots, int max_tokens,
                                                    int feature_floats) const override {
    (void)feature_floats;  // the engine keeps the drafter's rows in its host store
    return std::make_unique<SlotStatePagedCache>(make_kv_cache(max_slots, max_tokens), block_size, num_blocks);
  }
  PagedStateShape paged_state_shape() const override {
    return {std::max<uint64_t>(V4State::bytes_per_token(cfg_), 1), V4State::bytes_bounded(cfg_), false};
  }
  void forward(KVCache& kv, const ForwardBatch& batch, ForwardOutput& out) override;
  void embed(const int32_t* ids, int n, float* out) const override;
  void lm_head(const float* hidden, int n, float* logits, bool apply_norm) const override;
  uint64_t decode_weight_bytes() const override { return decode_bytes_; }

  const DeepseekV4Config& v4() const override { return cfg_; }
  const V4TensorIndex& index() const override { return *index_; }
  uint64_t weight_bytes() const override { return w_.matrix_bytes; }

 private:
  ModelConfig gcfg_;
  DeepseekV4Config cfg_;
  std::unique_ptr<V4TensorIndex> index_;
  std::deque<std::vector<uint8_t>> owned_;
  V4Weights w_;
  // Expert parallelism (load_deepseek_v4_rank): this rank's experts and the group's sum.
  V4MoeShare share_;
  RankReduce share_reduce_;
  V4RopeTables rope_;
  uint64_t decode_bytes_ = 0;
  std::vector<float> scratch_;
};

DeepseekV4Model::DeepseekV4Model(const ModelConfig& g, const LoadOptions& opts, const V4ExpertRankOptions* rank)
    : gcfg_(g) {
  if (opts.weight_dtype != "auto")
    throw Error("weight dtype option '" + opts.weight_dtype + "': DeepSeek-V4 models use their weights as stored (only 'auto')");
  cfg_ = parse_deepseek_v4_config(g);
  if (rank) {
    if (!rank->reduce) throw Error("expert-parallel rank: no all-reduce given");
    if (rank->expert_begin < 0 || rank->expert_end > cfg_.experts || rank->expert_begin >= rank->expert_end)
      throw Error("expert-parallel rank: experts [" + std::to_string(rank->expert_begin) + ", " +
                  std::to_string(rank->expert_end) + ") outside the model's " + std::to_string(cfg_.experts));
    share_reduce_ = rank->reduce;
    share_.expert_begin = rank->expert_begin;
    share_.expert_end = rank->expert_end;
    share_.reduce = &share_reduce_;
  }
  const int r = cfg_.rope_dim;
  rope_.main_inv = compute_rope_params(cfg_.rope_main, r, cfg_.max_pos).inv_freq;
  rope_.compress_inv = compute_rope_params(cfg_.rope_compress, r, cfg_.max_pos).inv_freq;
  index_ = std::make_unique<V4TensorIndex>(g.model_dir, rank ? MappedFile::Placement::Mmap : MappedFile::Placement::Auto);
  w_ = load_deepseek_v4_weights(*index_, cfg_, owned_);

  decode_bytes_ = v4_decode_weight_bytes(w_, cfg_);

  // Memory plan: refuse when the weights alone exceed physical memory.
  const uint64_t total = meminfo_kib("MemTotal:") * 1024ull, avail = meminfo_kib("MemAvailable:") * 1024ull;
  const uint64_t per_tok = V4State::bytes_per_token(cfg_), bounded = V4State::bytes_bounded(cfg_);
  const int n_csa = cfg_.count(V4Attn::CSA), n_hca = cfg_.count(V4Attn::HCA);
  std::fprintf(stderr,
               "deepseek_v4: %d layers (%d sliding, %d CSA, %d HCA); weights %s (routed experts %s), %s read per "
               "decode step; state %llu bytes/token of context + at most %s per sequence (window and raw rows); "
               "memory %s total, %s available",
               cfg_.layers, cfg_.layers - n_csa - n_hca, n_csa, n_hca, gib(w_.matrix_bytes).c_str(),
               gib(w_.expert_bytes).c_str(), gib(decode_bytes_).c_str(), static_cast<unsigned long long>(per_tok),
               gib(bounded).c_str(), gib(total).c_str(), gib(avail).c_str());
  if (total > 0 && avail > w_.matrix_bytes)
    std::fprintf(stderr, "; one sequence of about %llu tokens fits after the weights\n",
                 static_cast<unsigned long long>(avail - w_.matrix_bytes > bounded
                                                     ? (avail - w_.matrix_bytes - bounded) / std::max<uint64_t>(per_tok, 1)
                                                     : 0));
  else
    std::fprintf(stderr, "\n");
  if (total > 0 && w_.matrix_bytes > total)
    throw Error(g.model_dir + ": DeepSeek-V4 weights need " + gib(w_.matrix_bytes) + " but this machine has " + gib(total) +
                " of memory; refusing to load (use a machine with more memory or a smaller checkpoint)");
}

void DeepseekV4Model::embed(const int32_t* ids, int n, float* out) const {
  for (int i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= cfg_.vocab)
      throw Error("embed: token id " + std::to_string(ids[i]) + " outside the vocabulary [0, " + std::to_string(cfg_.vocab) + ")");
    weight_row_to_f32(w_.embed, ids[i], out + static_cast<int64_t>(i) * cfg_.hidden);
  }
}

void DeepseekV4Model::lm_head(const float* hidden, int n, float* logits, bool apply_norm) const {
  if (n <= 0) return;
  const int64_t D = cfg_.hidden;
  if (!apply_norm) {
    v4_matmul(hidden, n, w_.head, logits);
    return;
  }
  std::vector<float> normed(static_cast<size_t>(n) * D);
  rmsnorm(hidden, D, n, D, w_.final_norm.data(), static_cast<float>(cfg_.eps), normed.data(), D);
  v4_matmul(normed.data(), n, w_.head, logits);
}

void DeepseekV4Model::forward(KVCache& kv_base, const ForwardBatch& batch, ForwardOutput& out) {
  // The state: a V4State (make_kv_cache), or the engine's paged storage around one, whose
  // table lengths and capacities rule (make_paged_kv_cache).
  auto* paged = dynamic_cast<SlotStatePagedCache*>(&kv_base);
  auto* st = dynamic_cast<V4State*>(paged ? &paged->state() : &kv_base);
  if (!st || st->n_layers() != cfg_.layers)
    throw Error("forward: KV cache was not created by this model's make_kv_cache or make_paged_kv_cache");
  const int64_t D = cfg_.hidden, V = cfg_.vocab;
  const int nhc = cfg_.hc_mult;
  const ForwardBatchSize bs =
      paged ? paged->begin_forward(batch, V, cfg_.layers)
            : check_forward_batch(batch, *st, V, cfg_.layers, [&](int) { return int64_t(st->max_tokens()); });
  const int64_t T = bs.rows, n_logits = bs.logit_rows;
  const int64_t n_cap = static_cast<int64_t>(batch.capture_layers.size());
  out.vocab_size = static_cast<int>(V);
  out.hidden_size = static_cast<int>(D);
  out.logits.resize(static_cast<size_t>(n_logits * V));
  out.captured.assign(static_cast<size_t>(T * n_cap * D), 0.0f);
  if (T == 0) return;

  std::vector<V4Segment> segs;
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  {
    int64_t r = 0;
    for (const ForwardEntry& en : batch.entries) {
      if (en.tokens.empty()) continue;
      segs.push_back({en.slot, st->length(en.slot), static_cast<int>(en.tokens.size()), r});
      for (int32_t t : en.tokens) tokens[r++] = t;
    }
  }
  // Residual streams: n_hc copies of each embedding.
  std::vector<float> X(static_cast<size_t>(T * nhc * D)), u(static_cast<size_t>(T * D)), y(static_cast<size_t>(T * D));
  std::vector<float> post(static_cast<size_t>(T * nhc)), comb(static_cast<size_t>(T * nhc * nhc));
  for (int64_t r = 0; r < T; ++r) {
    weight_row_to_f32(w_.embed, tokens[r], u.data() + r * D);
    for (int j = 0; j < nhc; ++j) std::memcpy(X.data() + (r * nhc + j) * D, u.data() + r * D, sizeof(float) * D);
  }
  const V4HcParams hp{nhc, D, cfg_.hc_iters, static_cast<float>(cfg_.hc_eps), static_cast<float>(cfg_.eps)};
  const float eps = static_cast<float>(cfg_.eps);
  // A captured layer output (for the DSpark drafter) is the mean of the n_hc residual
  // streams after that layer (-1: after the embedding), summed in stream order.
  auto capture = [&](int layer_id) {
    for (int64_t c = 0; c < n_cap; ++c) {
      if (batch.capture_layers[c] != layer_id) continue;
      for (int64_t r = 0; r < T; ++r) {
        float* dst = out.captured.data() + (r * n_cap + c) * D;
        const float* x = X.data() + r * nhc * D;
        for (int64_t k = 0; k < D; ++k) {
          float acc = 0;
          for (int j = 0; j < nhc; ++j) acc += x[j * D + k];
          dst[k] = acc / static_cast<float>(nhc);
        }
      }
    }
  };
  capture(-1);
  for (int l = 0; l < cfg_.layers; ++l) {
    const V4LayerWeights& L = w_.layers[l];
    v4_hc_pre({&L.attn_hc_fn, L.attn_hc_base.data(), L.attn_hc_scale.data()}, hp, X.data(), T, post.data(), comb.data(),
              u.data(), scratch_);
    rmsnorm(u.data(), D, T, D, L.in_norm.data(), eps, u.data(), D);
    v4_attention(L, cfg_, rope_, l, *st, segs, u.data(), T, y.data());
    v4_hc_post(hp, post.data(), comb.data(), y.data(), T, X.data());
    v4_hc_pre({&L.ffn_hc_fn, L.ffn_hc_base.data(), L.ffn_hc_scale.data()}, hp, X.data(), T, post.data(), comb.data(),
              u.data(), scratch_);
    rmsnorm(u.data(), D, T, D, L.post_norm.data(), eps, u.data(), D);
    v4_moe(L, cfg_, u.data(), tokens.data(), T, y.data(), share_.reduce ? &share_ : nullptr);
    v4_hc_post(hp, post.data(), comb.data(), y.data(), T, X.data());
    capture(l);
  }
  for (const V4Segment& s : segs) {
    st->set_length(s.slot, s.start + s.n);
    if (paged) paged->set_length(s.slot, s.start + s.n);
  }
  if (n_logits == 0) return;
  std::vector<float> rows(static_cast<size_t>(n_logits * nhc * D)), hh(static_cast<size_t>(n_logits * D));
  {
    int64_t r0 = 0, lr = 0;
    for (const ForwardEntry& en : batch.entries) {
      for (int r : en.logit_rows)
        std::memcpy(rows.data() + (lr++) * nhc * D, X.data() + (r0 + r) * nhc * D, sizeof(float) * nhc * D);
      r0 += static_cast<int64_t>(en.tokens.size());
    }
  }
  v4_hc_head(w_.hc_head_fn, w_.hc_head_base.data(), w_.hc_head_scale.data(), hp, rows.data(), n_logits, hh.data(), scratch_);
  rmsnorm(hh.data(), D, n_logits, D, w_.final_norm.data(), eps, hh.data(), D);
  v4_matmul(hh.data(), n_logits, w_.head, out.logits.data());
}

}  // namespace

std::unique_ptr<Model> load_deepseek_v4(const ModelConfig& cfg, const LoadOptions& opts) {
  return std::make_unique<DeepseekV4Model>(cfg, opts);
}

std::unique_ptr<Model> load_deepseek_v4_rank(const ModelConfig& cfg, const LoadOptions& opts,
                                             const V4ExpertRankOptions& rank) {
  return std::make_unique<DeepseekV4Model>(cfg, opts, &rank);
}

const DeepseekV4Config* deepseek_v4_config(const Model& m) {
  const auto* v = dynamic_cast<const DeepseekV4Info*>(&m);
  return v ? &v->v4() : nullptr;
}

const V4TensorIndex* deepseek_v4_index(const Model& m) {
  const auto* v = dynamic_cast<const DeepseekV4Info*>(&m);
  return v ? &v->index() : nullptr;
}

void deepseek_v4_plan_drafter(const Model& target, const std::string& what, uint64_t drafter_bytes,
                              uint64_t drafter_expert_bytes) {
  const uint64_t tb = deepseek_v4_weight_bytes(target), sum = tb + drafter_bytes;
  const uint64_t total = meminfo_kib("MemTotal:") * 1024ull, avail = meminfo_kib("MemAvailable:") * 1024ull;
  std::fprintf(stderr,
               "deepseek_v4: %s weights %s (routed experts %s); target + drafter %s; memory %s total, %s available\n",
               what.c_str(), gib(drafter_bytes).c_str(), gib(drafter_expert_bytes).c_str(), gib(sum).c_str(),
               gib(total).c_str(), gib(avail).c_str());
  if (total > 0 && sum > total)
    throw Error(what + ": target + drafter weights need " + gib(sum) + " but this machine has " + gib(total) +
                " of memory; refusing to load the drafter (run without it, or on a machine with more memory)");
}

uint64_t deepseek_v4_weight_bytes(const Model& m) {
  const auto* v = dynamic_cast<const DeepseekV4Info*>(&m);
  return v ? v->weight_bytes() : 0;
}

}  // namespace dsinfer
