// dsinfer engine: the batched engine's step loop (see llm_engine.h for the data flow).
#include "engine/llm_engine.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "engine/draft_worker.h"
#include "engine/sps_profile.h"
#include "kernels/cpu/attention.h"
#include "model/model.h"
#include "model/block_kv_cache.h"
#include "model/device_verify.h"
#include "spec/calibration.h"
#include "spec/drafter.h"
#include "spec/prefix_scheduler.h"
#include "spec/verify.h"

namespace dsinfer {

// Where a step's host time goes (DSINFER_ENGINE_PHASES=1): lap(i) charges the time since the
// previous lap to phase i. Off, the laps cost one branch each.
struct LLMEngine::PhaseClock {
  static constexpr const char* kNames[] = {"admit", "lookup+choice", "roles+draft job", "draft pass", "schedule",
                                           "batch", "forward", "verify+emit", "finish"};
  static constexpr int kPhases = sizeof(kNames) / sizeof(kNames[0]);
  std::chrono::steady_clock::time_point last;
  double secs[kPhases] = {};
  uint64_t steps = 0;
  void start() { last = std::chrono::steady_clock::now(); }
  void lap(int i) {  // the last phase's lap completes a step
    const auto now = std::chrono::steady_clock::now();
    secs[i] += std::chrono::duration<double>(now - last).count();
    last = now;
    if (i == kPhases - 1) ++steps;
  }
  void print() const {
    if (steps == 0) return;
    std::fprintf(stderr, "engine phases (us per step, %llu steps):", static_cast<unsigned long long>(steps));
    for (int i = 0; i < kPhases; ++i) std::fprintf(stderr, " %s %.1f", kNames[i], 1e6 * secs[i] / static_cast<double>(steps));
    std::fprintf(stderr, "\n");
  }
};

namespace {
// Prompt tokens a step may always spend when prompts wait (prefill_step_tokens less the
// decoding rows may be smaller): waiting prompts keep progressing under any decode load.
constexpr int kMinPromptTokens = 64;
// Weight of a new drafting step in a request's smoothed gain estimate (choose_drafting).
constexpr double kGainSmoothing = 0.3;
// Closed steps of the running load (net of open ones) before captures stop and the batch
// is retired from drafting (LLMEngine::step).
constexpr int kRetireAfterClosedSteps = 32;
// A load is closed (for the drafting choice and for retirement) where no number of drafting
// requests could pay with this share of each block accepted, by kOpenMargin
// (LoadPayoff::most_block), unless the population measured more.
constexpr double kRetireBlockShare = 0.75;
// How much better than plain decoding drafting at kRetireBlockShare must be for a load to
// count as open (LLMEngine::load_payoff; DSINFER_ENGINE_OPEN_MARGIN overrides it for A/B runs).
constexpr double kOpenMargin = 1.25;
// What an open step takes off the count of closed ones (LLMEngine::step).
constexpr int kStreakDecay = 4;
// The population's gain estimate is the plain mean of its first kPopWindow measurements,
// then an exponential mean over about that many (LLMEngine::step).
constexpr double kPopWindow = 20.0;
// kStaleDecay^skipped (choose_drafting), from a table for the common counts: the same values
// as std::pow, without a pow per request per step.
double stale_keep(int skipped) {
  constexpr double kStaleDecay = 0.8;
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (size_t n = 0; n < t.size(); ++n) t[n] = std::pow(kStaleDecay, static_cast<double>(n));
    return t;
  }();
  return skipped >= 0 && skipped < static_cast<int>(table.size()) ? table[static_cast<size_t>(skipped)]
                                                                   : std::pow(kStaleDecay, static_cast<double>(skipped));
}
}  // namespace

struct LLMEngine::Sequence {
  uint64_t id = 0;
  EngineRequest req;
  int slot = -1;
  // What the prefill computes: the prompt, or after a preemption the prompt and every
  // emitted token but the anchor (`resumed`: the anchor is known, no token is sampled at
  // the end of that prefill). prefilled = positions of `context` already in the KV cache.
  std::vector<int32_t> context;
  bool resumed = false;
  int prefilled = 0;
  BlockTable table;        // the request's KV blocks (empty while waiting)
  uint64_t queued_at = 0;  // step_clock_ when it (re)joined the waiting queue
  bool decoding = false;   // prompt done; anchor holds the next token to verify
  int32_t anchor = 0;
  std::unique_ptr<DraftSequence> draft;
  // The position of the drafter context's first row: 0, or where drafting was re-armed
  // after a retirement (its context then starts there; RoPE sees only differences).
  int draft_base = 0;
  // Committed positions not yet given to the drafter: [draft_base + draft->context_length(), + size).
  // Their captured target rows are in the feature store; a drafter pass gathers them.
  std::vector<int32_t> pending_tokens;
  Rng rng;
  std::unique_ptr<OutputStream> out;
  SpecStats spec;
  bool finished = false;
  // Drafting decision (DSpark policy): expected extra commits Σ a_j and verified drafts per
  // drafting step, smoothed over this request's drafting steps; steps skipped since.
  double last_gain = 1e30;  // unknown: the population's estimate (or, before any, draft)
  double last_len = 0;
  int skipped = 0;
  int gain_steps = 0;  // drafting steps behind last_gain
  SpecHealth health;       // self-healing fallback and dynamic window (EngineOptions::health)
  int window_applied = 0;  // the drafter window last set on `draft`
  // This step's work and output.
  DraftProposal prop;
  // Async prefetch: `prop` holds drafts for the current anchor proposed during an earlier
  // step (by the DraftWorker); this step verifies them instead of drafting.
  bool prop_ready = false;
  // Lookup assist (EngineOptions::lookup_assist): the request's history and proposals, this
  // step's proposal (its drafts and their survival estimates), whether `prop` is that
  // proposal, and the request's drafter yield (what a drafter round commits).
  std::unique_ptr<LookupTracker> lookup;
  std::vector<int32_t> lookup_tokens;
  std::vector<float> lookup_survival;
  int lookup_bucket = -1;  // its LookupStats bucket (per-draft conditionals for round logs)
  bool prop_lookup = false;
  bool prop_drafted = false;  // `prop` came from a drafter pass (its round feeds `yield`)
  DrafterYield yield;
  std::vector<int32_t> step_ids;
  std::string step_text;
};

LLMEngine::LLMEngine(Model& model, const EngineOptions& opts) : model_(model), opts_(opts) {
  if (env_switch("DSINFER_ENGINE_PHASES", false)) phases_ = std::make_unique<PhaseClock>();
  skip_captures_ = env_switch("DSINFER_ENGINE_SKIP_CAPTURES", true);
  open_margin_ = kOpenMargin;
  if (const char* m = std::getenv("DSINFER_ENGINE_OPEN_MARGIN")) {
    char* end = nullptr;
    const double v = std::strtod(m, &end);
    if (end == m || *end != '\0' || !(v > 0.0) || v > 10.0)
      throw Error(std::string("DSINFER_ENGINE_OPEN_MARGIN: expected a number in (0, 10], got '") + m + "'");
    open_margin_ = v;
  }
  if (model_.on_device()) {
    device_verifier_ = dynamic_cast<DeviceVerifier*>(&model_);
    if (device_verifier_ && !device_verifier_->verifies_on_device()) device_verifier_ = nullptr;
  }
  if (opts_.max_running < 1) throw Error("engine: max_running must be >= 1");
  if (opts_.max_model_len < 2) throw Error("engine: max_model_len must be >= 2");
  if (opts_.max_batch_tokens < 1) throw Error("engine: max_batch_tokens must be >= 1");
  if (is_dspark_policy(opts_.policy) && !opts_.sps) throw Error("engine: the dspark policies need an SPS table");
  if (opts_.policy == VerifyPolicy::Threshold && opts_.validation_threshold <= 0.0f)
    throw Error("engine: the threshold policy needs validation_threshold > 0");
  validate_spec_health_options(opts_.health);
  if (opts_.health.max_window > 0 && !(opts_.drafter && opts_.drafter->supports_window()))
    throw Error("--dspark-dsw-min-window / --dspark-dsw-max-window: need a block drafter (DFlash / DSpark)");
  if (opts_.synthetic_acceptance_rate >= 0.0 && !(opts_.synthetic_acceptance_rate > 0.0 && opts_.synthetic_acceptance_rate <= 1.0))
    throw Error("--synthetic-acceptance-rate: must be in (0, 1], got " + std::to_string(opts_.synthetic_acceptance_rate));
  if (opts_.synthetic_acceptance_rate > 0.0 && !opts_.drafter)
    throw Error("--synthetic-acceptance-rate: needs a drafter (it replaces the acceptance of real drafts)");
  if (opts_.drafter) {
    const DrafterInfo& info = opts_.drafter->info();
    max_drafts_ = opts_.max_draft_tokens >= 0 ? std::min(opts_.max_draft_tokens, info.max_draft_tokens)
                                              : info.max_draft_tokens;
    max_drafts_ = std::max(max_drafts_, 0);
    capture_ = info.target_layer_ids;
    feat_ = static_cast<int>(capture_.size()) * model.config().hidden_size;
    // Kept in BF16 when the drafter's matmuls round their inputs to BF16 anyway (bf16 matmul
    // precision, where the model's K/V are BF16 too): the same drafts from half the bytes.
    features_bf16_ = model.kv_dtype() == DType::BF16;
    if (opts_.policy != VerifyPolicy::Fixed && !info.confidence_head)
      throw Error("engine: the " + std::string(is_dspark_policy(opts_.policy) ? "dspark" : "threshold") +
                  " policy needs a drafter with a confidence head");
  } else if (opts_.policy != VerifyPolicy::Fixed) {
    throw Error("engine: verify policies other than fixed need a drafter");
  }
  if (opts_.lookup_assist && !(opts_.drafter && opts_.drafter->info().kind != "ngram"))
    throw Error("--spec-lookup: needs a model drafter (dflash or dspark)");
  if (opts_.async_prefetch && !opts_.drafter)
    throw Error("--dflash-enable-async-prefetch: needs a drafter (plain decoding has nothing to prefetch)");
  if (opts_.async_draft_threads < 0)
    throw Error("async_draft_threads: must be >= 0 (0: half the kernel threads), got " + std::to_string(opts_.async_draft_threads));
  // Every verify block must fit one step: anchor + all drafts of every running request is
  // not required, but one request's block is.
  if (opts_.max_batch_tokens < max_drafts_ + 1)
    throw Error("engine: max_batch_tokens (" + std::to_string(opts_.max_batch_tokens) +
                ") must hold one verify block (" + std::to_string(max_drafts_ + 1) + " tokens)");
  // The paged KV cache: a BlockPool (ids, prefix cache) over the storage the model makes
  // (host PagedKVCache on the CPU, a device pool for the CUDA model).
  const ModelConfig& mc = model.config();
  if (opts_.kv_block_size < 1) throw Error("kv_block_size: must be >= 1, got " + std::to_string(opts_.kv_block_size));
  if (opts_.shard_count < 1) throw Error("shard_count: must be >= 1, got " + std::to_string(opts_.shard_count));
  const int bs = opts_.kv_block_size;
  max_seq_tokens_ = opts_.max_model_len + max_drafts_ + 1;
  int64_t blocks = opts_.kv_num_blocks;
  const DType kv_dtype = model.kv_dtype();  // BF16 in bf16 matmul precision: half the bytes per block
  // The model's state shape: K/V rows by default; a per-sequence state (DeepSeek-V4) keeps
  // no prefix cache, so nothing can be warmed up or compacted.
  const Model::PagedStateShape shape = model.paged_state_shape();
  if (!shape.prefix_sharing && !opts_.cache_warmup_prompts.empty())
    throw Error("--cache-warmup-file: this model's decoding state is kept per sequence (" + mc.model_type +
                "), so the engine keeps no prefix cache to warm up");
  if (!shape.prefix_sharing && opts_.enable_cache_defrag)
    throw Error("--enable-cache-defrag: this model's decoding state is kept per sequence (" + mc.model_type +
                "), so the engine keeps no prefix cache to compact");
  // The drafter's captured rows stay in the model's paged pool when the drafter reads them
  // there (the GPU drafter beside a GPU target): the pool is asked for feature rows.
  const int want_features = feat_ && opts_.drafter->reads_cache_features() ? feat_ : 0;
  // A model whose pool lives in device memory sizes it from that memory (feature rows
  // included when it keeps them; else the feature store stays in host memory, outside it).
  const int64_t device_blocks = blocks <= 0 && opts_.kv_budget_bytes > 0
                                    ? model.device_kv_blocks(bs, opts_.cache_prealloc_ratio, want_features)
                                    : 0;
  if (device_blocks > 0) {
    blocks = device_blocks;
    // A host feature store: at most the host budget's share.
    if (feat_ && !want_features) {
      const double feature_bytes_per_block = static_cast<double>(bs) * feature_row_bytes();
      const double host = static_cast<double>(opts_.kv_budget_bytes) * opts_.cache_prealloc_ratio;
      blocks = std::min<int64_t>(blocks, static_cast<int64_t>(host / feature_bytes_per_block));
    }
  } else if (blocks <= 0 && opts_.kv_budget_bytes > 0 && shape.bytes_per_token > 0) {
    // A model with its own state shape (DeepSeek-V4): every running sequence's bounded
    // state comes off the budget first, the rest is blocks at the state's per-token rate
    // (and the feature store's, with a drafter).
    check_prealloc_ratio(opts_.cache_prealloc_ratio);
    const double budget = static_cast<double>(opts_.kv_budget_bytes) * opts_.cache_prealloc_ratio -
                          static_cast<double>(opts_.max_running) * static_cast<double>(shape.bytes_per_sequence);
    const double per_block = static_cast<double>(bs) * (static_cast<double>(shape.bytes_per_token) + feature_row_bytes());
    if (budget < per_block)
      throw Error("KV pool: " + std::to_string(opts_.max_running) + " sequences' bounded decoding state (" +
                  std::to_string(shape.bytes_per_sequence) + " bytes each) leaves no room in the memory budget (" +
                  std::to_string(opts_.kv_budget_bytes) + " bytes x ratio " + std::to_string(opts_.cache_prealloc_ratio) +
                  "); lower the concurrency or raise the budget");
    blocks = static_cast<int64_t>(budget / per_block);
    // Without a prefix cache no block outlives its request: max_running full-length
    // sequences are all the pool can ever hold (more would only be committed memory: the
    // feature store, written at start-up).
    if (!shape.prefix_sharing)
      blocks = std::min<int64_t>(blocks, static_cast<int64_t>(opts_.max_running) * ((max_seq_tokens_ + bs - 1) / bs + 1));
  } else if (blocks <= 0 && opts_.kv_budget_bytes > 0) {
    KVLayout layout;
    layout.n_layers = mc.num_hidden_layers;
    layout.n_kv_heads = mc.num_key_value_heads;
    layout.head_dim = mc.head_dim;
    layout.block_size = bs;
    layout.dtype = kv_dtype;
    blocks = blocks_for_budget(opts_.kv_budget_bytes, opts_.cache_prealloc_ratio, layout);
    // With a drafter each block also keeps its positions' captured rows (feature store):
    // the budget covers both.
    const double kv_bytes = static_cast<double>(layout.bytes_per_block());
    if (feat_)
      blocks = static_cast<int64_t>(static_cast<double>(blocks) * kv_bytes /
                                    (kv_bytes + static_cast<double>(bs) * feature_row_bytes()));
  } else if (blocks <= 0) {
    blocks = static_cast<int64_t>(opts_.max_running) * ((max_seq_tokens_ + bs - 1) / bs + 1);
  }
  if (blocks < opts_.shard_count)
    throw Error("kv_num_blocks: " + std::to_string(blocks) + " KV blocks is fewer than shard_count (" +
                std::to_string(opts_.shard_count) + "); raise the memory budget or lower the shard count");
  BlockPoolConfig pc;
  pc.num_blocks = blocks;
  pc.block_size = bs;
  pc.shard_count = opts_.shard_count;
  pc.prefix_cache = shape.prefix_sharing;
  pool_ = std::make_unique<BlockPool>(pc);
  kv_ = model.make_paged_kv_cache(bs, blocks, opts_.max_running, max_seq_tokens_, want_features);
  paged_ = kv_.get();
  const bool in_pool = want_features > 0 && kv_->feature_floats() == feat_;
  if (feat_ && !in_pool) features_.reset(new std::byte[static_cast<size_t>(blocks) * bs * feature_row_bytes()]);
  // The pool's memory is committed now (--cache-prealloc-ratio takes it at start-up), not
  // page by page while serving: in a VM a first touch costs microseconds per 4 KB page, and
  // the first requests' prefill steps paid it (the feature store, as large as the K/V, made
  // speculative engines pay more: a tenth of a run at concurrency 128).
  kv_->prefault();
  if (features_) std::memset(features_.get(), 0, static_cast<size_t>(blocks) * bs * feature_row_bytes());
  if (feat_) uncaptured_.assign(static_cast<size_t>(blocks), 0);
  for (int s = opts_.max_running - 1; s >= 0; --s) free_slots_.push_back(s);
  block_max_drafts_ = max_drafts_;
  runtime_.policy = opts_.policy;
  runtime_.validation_threshold = opts_.validation_threshold;
  runtime_.scheduler_policy = opts_.scheduler_policy;
  runtime_.async_prefetch = opts_.async_prefetch;
  async_prefetch_ = opts_.async_prefetch;
  stats_.kv_blocks_total = static_cast<int>(blocks);
  stats_.kv_block_tokens = bs;
  warm_up();
}

EngineRuntimeConfig LLMEngine::runtime_config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runtime_;
}

void LLMEngine::set_runtime_config(const EngineRuntimeConfig& c) {
  // The same rules as the constructor's, so a change can never produce a state the
  // engine could not have been built with.
  if (!(c.validation_threshold >= 0.0f && c.validation_threshold <= 1.0f))
    throw Error("validation_threshold: must be in [0, 1], got " + std::to_string(c.validation_threshold));
  if (c.max_reuse_depth < -1) throw Error("max_reuse_depth: must be >= 0 (or -1: the drafter's block)");
  if (c.window_size < 0) throw Error("window_size: must be >= 0 (0: the drafter's configured window)");
  if (c.window_size > 0 && !(opts_.drafter && opts_.drafter->supports_window()))
    throw Error("window_size: the drafter has no context window to change");
  if (c.policy != VerifyPolicy::Fixed) {
    const char* name = c.policy == VerifyPolicy::DSpark ? "dspark" : c.policy == VerifyPolicy::DSparkAsync ? "dspark-async" : "threshold";
    if (!opts_.drafter) throw Error(std::string("schedule_policy: ") + name + " needs a drafter (the engine runs plain decoding)");
    if (!opts_.drafter->info().confidence_head)
      throw Error(std::string("schedule_policy: ") + name + " needs a drafter with a confidence head");
  }
  if (is_dspark_policy(c.policy) && !opts_.sps)
    throw Error("schedule_policy: dspark / dspark-async need an SPS table (the engine was started without one)");
  if (c.policy == VerifyPolicy::Threshold && c.validation_threshold <= 0.0f)
    throw Error("validation_threshold: the threshold policy needs a value > 0");
  if (c.async_prefetch && !opts_.drafter)
    throw Error("async_prefetch: needs a drafter (the engine runs plain decoding)");
  {
    std::lock_guard<std::mutex> lock(mu_);
    runtime_ = c;
    runtime_pending_ = true;
  }
  cv_.notify_all();
}

LLMEngine::~LLMEngine() {
  stop();
  std::lock_guard<std::mutex> step_lock(step_mu_);
  take_inbox();
  for (auto& s : waiting_) finish(*s, "cancelled");
  for (auto& s : running_) finish(*s, "cancelled");
  if (phases_) phases_->print();
}

uint64_t LLMEngine::submit(EngineRequest req) {
  const auto& cfg = model_.config();
  if (req.prompt.empty()) throw Error("prompt: empty (at least one token is needed)");
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= cfg.vocab_size)
      throw Error("prompt: token id " + std::to_string(req.prompt[i]) + " at index " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
  validate_sampling_params(req.sampling);
  if (req.stop.max_tokens <= 0) throw Error("max_tokens: must be > 0, got " + std::to_string(req.stop.max_tokens));
  const int64_t total = static_cast<int64_t>(req.prompt.size()) + req.stop.max_tokens;
  if (total > opts_.max_model_len || total > cfg.max_position_embeddings)
    throw Error("max_tokens: prompt (" + std::to_string(req.prompt.size()) + ") + max_tokens (" +
                std::to_string(req.stop.max_tokens) + ") exceeds the model length limit (" +
                std::to_string(std::min<int64_t>(opts_.max_model_len, cfg.max_position_embeddings)) + ")");
  {
    // Alone in the pool (everything else preempted or evicted) the request must fit, with
    // its largest verify block and one copy-on-write block; otherwise it could never finish.
    const int bs = pool_->block_size();
    const int64_t need = (total + block_max_drafts_ + 1 + bs - 1) / bs + 1;
    if (need > pool_->num_blocks())
      throw Error("max_tokens: prompt (" + std::to_string(req.prompt.size()) + ") + max_tokens (" +
                  std::to_string(req.stop.max_tokens) + ") needs " + std::to_string(need) + " KV blocks of " +
                  std::to_string(bs) + " tokens; the pool has " + std::to_string(pool_->num_blocks()));
  }
  auto s = std::make_unique<Sequence>();
  s->health = SpecHealth(opts_.health);
  s->rng = Rng(req.sampling.seed);
  Sequence* raw = s.get();
  s->out = std::make_unique<OutputStream>(opts_.tokenizer, req.stop,
                                          [raw](std::string_view t) { raw->step_text.append(t); });
  s->req = std::move(req);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = s->id = next_id_++;
    inbox_.push_back(std::move(s));
  }
  cv_.notify_all();
  return id;
}

void LLMEngine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void LLMEngine::take_inbox() {
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!inbox_.empty()) {
      inbox_.front()->queued_at = step_clock_;
      waiting_.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
    cancels.swap(cancels_);
  }
  for (uint64_t id : cancels) {
    for (auto* list : {&waiting_, &running_})
      for (auto& s : *list)
        if (s->id == id && !s->finished) finish(*s, "cancelled");
  }
}

namespace {

// Priority first, then arrival (ids grow with arrival; a preempted request keeps its id,
// so it goes back ahead of later arrivals).
template <class P>
bool runs_before(const P& a, const P& b) {
  return a->req.priority != b->req.priority ? a->req.priority > b->req.priority : a->id < b->id;
}

// Tokens a decoding request writes next step: the anchor and at most this many drafts.
template <class S>
int next_step_tokens(const S& s, int max_drafts) {
  return 1 + (s.draft ? std::max(0, std::min(max_drafts, s.out->remaining() - 1)) : 0);
}

}  // namespace

void LLMEngine::admit() {
  if (opts_.scheduler_policy == SchedulerPolicy::Fcfs) {
    std::stable_sort(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) { return runs_before(a, b); });
  } else if (waiting_.size() > 1) {
    std::vector<AdmissionCandidate> cands;
    for (const auto& w : waiting_) {
      const std::vector<int32_t>& ctx = w->context.empty() ? w->req.prompt : w->context;
      AdmissionCandidate c;
      c.priority = w->req.priority;
      c.arrival = w->id;
      c.waited_steps = static_cast<int64_t>(step_clock_ - w->queued_at);
      c.prompt_tokens = static_cast<int>(ctx.size());
      c.cached_tokens = pool_->peek_cached_tokens(ctx);
      c.work_tokens = c.prompt_tokens - c.cached_tokens + w->out->remaining();
      cands.push_back(c);
    }
    const std::vector<size_t> order = admission_order(opts_.scheduler_policy, cands, opts_.scheduler_aging_steps);
    std::vector<std::unique_ptr<Sequence>> sorted;
    for (size_t i : order) sorted.push_back(std::move(waiting_[i]));
    waiting_ = std::move(sorted);
  }
  // Admission control: a request is admitted only when its prompt's blocks (minus those
  // the prefix cache serves) fit next to what the running decoders need for their next
  // verify blocks; else it waits (and so does everything behind it, so it cannot starve).
  int64_t reserve = decode_reserve();
  const int bs = pool_->block_size();
  size_t i = 0;
  for (; i < waiting_.size() && !free_slots_.empty(); ++i) {
    Sequence& s = *waiting_[i];
    if (s.context.empty()) s.context = s.req.prompt;
    const int64_t len = static_cast<int64_t>(s.context.size());
    const int64_t need = (len + bs - 1) / bs - pool_->peek_cached_tokens(s.context) / bs;
    if (!pool_->can_allocate(need + reserve)) break;
    const AdmitResult ar = pool_->admit(s.table, s.context);
    if (!ar.ok) break;
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    s.prefilled = ar.cached_tokens;  // shared full blocks are not recomputed
    bind(s, s.prefilled);
    if (!s.resumed) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prompt_tokens_cached += static_cast<uint64_t>(ar.cached_tokens);
    }
    if (opts_.drafter) {
      // The drafter still gets the whole context: the cached positions' captured target
      // rows are in the feature store, written when those blocks were computed, unless a
      // block was computed without captures (uncaptured_): then it starts retired (no
      // drafter state) and is re-armed from a later position (LLMEngine::step).
      bool captured = true;
      if (!uncaptured_.empty())
        for (int b = 0; b < ar.cached_tokens / bs && captured; ++b)
          captured = uncaptured_[static_cast<size_t>(s.table.blocks()[static_cast<size_t>(b)])] == 0;
      s.draft_base = 0;
      if (captured) {
        s.draft = opts_.drafter->start();
        s.pending_tokens.assign(s.context.begin(), s.context.begin() + ar.cached_tokens);
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.drafting_retired++;
      }
      if (opts_.lookup_assist) {
        s.lookup = std::make_unique<LookupTracker>(opts_.lookup);
        s.lookup->commit(s.context.data(), ar.cached_tokens, lookup_stats_);
      }
    }
    defrag_due_ = true;
    running_.push_back(std::move(waiting_[i]));
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<ptrdiff_t>(i));
}

int64_t LLMEngine::decode_reserve() const {
  int64_t n = 0;
  for (const auto& s : running_)
    if (s->decoding && !s->finished) n += pool_->blocks_needed(s->table, next_step_tokens(*s, max_drafts_));
  return n;
}

void LLMEngine::make_room_for_decoding() {
  // Requests keep their blocks in priority order: while the decoders' next verify blocks
  // do not fit, the lowest-priority, latest running request is preempted. The highest
  // priority one always fits alone (submit() refuses requests that could not), so some
  // request always progresses.
  std::stable_sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) { return runs_before(a, b); });
  while (true) {
    const int64_t need = decode_reserve();
    if (need == 0 || pool_->can_allocate(need)) return;
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend() && !victim; ++it)
      if (!(*it)->finished) victim = it->get();
    if (!victim) return;
    preempt(*victim);
  }
}

void LLMEngine::preempt(Sequence& s) {
  pool_->free(s.table);  // its committed full blocks stay cached (idle) until evicted
  paged_->unbind(s.slot);
  free_slots_.push_back(s.slot);
  s.slot = -1;
  s.draft.reset();
  s.lookup.reset();  // admission starts it again from the recomputed context
  s.prop = DraftProposal{};
  s.prop_ready = false;
  s.prop_lookup = false;
  s.pending_tokens.clear();
  if (s.decoding) {
    // Recompute prompt + emitted tokens except the anchor (not in the KV cache yet); the
    // streamed tokens stay streamed and decoding continues from the same anchor.
    const std::vector<int32_t>& ids = s.out->ids();
    s.context = s.req.prompt;
    s.context.insert(s.context.end(), ids.begin(), ids.end() - 1);
    s.resumed = true;
  }
  s.decoding = false;
  s.prefilled = 0;
  s.queued_at = step_clock_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.preemptions++;
  }
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == &s) {
      waiting_.push_back(std::move(*it));
      running_.erase(it);
      break;
    }
}

void LLMEngine::bind(Sequence& s, int length) { paged_->bind(s.slot, s.table.blocks(), length); }

void LLMEngine::copy_block(int32_t src, int32_t dst, int n_tokens) {
  paged_->copy_block(src, dst, n_tokens);
  if (!uncaptured_.empty()) uncaptured_[static_cast<size_t>(dst)] = uncaptured_[static_cast<size_t>(src)];
  if (!features_) return;
  const size_t block_bytes = static_cast<size_t>(pool_->block_size()) * feature_row_bytes();
  std::memcpy(features_.get() + static_cast<size_t>(dst) * block_bytes,
              features_.get() + static_cast<size_t>(src) * block_bytes,
              static_cast<size_t>(n_tokens) * feature_row_bytes());
}

void LLMEngine::store_features(std::span<const int32_t> blocks, int start, int n, const float* hidden) {
  if (!features_ || !hidden) return;
  for (int i = 0; i < n; ++i) {
    std::byte* row = feature_row(blocks, start + i);
    const float* src = hidden + static_cast<size_t>(i) * feat_;
    if (features_bf16_) kv_round_bf16(src, feat_, reinterpret_cast<uint16_t*>(row));
    else std::memcpy(row, src, static_cast<size_t>(feat_) * sizeof(float));
  }
}

void LLMEngine::gather_features(std::span<const int32_t> blocks, int start, int n, float* dst) const {
  for (int i = 0; i < n; ++i) {
    const std::byte* row = feature_row(blocks, start + i);
    float* out = dst + static_cast<size_t>(i) * feat_;
    if (features_bf16_) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
      for (int k = 0; k < feat_; ++k) out[k] = bf16_to_f32(h[k]);
    } else {
      std::memcpy(out, row, static_cast<size_t>(feat_) * sizeof(float));
    }
  }
}

void LLMEngine::warm_up() {
  // Each prompt is prefilled (chunks of max_batch_tokens, slot 0, captured rows stored
  // for the drafter) and committed, then its table is freed: its full blocks stay in the
  // prefix cache as idle entries, evicted last-used-first like any other.
  const int V = model_.config().vocab_size;
  const auto& prompts = opts_.cache_warmup_prompts;
  for (size_t w = 0; w < prompts.size(); ++w) {
    const std::vector<int32_t>& p = prompts[w];
    const std::string where = "cache warm-up prompt " + std::to_string(w);
    if (p.empty()) throw Error(where + ": empty");
    for (int32_t t : p)
      if (t < 0 || t >= V)
        throw Error(where + ": token id " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    if (static_cast<int>(p.size()) > opts_.max_model_len)
      throw Error(where + ": " + std::to_string(p.size()) + " tokens exceed max_model_len (" +
                  std::to_string(opts_.max_model_len) + ")");
    BlockTable t;
    const AdmitResult ar = pool_->admit(t, p);
    if (!ar.ok)
      throw Error(where + ": " + std::to_string(p.size()) + " tokens do not fit the KV pool (" +
                  std::to_string(pool_->num_blocks()) + " blocks)");
    const int len = static_cast<int>(p.size());
    ForwardOutput out;
    for (int done = ar.cached_tokens; done < len;) {
      const int chunk = std::min(len - done, opts_.max_batch_tokens);
      ForwardBatch b;
      b.capture_layers = capture_;
      b.capture_to_cache = device_features();
      b.entries.push_back({0, std::vector<int32_t>(p.begin() + done, p.begin() + done + chunk), {}});
      paged_->bind(0, t.blocks(), done);
      model_.forward(*kv_, b, out);
      store_features(t.blocks(), done, chunk, out.captured.data());
      done += chunk;
      pool_->commit(t, done);
    }
    pool_->free(t);
    stats_.warmup_prompts++;
  }
  paged_->unbind(0);
}

void LLMEngine::defrag_if_idle() {
  // --enable-cache-defrag: when nothing runs (so no table holds a block), drop cache
  // entries no lookup can reach and renumber the cached blocks to the low end of each
  // shard; K/V (and drafter features) move with them.
  if (!opts_.enable_cache_defrag || !defrag_due_ || !running_.empty()) return;
  defrag_due_ = false;
  const CompactResult r = pool_->compact({});
  if (!r.ok) return;  // only when tables hold blocks, which they do not while idle
  const int bs = pool_->block_size();
  for (const BlockMove& m : r.moves) copy_block(m.from, m.to, bs);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.cache_defrags++;
  stats_.defrag_moves += r.moves.size();
}

void LLMEngine::finish(Sequence& s, const std::string& reason, const std::string& error) {
  if (s.finished) return;
  s.finished = true;
  s.out->finish();
  RequestEvent ev;
  ev.id = s.id;
  ev.new_ids = std::move(s.step_ids);
  ev.new_text = std::move(s.step_text);
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.prompt_tokens = static_cast<int>(s.req.prompt.size());
  ev.completion_tokens = static_cast<int>(s.out->ids().size());
  ev.spec = s.spec;
  if (s.table.admitted()) pool_->free(s.table);  // KV freed at once
  if (s.slot >= 0) {
    paged_->unbind(s.slot);
    free_slots_.push_back(s.slot);
    s.slot = -1;
  }
  s.draft.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason == "cancelled") stats_.requests_cancelled++;
    else if (reason == "error") stats_.requests_failed++;
    else stats_.requests_finished++;
    stats_.generated_tokens += static_cast<uint64_t>(ev.completion_tokens);
  }
  if (s.req.on_event) s.req.on_event(ev);
}

void LLMEngine::emit_tokens(Sequence& s, const std::vector<int32_t>& ids, SpecRound* round) {
  const size_t before = s.out->ids().size();
  for (int32_t id : ids) {
    s.step_ids.push_back(id);
    if (s.out->push(id)) break;
  }
  if (round) {
    round->committed = static_cast<int>(s.out->ids().size() - before);
    s.spec.add(*round);
  }
  if (s.out->done()) {
    finish(s, s.out->finish_reason());
    return;
  }
  if (s.req.on_event && (!s.step_ids.empty() || !s.step_text.empty())) {
    RequestEvent ev;
    ev.id = s.id;
    ev.new_ids = std::move(s.step_ids);
    ev.new_text = std::move(s.step_text);
    s.req.on_event(ev);
  }
  s.step_ids.clear();
  s.step_text.clear();
}

LLMEngine::LoadPayoff LLMEngine::load_payoff(int R, int base_rows, double base_tokens) {
  // At this load (R decoding requests, the step's base rows and tokens without drafts),
  // could drafting pay even if every draft were accepted, for some number k of drafting
  // requests? If not (a large batch: the step is compute-bound and a drafter pass costs
  // more than full blocks bring), nobody drafts and nobody probes: probes, and the drafter
  // context rows they flush, are then pure cost, which kept dspark 5-15 % behind plain
  // decoding at concurrency 16-64. Every k is tried, not only one request: on a GPU a
  // drafter pass costs nearly the same for 1 and 4 requests (0.30 / 0.37 ms on the H200),
  // so one request's drafts may not pay for a pass that four requests' drafts do.
  const int B0 = std::max(base_rows, R);
  const double T0 = std::max(base_tokens, static_cast<double>(R));
  // A function of (R, B0, T0, max_drafts_) alone (the curves are fixed for the run), and
  // under steady load those repeat step after step: kept for the last two tuples asked (the
  // step's and the pure decode load's; the scan over every k was 2-3 us of a 0.6 ms step at
  // concurrency 64-128 on the H200).
  const std::tuple<int, int, double, int> key{R, B0, T0, max_drafts_};
  for (const PayoffMemo& m : payoff_memo_)
    if (m.key == key) return m.payoff;
  auto t_verify = [&](int b) { return 1000.0 / opts_.sps->sps(b); };
  const double plain = T0 / t_verify(B0);
  // Some k drafting requests pay when each verifies a block of n drafts (n from n_min up to
  // a full block) and `share` of them are accepted, beating plain decoding by `margin`.
  auto pays = [&](double share, double margin, int n_min) {
    for (int k = 1; k <= R; ++k)
      for (int n = n_min; n <= max_drafts_; ++n)
        if ((T0 + k * (share * n)) / (draft_ms(k) + t_verify(B0 + k * n)) > margin * plain) return true;
    return false;
  };
  LoadPayoff p;
  p.full_block = pays(1.0, 1.0, max_drafts_);
  p.half_block = p.full_block && pays(0.5, 1.0, max_drafts_);
  // Open (most_block): could blocks of any length (the verify policy cuts blocks short where
  // rows cost more) with kRetireBlockShare of their drafts accepted beat plain decoding by
  // open_margin_ (kOpenMargin)? The margin: where drafting could win only a few percent at
  // that acceptance, what the cost model leaves out (the drafter's context commits, the
  // captures, the curves' error) takes it back, and closing the load (no drafts, no captures
  // once retired) is worth more (this CPU at concurrency 4, where drafting one request at
  // that acceptance would gain 18 %: the choice drafted about one request a step, expecting
  // 5-10 %, and the engine ran at 0.91-0.95x plain decoding).
  p.most_block = p.full_block && pays(kRetireBlockShare, open_margin_, 1);
  payoff_memo_[payoff_next_] = PayoffMemo{key, p};
  payoff_next_ ^= 1;
  return p;
}

std::vector<bool> LLMEngine::choose_drafting(const std::vector<Sequence*>& dec, int base_rows, double base_tokens,
                                             const LoadPayoff& load) {
  std::vector<bool> yes(dec.size(), true);
  // Only the dspark policy with a verify-only SPS curve and a known draft cost decides: a
  // request's drafter pass costs draft_ms whatever the scheduler then verifies, so under load
  // drafting can cost more than it brings. Greedy on estimated gains (what drafting that
  // request bought when it last drafted; for a request never measured, the running mean of
  // every request's measurements, as requests of one workload accept alike): take requests
  // in decreasing gain while the step's expected throughput
  // (T0 + Σ gain) / (t_draft(k) + t_verify(B0 + Σ len)) grows, B0 / T0 being the rows and
  // tokens of the step without drafts (base_rows, base_tokens: with the lookup assist, the
  // requests verifying lookup proposals are in the step too; pricing drafts against the
  // candidates alone put them on the flat start of the verify curve, and at concurrency 16
  // on the CPU drafts were bought that the step's real size did not pay for). Any choice is
  // lossless (it only decides which requests get drafts).
  // Estimates go stale while requests are left out, so some re-probe; but a probe costs a
  // drafter pass and its verify rows, which under load is what made speculation slower than
  // plain decoding. So at most one request re-probes per step, the one left out longest,
  // and only every probe_gap steps, the gap keeping the probes' cost at kProbeShare of the
  // engine's time. Before anything was measured, up to kFirstProbes requests draft.
  constexpr double kProbeShare = 0.03;
  constexpr int kFirstProbes = 4;
  constexpr double kExplore = 1.0;  // tokens
  int first_probes = 0;
  if (!is_dspark_policy(opts_.policy) || !draft_cost_known() || dec.empty()) return yes;
  ++choice_clock_;
  const int R = static_cast<int>(dec.size());
  const int B0 = std::max(base_rows, R);
  const double T0 = std::max(base_tokens, static_cast<double>(R));
  auto t_verify = [&](int b) { return 1000.0 / opts_.sps->sps(b); };
  // EngineStats' choice counters, once per decided step.
  auto count_choice = [&](bool closed, int chosen, bool probed) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.choice_steps++;
    stats_.choice_closed += closed ? 1 : 0;
    stats_.choice_chosen += static_cast<uint64_t>(chosen);
    stats_.choice_probes += probed ? 1 : 0;
  };
  // Every return goes through here: steps left out count towards staleness and probe order.
  auto settle = [&](std::vector<bool> choice) {
    for (size_t i = 0; i < dec.size(); ++i) dec[i]->skipped = choice[i] ? 0 : dec[i]->skipped + 1;
    return choice;
  };
  // A closed load (load_payoff, from step(): not even three quarters of every block accepted
  // could pay) decides nothing: nobody drafts or probes.
  if (!load.most_block) {
    count_choice(true, 0, false);
    return settle(std::vector<bool>(dec.size(), false));
  }
  std::vector<double> est(dec.size());
  std::vector<int> est_len(dec.size());
  std::vector<int> order;
  for (int i = 0; i < R; ++i) {
    const Sequence* s = dec[static_cast<size_t>(i)];
    if (s->last_gain < 1e29) {
      // A request's own estimate goes stale while it is left out: it regresses to the
      // population's at kStaleDecay per skipped step. One unlucky step (a line start, a
      // rare token) no longer keeps a request from drafting until a paced re-probe, tens
      // of steps later, which at concurrency 1 was most of a generation.
      // The request's own estimate carries an exploration bonus kExplore / sqrt(its drafting
      // steps): a gain judged on one or two blocks (a line start, a rare token) is mostly
      // noise, and at low concurrency a request wrongly left out loses speculation for a
      // whole re-probe gap. The bonus fades with every drafting step, so drafting that does
      // not pay stops after a few; requests never measured get the population's estimate
      // without a bonus (a bonus there kept requests at concurrency 4 probing drafts that
      // could not pay).
      // The bonus also shrinks with the batch: alone, a request wrongly left out loses all of
      // its speculation; among R it is 1/R of the step, and drafting it costs the others.
      const double own = s->last_gain + kExplore / (R * std::sqrt(static_cast<double>(s->gain_steps)));
      const double keep = pop_measured_ > 0 ? stale_keep(s->skipped) : 1.0;
      est[static_cast<size_t>(i)] = pop_gain_ + keep * (own - pop_gain_);
      est_len[static_cast<size_t>(i)] =
          static_cast<int>(std::lround(pop_len_ + keep * (s->last_len - pop_len_)));
    } else if (pop_measured_ > 0) {
      est[static_cast<size_t>(i)] = pop_gain_;
      est_len[static_cast<size_t>(i)] = static_cast<int>(std::lround(pop_len_));
    } else {
      // Nothing measured yet: the first kFirstProbes requests draft to measure; the others
      // wait for that estimate (a burst of new requests does not all pay a first pass).
      if (first_probes++ >= kFirstProbes) yes[static_cast<size_t>(i)] = false;
      continue;
    }
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return est[static_cast<size_t>(a)] > est[static_cast<size_t>(b)]; });
  // A chosen request also commits its pending context rows before its block: a few after a
  // drafting step, its whole prompt (or every step it was left out) otherwise. That backlog
  // is paid once and buys drafting for the rest of the request, so a step is charged its
  // share over the drafting rounds the request has left (remaining tokens / (1 + gain));
  // charged whole to one step, a fresh request at concurrency 1 never started drafting.
  auto commit_share = [&](size_t i) {
    const Sequence* s = dec[i];
    const double rounds = std::max(1.0, s->out->remaining() / (1.0 + std::max(0.0, est[i])));
    return commit_ms(s->pending_tokens.size()) / rounds;
  };
  // The best prefix of that order, over every length (not the first one after which the
  // throughput dips: with a pass cost nearly flat in k, the first request alone may lose
  // what the first four together win).
  double gain = 0, commit = 0, best = T0 / t_verify(B0);
  int len = 0, k = 0;
  for (int j = 0; j < static_cast<int>(order.size()); ++j) {
    const size_t i = static_cast<size_t>(order[static_cast<size_t>(j)]);
    gain += est[i];
    len += est_len[i];
    commit += commit_share(i);
    const double theta = (T0 + gain) / (draft_ms(j + 1) + commit + t_verify(B0 + len));
    if (theta > best) {
      best = theta;
      k = j + 1;
    }
  }
  for (size_t j = static_cast<size_t>(k); j < order.size(); ++j) yes[static_cast<size_t>(order[j])] = false;
  if (k > 0) {
    chosen_since_probe_ = true;
    probe_backoff_ = 1;
  }
  bool probed = false;
  // Re-probe pacing: one probe costs its share of the drafter pass (one more request in it),
  // the whole commit of its pending rows (a probe that finds drafting does not pay has
  // bought nothing with it) and a verify block. Probes that keep finding that (nobody chosen
  // on merit after them) back off: each waits twice as long as the last, up to
  // kMaxProbeBackoff gaps. Where drafting cannot pay at this load (the H200 from
  // concurrency 16 up with the embedded models) the probes were most of what dspark cost
  // against plain decoding (2 % of a step at C = 16); a request whose estimate is stale
  // still regresses to the population's, and one chosen on merit resets the pace.
  constexpr uint64_t kMaxProbeBackoff = 16;
  if (k < static_cast<int>(order.size())) {
    size_t pick = static_cast<size_t>(order[static_cast<size_t>(k)]);
    for (size_t j = static_cast<size_t>(k); j < order.size(); ++j)
      if (dec[static_cast<size_t>(order[j])]->skipped > dec[pick]->skipped) pick = static_cast<size_t>(order[j]);
    const double t_step = t_verify(B0);
    const double t_probe = draft_ms(k + 1) - draft_ms(k) + commit_ms(dec[pick]->pending_tokens.size()) +
                           std::max(0.0, t_verify(B0 + max_drafts_) - t_step);
    const uint64_t probe_gap = probe_backoff_ * static_cast<uint64_t>(std::ceil(t_probe / (kProbeShare * t_step)));
    // Exploration: while the population's estimate rests on fewer than kPopWindow
    // measurements and drafting would pay at half a block per drafting request, a request
    // probes on every step, unpaced. Otherwise a few low first blocks (a line start) set an
    // estimate that kept the whole batch from drafting, and paced probes, each adding one
    // measurement, took most of a run to correct it: on the H200 at concurrency 16 about one
    // grid run in ten found nobody drafting (0.98x plain against 1.2x; PERFORMANCE.md,
    // sessions 20 and 22). Where only near-full blocks could pay (concurrency 64 there),
    // there is nothing to learn quickly and the paced probes stay.
    const bool explore = load.half_block && static_cast<double>(pop_measured_) < kPopWindow;
    if (explore || choice_clock_ >= last_probe_ + probe_gap) {
      if (!explore && last_probe_ > 0 && !chosen_since_probe_)
        probe_backoff_ = std::min(2 * probe_backoff_, kMaxProbeBackoff);
      chosen_since_probe_ = false;
      yes[pick] = true;
      last_probe_ = choice_clock_;
      probed = true;
    }
  }
  count_choice(false, k, probed);
  return settle(std::move(yes));
}

struct LLMEngine::DraftJob {
  // commits[i].hidden points into draft_hidden_ at hidden_at[i] floats, set once every
  // commit's rows are gathered (the buffer may grow until then).
  std::vector<ContextBatchItem> commits;
  std::vector<size_t> hidden_at;
  // With device features: the commits' block tables (commits[i].feature_blocks points into
  // the i-th; a deque keeps them in place while it grows).
  std::deque<std::vector<int32_t>> feature_tables;
  std::vector<DraftBatchItem> items;
  std::vector<Sequence*> owners;
};

void LLMEngine::draft_pass(DraftJob& job) const {
  const auto t0 = std::chrono::steady_clock::now();
  if (!job.commits.empty()) opts_.drafter->commit_context_batch(job.commits);
  for (Sequence* s : job.owners) s->pending_tokens.clear();
  if (!job.items.empty()) {
    std::vector<DraftProposal> props = opts_.drafter->propose_batch(job.items);
    for (size_t i = 0; i < job.owners.size(); ++i) job.owners[i]->prop = std::move(props[i]);
    if (opts_.synthetic_acceptance_rate > 0.0) {
      // Benchmark mode: the schedulers see confidences equal to the synthetic acceptance.
      const double p = std::min(opts_.synthetic_acceptance_rate, 1.0 - 1e-6);
      const float z = static_cast<float>(std::log(p / (1.0 - p)));
      for (Sequence* s : job.owners) {
        s->prop.confidence_logits.assign(s->prop.tokens.size(), z);
        s->prop.confidence.assign(s->prop.tokens.size(), static_cast<float>(p));
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  draft_seconds_ += secs;
}

bool LLMEngine::step() {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  const auto step_start = std::chrono::steady_clock::now();
  if (phases_) phases_->start();
  {
    // Runtime settings queued by set_runtime_config apply from this step on.
    std::lock_guard<std::mutex> lock(mu_);
    if (runtime_pending_) {
      opts_.policy = runtime_.policy;
      opts_.validation_threshold = runtime_.validation_threshold;
      max_drafts_ = runtime_.max_reuse_depth >= 0 ? std::min(runtime_.max_reuse_depth, block_max_drafts_)
                                                  : block_max_drafts_;
      window_size_ = runtime_.window_size;
      opts_.scheduler_policy = runtime_.scheduler_policy;
      async_prefetch_ = runtime_.async_prefetch;
      runtime_pending_ = false;
    }
  }
  ++step_clock_;
  take_inbox();
  auto drop_finished = [&](std::vector<std::unique_ptr<Sequence>>& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](const auto& s) { return s->finished; }), v.end());
  };
  drop_finished(waiting_);
  drop_finished(running_);
  if (running_.empty()) {
    // Nothing runs on: a new batch starts without budget history, nor with the drafting
    // choice's population estimate, so a request alone decides from its own history only
    // and a seeded sampled request alone is reproducible. Reset here, before admission,
    // and not only on an idle step: a request that arrives while the previous one is
    // finishing is admitted in the very step that drops it, with no idle step between
    // (the server's seeded-sampling test failed on a fast machine that way).
    if (async_sched_) async_sched_->reset();
    pop_gain_ = pop_len_ = 0.0;
    pop_measured_ = 0;
    lookup_stats_ = LookupStats{};
    pop_yield_ = DrafterYield{};
    choice_clock_ = last_probe_ = 0;
    closed_streak_ = 0;
    probe_backoff_ = 1;
    chosen_since_probe_ = false;
  }
  admit();
  make_room_for_decoding();
  if (phases_) phases_->lap(0);
  if (running_.empty()) {
    defrag_if_idle();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = 0;
    stats_.waiting = static_cast<int>(waiting_.size() + inbox_.size());
    stats_.kv_blocks_used = 0;
    stats_.kv_tokens_stored = 0;
    return false;
  }
  StepObservation obs;
  const int V = model_.config().vocab_size;
  // on_rounds: the step's rounds, and what each request proposed before the verify policy.
  const auto draft_start = std::chrono::steady_clock::now();
  std::vector<EngineRound> rounds;
  std::map<const Sequence*, std::pair<std::vector<int32_t>, std::vector<float>>> proposed;

  // 3. Drafting for every request past its prefill, then the verify policy.
  std::vector<Sequence*> dec;
  for (auto& s : running_)
    if (s->decoding) dec.push_back(s.get());
  // With async prefetch the drafter pass is off the critical path, so every request that
  // may draft does (the draft-cost trade-off of choose_drafting does not apply).
  const bool async = async_prefetch_ && opts_.drafter;
  // Lookup assist: every request's free proposal first. A request whose lookup is expected
  // to commit about what a drafter round of its would, relative to the round's cost, takes
  // the lookup and stays out of the drafting choice (its drafter pass is saved).
  const bool lookup_on = opts_.lookup_assist && !async && opts_.synthetic_acceptance_rate <= 0.0;
  std::vector<bool> lookup_first(dec.size(), false);
  if (lookup_on) {
    const int R = static_cast<int>(dec.size());
    // A lookup round's cost relative to a drafter round's, per request: its share of the
    // verify forward against that share plus a drafter pass (1 without a known draft cost).
    double rho = 1.0;
    if (draft_cost_known() && opts_.sps) {
      const double share = 1000.0 / opts_.sps->sps(R) / R;
      rho = share / (share + draft_ms(R) / R);
    }
    for (size_t r = 0; r < dec.size(); ++r) {
      Sequence* s = dec[r];
      s->prop_lookup = false;
      s->lookup_tokens.clear();
      s->lookup_survival.clear();
      const int n = std::min(max_drafts_, s->out->remaining() - 1);
      if (!s->lookup || s->prop_ready || n <= 0) continue;
      const LookupProposal& lp = s->lookup->propose(s->anchor, n);
      double gain = 0;
      for (size_t k = 0; k < lp.tokens.size(); ++k) {
        const double a = lookup_stats_.survival(lp.bucket, static_cast<int>(k) + 1);
        if (!(a > 0.0)) break;
        s->lookup_tokens.push_back(lp.tokens[k]);
        s->lookup_survival.push_back(static_cast<float>(a));
        gain += a;
      }
      s->lookup_bucket = lp.bucket;
      const DrafterYield& y = s->yield.rounds > 0 ? s->yield : pop_yield_;
      // Until a drafter round was measured, the drafter drafts (its yield is unknown).
      if (!s->lookup_tokens.empty() && y.rounds > 0 && 1.0 + gain >= rho * y.tokens) lookup_first[r] = true;
    }
  }
  std::vector<bool> drafts(dec.size(), true);
  // Whether the step's captures are skipped and its requests retired (below). Async
  // prefetch decides no drafting choice, and its steps break a run of closed ones.
  bool retire = false;
  if (async) closed_streak_ = 0;
  if (!async) {
    std::vector<Sequence*> candidates;
    int base_rows = static_cast<int>(dec.size());
    double base_tokens = static_cast<double>(dec.size());
    for (size_t r = 0; r < dec.size(); ++r) {
      // A request retired from drafting (no drafter state) verifies its lookup proposal, if
      // any, like one that took the lookup first: part of the step's base.
      if (!lookup_first[r] && dec[r]->draft) {
        candidates.push_back(dec[r]);
        continue;
      }
      base_rows += static_cast<int>(dec[r]->lookup_tokens.size());
      for (float a : dec[r]->lookup_survival) base_tokens += a;
    }
    // The step's load payoff; open unless measured (choose_drafting then decides nothing).
    LoadPayoff load{true, true, true};
    if (is_dspark_policy(opts_.policy) && draft_cost_known() && opts_.sps && !dec.empty()) {
      const int R = static_cast<int>(dec.size());
      // A load is closed where even three quarters of every block accepted could not pay
      // (most_block), not only a full block: a load where nothing short of every draft
      // accepted pays (the H200 at concurrency 64 with the embedded models, where DSpark's
      // blocks bring 3-4 of 8) otherwise kept probes, captures and first drafts going for an
      // option it never used, 3-4 % behind plain decoding. A population that measured more
      // than that share keeps the full-block criterion (closing would give up what it
      // measured).
      const bool pop_high = pop_measured_ > 0 && pop_gain_ >= kRetireBlockShare * max_drafts_;
      auto opened = [&](LoadPayoff p) {
        if (pop_high) p.most_block = p.full_block;
        return p;
      };
      load = opened(load_payoff(R, base_rows, base_tokens));
      // The running load: every running request, those still prefilling included (they
      // decode within a few steps). While a batch ramps up towards a closed concurrency
      // (the H200 at 64, its prompts prefilled 512 tokens a step), its first requests
      // otherwise drafted for the ramp's 30 steps, each first paying its prompt's context
      // commit, and were retired right after: 2-3 % of such a run.
      const int R_all = static_cast<int>(running_.size());
      const LoadPayoff running_load = opened(load_payoff(R_all, R_all, R_all));
      if (!running_load.most_block) load.most_block = load.half_block = false;
      // Captures are skipped, and requests retired, only where the running load alone (its
      // anchors, without the lookup proposals of this step) closes drafting (lookup rows
      // come and go from step to step, the concurrency does not), and only once it has
      // for kRetireAfterClosedSteps steps, net: a short burst of requests must not end
      // speculation for the long generations running through it. An open step
      // takes kStreakDecay off the count (capped at twice the threshold) rather than
      // resetting it: at a closed concurrency a step or two between one wave of requests
      // and the next (one fewer running before the next is admitted) reset it, and every
      // wave paid its captures and 32 steps before retiring; a load that has really dropped
      // reopens within 8 steps.
      if (running_load.most_block)
        closed_streak_ = std::max(0, closed_streak_ - kStreakDecay);
      else
        closed_streak_ = std::min(closed_streak_ + 1, 2 * kRetireAfterClosedSteps);
      retire = skip_captures_ && closed_streak_ >= kRetireAfterClosedSteps;
    }
    const std::vector<bool> chosen = choose_drafting(candidates, base_rows, base_tokens, load);
    for (size_t r = 0, c = 0; r < dec.size(); ++r) drafts[r] = lookup_first[r] || !dec[r]->draft ? false : chosen[c++];
    if (skip_captures_ && opts_.drafter && closed_streak_ == 0 && is_dspark_policy(opts_.policy)) {
      // The running load has been open for kRetireAfterClosedSteps / kStreakDecay steps or
      // more: retired requests (running with a drafter but no drafter state: a closed load
      // or prefix blocks without captures took it) get a fresh drafter context from their current
      // position (this step's anchor, captured from now on), as a sliding drafter window
      // would have left them; they are candidates from the next step, priced like requests
      // never measured. (Before, a request that lived through a closed load never drafted
      // again, however long it ran on.)
      for (Sequence* s : dec)
        if (!s->draft && !s->finished) {
          s->draft = opts_.drafter->start();
          s->draft_base = kv_->length(s->slot);
          s->pending_tokens.clear();
          s->last_gain = 1e30;
          s->gain_steps = 0;
          s->skipped = 0;
          s->window_applied = 0;
          std::lock_guard<std::mutex> lock(mu_);
          stats_.drafting_rearmed++;
        }
    }
  }
  if (phases_) phases_->lap(1);
  // One batched drafter pass for all drafting requests: first their pending committed
  // rows (one commit over every sequence), then their blocks (one propose over all), so
  // the drafter's weights are read once per step, not once per request. Results are
  // bit-identical to per-request calls (Drafter::propose_batch).
  // ver: the requests verified this step (same order as dec), track: whether the verified
  // prop came from a drafting choice (its gain feeds choose_drafting).
  std::vector<Sequence*> ver;
  std::vector<bool> track;
  DraftJob job;
  draft_hidden_.clear();  // the previous step's pass has finished (joined) before this step
  auto add_to_draft_job = [&](DraftJob& j, Sequence& s, int n) {
    // The dynamic drafter window, else the runtime one (hot reload), else the configured one.
    const int window = s.health.window() ? s.health.window() : window_size_;
    if (window != s.window_applied) {
      opts_.drafter->set_window(*s.draft, window);
      s.window_applied = window;
    }
    // Sized once, at its first drafter pass (not at admission: under load most requests
    // never draft, and their drafter state would be fresh pages for nothing).
    if (s.draft->context_length() == 0)
      opts_.drafter->reserve(*s.draft, static_cast<int>(s.req.prompt.size()) + s.req.stop.max_tokens);
    if (!s.pending_tokens.empty()) {
      // The pending rows' captured target rows, gathered from the feature store now (on this
      // thread: an async pass must not read blocks this step's forward may write).
      const int n_rows = static_cast<int>(s.pending_tokens.size());
      j.hidden_at.push_back(draft_hidden_.size());
      ContextBatchItem c{s.draft.get(), s.pending_tokens.data(), nullptr, n_rows};
      if (device_features()) {
        // The rows stay in the model's pool: the drafter reads them through a copy of the
        // table (the sequence's own may grow while an async pass runs).
        c.feature_blocks = j.feature_tables.emplace_back(s.table.blocks().begin(), s.table.blocks().end()).data();
        c.feature_cache = kv_.get();
        c.feature_first = s.draft_base + s.draft->context_length();
      } else if (feat_) {
        draft_hidden_.resize(draft_hidden_.size() + static_cast<size_t>(n_rows) * feat_);
        gather_features(s.table.blocks(), s.draft_base + s.draft->context_length(), n_rows,
                        draft_hidden_.data() + j.hidden_at.back());
      }
      j.commits.push_back(c);
    }
    j.items.push_back({s.draft.get(), s.anchor, n, &s.req.sampling, &s.rng});
    j.owners.push_back(&s);
  };
  {
    // What each decoding request does this step: verify drafts proposed earlier (Ready),
    // verify without drafting (Plain, with its drafting choice), or draft (Draft: verified
    // now in sequence, or next step when the pass is prefetched).
    enum class Role { Ready, Plain, Draft };
    std::vector<Role> role(dec.size(), Role::Plain);
    std::vector<int> n_max(dec.size(), 0);
    size_t n_draft = 0;
    for (size_t r = 0; r < dec.size(); ++r) {
      Sequence* s = dec[r];
      if (s->draft && s->health.tick() == HealthEvent::Resumed)
        std::fprintf(stderr, "engine: request %llu: self-healing re-probe, drafting again\n",
                     static_cast<unsigned long long>(s->id));
      if (s->prop_ready) {
        role[r] = Role::Ready;
        continue;
      }
      s->prop = DraftProposal{};
      n_max[r] = std::min(max_drafts_, s->out->remaining() - 1);
      if (s->draft && n_max[r] > 0 && drafts[r] && s->health.drafting_allowed()) {
        role[r] = Role::Draft;
        ++n_draft;
      } else if (!s->lookup_tokens.empty()) {
        // Not drafting: its lookup proposal is verified, as far as the verify policy finds
        // the rows worth it.
        s->prop.tokens = s->lookup_tokens;
        s->prop.confidence = lookup_confidences(lookup_stats_, s->lookup_bucket, static_cast<int>(s->lookup_tokens.size()));
        s->prop_lookup = true;
      }
    }
    if (async) {
      // Two cohorts: the requests drafting now verify next step while the others verify
      // now. Requests new to drafting join the smaller cohort (the excess verify this step
      // without drafts and draft next step), so both threads keep work every step.
      for (size_t r = dec.size(); r-- > 0 && n_draft > dec.size() - n_draft + 1;)
        if (role[r] == Role::Draft) {
          role[r] = Role::Plain;
          --n_draft;
        }
    }
    for (size_t r = 0; r < dec.size(); ++r) {
      Sequence* s = dec[r];
      s->prop_drafted = role[r] == Role::Ready || (role[r] == Role::Draft && !async);
      if (role[r] == Role::Draft) add_to_draft_job(job, *s, n_max[r]);
      if (role[r] == Role::Draft && async) continue;  // verified next step
      ver.push_back(s);
      // A prefetched prop came from a drafting choice; with async prefetch a request verified
      // without drafts did not draft (every request may, so none was chosen out).
      track.push_back(!s->prop_lookup && (role[r] == Role::Ready || (!async && drafts[r])));
    }
  }
  if (features_)
    for (size_t i = 0; i < job.commits.size(); ++i) job.commits[i].hidden = draft_hidden_.data() + job.hidden_at[i];
  if (phases_) phases_->lap(2);
  if (async && !job.owners.empty()) {
    if (!draft_worker_) {
      const int t = opts_.async_draft_threads > 0 ? opts_.async_draft_threads : std::max(1, ThreadPool::global().size() / 2);
      draft_worker_ = std::make_unique<DraftWorker>(t);
    }
    draft_worker_->run([this, &job] { draft_pass(job); });
    obs.prefetched = static_cast<int>(job.owners.size());
  } else if (!job.owners.empty()) {
    draft_pass(job);
  }
  if (phases_) phases_->lap(3);
  // Async: the drafter pass runs until joined below (after the verify); every early return
  // joins it first, as it writes into sequences this step may otherwise free.
  struct JoinOnExit {
    DraftWorker* w;
    ~JoinOnExit() {
      if (w) try { w->wait(); } catch (...) {}
    }
  } join_on_exit{async && !job.owners.empty() ? draft_worker_.get() : nullptr};
  Survivals survivals(ver.size());
  ScheduleCaps caps;
  caps.max_batch_tokens = opts_.max_batch_tokens;
  for (size_t r = 0; r < ver.size(); ++r) {
    const DraftProposal& p = ver[r]->prop;
    // A prefetched prop may predate a lower max_reuse_depth (hot reload).
    int n = std::min(static_cast<int>(p.tokens.size()), max_drafts_);
    if (ver[r]->prop_lookup && n > 0) {
      // The lookup's survival per draft is learned (LookupStats), not a confidence head's:
      // the dspark policies weigh it like any survival; fixed verifies the drafts that
      // survive at least kLookupFloor of the time, threshold those above its threshold.
      constexpr float kLookupFloor = 0.25f;
      const std::vector<float>& a = ver[r]->lookup_survival;
      if (opts_.policy == VerifyPolicy::Fixed) {
        n = static_cast<int>(std::count_if(a.begin(), a.begin() + n, [](float x) { return x >= kLookupFloor; }));
      } else {
        survivals[r].assign(a.begin(), a.begin() + n);
        if (opts_.validation_threshold > 0.0f) n = static_threshold_length(survivals[r], opts_.validation_threshold, n);
      }
    } else if (opts_.policy != VerifyPolicy::Fixed && n > 0) {
      if (opts_.synthetic_acceptance_rate > 0.0) {  // benchmark mode: the true survival p^j
        survivals[r].resize(p.tokens.size());
        double a = 1.0;
        for (size_t j = 0; j < p.tokens.size(); ++j) survivals[r][j] = static_cast<float>(a *= opts_.synthetic_acceptance_rate);
      } else {
        survivals[r] = calibrated_survival(opts_.calibration ? *opts_.calibration : Calibration{}, p.confidence_logits);
      }
      if (opts_.validation_threshold > 0.0f) n = static_threshold_length(survivals[r], opts_.validation_threshold, n);
    }
    caps.per_request.push_back(RequestCaps{n, -1, -1});
  }
  ScheduleResult sched;
  if (opts_.policy == VerifyPolicy::DSpark) {
    // The step pays the drafter pass of its drafting requests, unless it was prefetched
    // (then it overlaps the forward and only verify rows cost).
    const int drafting = async ? 0 : static_cast<int>(job.owners.size());
    if (draft_cost_known() && drafting > 0) {
      auto it = drafting_sps_.find(drafting);
      if (it == drafting_sps_.end()) it = drafting_sps_.emplace(drafting, sps_with_drafting(*opts_.sps, draft_ms(drafting))).first;
      sched = schedule_greedy(survivals, it->second, caps);
    } else {
      sched = schedule_greedy(survivals, *opts_.sps, caps);
    }
  } else if (opts_.policy == VerifyPolicy::DSparkAsync) {
    // K from two steps earlier, top K by current survival. With a draft cost the curve is
    // the verify-only one: K trades verify rows only, the drafting choice already paid.
    if (!async_sched_) async_sched_ = std::make_unique<AsyncPrefixScheduler>(*opts_.sps);
    sched = async_sched_->step(survivals, caps);
  } else {
    sched = fixed_lengths(caps);
  }
  for (size_t r = 0; r < ver.size(); ++r) {
    DraftProposal& p = ver[r]->prop;
    const size_t n0 = p.tokens.size();
    const size_t n = static_cast<size_t>(sched.lengths[r]);
    if (track[r] && is_dspark_policy(opts_.policy)) {
      // What drafting this request bought this step: expected extra commits and verify rows.
      double g = 0;
      for (size_t j = 0; j < n && j < survivals[r].size(); ++j) g += survivals[r][j];
      // Smoothed over the request's drafting steps: a step's survivals say little about the
      // next one (each block starts somewhere else in the text).
      Sequence& q = *ver[r];
      if (q.last_gain > 1e29) {
        q.last_gain = g;
        q.last_len = static_cast<double>(n);
      } else {
        q.last_gain += kGainSmoothing * (g - q.last_gain);
        q.last_len += kGainSmoothing * (static_cast<double>(n) - q.last_len);
      }
      ++q.gain_steps;
      // The population's estimate of requests not measured yet: the plain mean of the first
      // kPopWindow measurements, then an exponential mean over about that many. (The first
      // measurement used to seed it with weight 1 and every later one move it by 5 %: one
      // low first block, a line start, then kept the whole batch from drafting. On the
      // H200 at concurrency 16 dspark ran either with ~10 of 16 requests drafting, 1.23-1.30x
      // plain, or with none, 0.97-1.02x, from run to run; docs/PERFORMANCE.md, session 20.)
      const double w = 1.0 / std::min(static_cast<double>(pop_measured_) + 1.0, kPopWindow);
      pop_gain_ += w * (g - pop_gain_);
      pop_len_ += w * (static_cast<double>(n) - pop_len_);
      ++pop_measured_;
    }
    if (opts_.on_rounds) proposed[ver[r]] = {p.tokens, p.confidence};
    keep_first_drafts(p, n);
    obs.drafted += static_cast<int>(n0);
    obs.verified += static_cast<int>(n);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.drafted_tokens += n0;
    stats_.verified_draft_tokens += n;
  }

  if (phases_) phases_->lap(4);
  // 4. One batch: verify blocks first (running requests keep their pace), then prefill
  // chunks in admission order within the remaining token budget.
  // Step buffers are members: their capacity (a prefill chunk's captured rows are
  // megabytes) carries over, instead of fresh heap pages faulted in and zeroed every step.
  ForwardBatch& batch = step_batch_;
  batch.entries.clear();
  batch.capture_layers = capture_;
  batch.capture_to_cache = device_features();
  std::vector<Sequence*> entry_seq;
  int budget = opts_.max_batch_tokens;
  for (Sequence* s : ver) {
    ForwardEntry e;
    e.slot = s->slot;
    e.tokens.push_back(s->anchor);
    e.tokens.insert(e.tokens.end(), s->prop.tokens.begin(), s->prop.tokens.end());
    for (int i = 0; i < static_cast<int>(e.tokens.size()); ++i) e.logit_rows.push_back(i);
    // KV slots for the block (make_room_for_decoding reserved them; a failure here would
    // only preempt the request). A shared partial last block is copied first (COW).
    const int start = s->table.length();
    const AppendResult ar = pool_->append(s->table, e.tokens);
    if (!ar.ok) {
      preempt(*s);
      continue;
    }
    if (ar.has_copy()) copy_block(ar.copy.src, ar.copy.dst, ar.copy.n_tokens);
    bind(*s, start);
    budget -= static_cast<int>(e.tokens.size());
    batch.entries.push_back(std::move(e));
    entry_seq.push_back(s);
  }
  // Prompt tokens this step: what the forward budget leaves, but no more than a plain step
  // would take (prefill_step_tokens less one row per decoding request): speculation's verify
  // rows must not buy prompts bigger chunks, which would lengthen every decoding request's
  // step (at concurrency 128 with nobody drafting, per-request decode ran at 0.8x plain).
  int prompt_budget = budget;
  if (opts_.prefill_step_tokens > 0)
    prompt_budget = std::min(budget, std::max(opts_.prefill_step_tokens - static_cast<int>(dec.size()), kMinPromptTokens));
  for (auto& sp : running_) {
    Sequence* s = sp.get();
    if (s->decoding || prompt_budget <= 0) continue;
    const int left = static_cast<int>(s->context.size()) - s->prefilled;
    const int chunk = std::min(left, prompt_budget);
    ForwardEntry e;
    e.slot = s->slot;
    e.tokens.assign(s->context.begin() + s->prefilled, s->context.begin() + s->prefilled + chunk);
    // The last row's logits give the first token; a resumed request already has its anchor.
    if (chunk == left && !s->resumed) e.logit_rows.push_back(chunk - 1);
    bind(*s, s->prefilled);  // its blocks were reserved at admission
    prompt_budget -= chunk;
    batch.entries.push_back(std::move(e));
    entry_seq.push_back(s);
  }

  // The drafter's layer captures cost a few percent of a large batch's forward. Skipped
  // when nobody in the batch can draft any more, and when the running load has closed
  // drafting for kRetireAfterClosedSteps steps, net (no number of drafting requests could pay
  // at this concurrency with three quarters of every block accepted; `retire`): then every request
  // in the batch is retired from drafting (its context would lack these rows; re-armed from
  // a later position once the load reopens), and the blocks written are marked, so a later
  // request reusing them from the prefix cache starts retired. Requests admitted once the
  // load opens again draft as usual.
  bool capture_now = !capture_.empty() && !retire;
  if (capture_now && skip_captures_) {
    capture_now = false;
    for (const Sequence* s : entry_seq) capture_now = capture_now || s->draft != nullptr;
  }
  if (!capture_now && !capture_.empty()) {
    batch.capture_layers.clear();
    batch.capture_to_cache = false;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.capture_skipped_steps++;
    for (Sequence* s : entry_seq)
      if (s->draft) {
        s->draft.reset();
        s->pending_tokens.clear();
        stats_.drafting_retired++;
      }
  }

  // 5. One forward.
  // (With async prefetch a step may hold no verify entry and no prefill: it only drafts.)
  if (phases_) phases_->lap(5);
  const auto forward_start = std::chrono::steady_clock::now();
  ForwardOutput& out = step_out_;
  // A model that reduces on the device (the CUDA one) returns only the argmax ids when every
  // request of the batch is greedy: greedy verification needs nothing else (spec/verify.h:
  // accept while the draft is the argmax, then the argmax of the next row), and a step of
  // many verify rows would otherwise copy vocabulary-wide logit rows to the host.
  bool ids_only = model_.on_device();
  for (size_t i = 0; ids_only && i < entry_seq.size(); ++i) ids_only = entry_seq[i]->req.sampling.greedy();
  std::vector<int32_t>& row_ids = step_ids_;
  // A model that also samples on the device (the CUDA one, model/device_verify.h) verifies a
  // step with sampled requests there: only (accepted, next token) per request come back,
  // with each request's Rng advanced as verify_drafts would have. Synthetic acceptance draws
  // its accept count first (the same Rng order as below), then samples from that row.
  DeviceVerifier* dv = ids_only ? nullptr : device_verifier_;
  std::vector<VerifyRequest> vreqs;
  std::vector<int> entry_req(batch.entries.size(), -1), syn_accepted(batch.entries.size(), 0);
  if (dv) {
    for (size_t i = 0; i < batch.entries.size(); ++i) {
      const ForwardEntry& e = batch.entries[i];
      Sequence& s = *entry_seq[i];
      if (e.logit_rows.empty()) continue;
      VerifyRequest r;
      r.entry = static_cast<int>(i);
      r.params = s.req.sampling;
      r.rng = &s.rng;
      if (s.decoding) {
        if (opts_.synthetic_acceptance_rate > 0.0) {
          int a = 0;
          while (a < static_cast<int>(s.prop.tokens.size()) && s.rng.uniform() < opts_.synthetic_acceptance_rate) ++a;
          syn_accepted[i] = a;
          r.first_row = a;
        } else {
          r.drafts = s.prop.tokens.data();
          r.n_drafts = static_cast<int>(s.prop.tokens.size());
          r.q = s.prop.q.empty() ? nullptr : s.prop.q.data();
        }
      }
      entry_req[i] = static_cast<int>(vreqs.size());
      vreqs.push_back(r);
    }
  }
  if (!batch.entries.empty()) {
    try {
      if (ids_only) model_.forward_argmax(*kv_, batch, out, row_ids);
      else if (dv) dv->forward_verify(*kv_, batch, out, vreqs);
      else model_.forward(*kv_, batch, out);
    } catch (const Error& err) {
      for (Sequence* s : entry_seq) finish(*s, "error", err.what());
      return true;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps++;
    if (!batch.entries.empty()) stats_.forwards++;
    stats_.forward_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_start).count();
  }
  if (phases_) phases_->lap(6);

  // 6. Per request: verify / finish prefill, roll back, emit.
  size_t logit_row = 0, token_row = 0;
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const ForwardEntry& e = batch.entries[i];
    Sequence& s = *entry_seq[i];
    const float* logits = ids_only || dv ? nullptr : out.logits.data() + logit_row * static_cast<size_t>(V);
    const int32_t* ids = ids_only ? row_ids.data() + logit_row : nullptr;  // argmax of each logit row
    const VerifyRequest* vr = entry_req[i] >= 0 ? &vreqs[static_cast<size_t>(entry_req[i])] : nullptr;
    const float* hidden =
        features_ && capture_now ? out.captured.data() + token_row * static_cast<size_t>(feat_) : nullptr;
    const int n_tok = static_cast<int>(e.tokens.size());
    logit_row += e.logit_rows.size();
    token_row += static_cast<size_t>(n_tok);
    store_features(paged_->blocks(s.slot), kv_->length(s.slot) - n_tok, n_tok, hidden);
    if (!uncaptured_.empty()) {
      // A block's feature rows are whole when every row since its first was captured.
      const std::span<const int32_t> blocks = paged_->blocks(s.slot);
      const int bs = pool_->block_size(), first = kv_->length(s.slot) - n_tok;
      for (int p = first; p < first + n_tok; ++p) {
        uint8_t& u = uncaptured_[static_cast<size_t>(blocks[static_cast<size_t>(p / bs)])];
        if (!capture_now) u = 1;
        else if (p % bs == 0) u = 0;
      }
    }
    if (s.decoding) {
      const int start = kv_->length(s.slot) - n_tok;
      VerifyResult v;
      if (vr) {  // verified on the device (above)
        v.accepted = opts_.synthetic_acceptance_rate > 0.0 ? syn_accepted[i] : vr->accepted;
        v.next_token = vr->next_token;
      } else if (opts_.synthetic_acceptance_rate > 0.0) {
        // Benchmark mode: each draft survives with the synthetic rate; the bonus token is the
        // target's own choice after the accepted prefix.
        v.accepted = 0;
        while (v.accepted < static_cast<int>(s.prop.tokens.size()) && s.rng.uniform() < opts_.synthetic_acceptance_rate)
          ++v.accepted;
        v.next_token = ids ? ids[v.accepted]
                           : verify_drafts(logits + static_cast<size_t>(v.accepted) * V, V, {}, {}, s.req.sampling, s.rng)
                                 .next_token;
      } else if (ids) {
        // Greedy verification from the rows' argmax ids (the same rule as verify_drafts).
        v.accepted = 0;
        while (v.accepted < static_cast<int>(s.prop.tokens.size()) && s.prop.tokens[v.accepted] == ids[v.accepted])
          ++v.accepted;
        v.next_token = ids[v.accepted];
      } else {
        v = verify_drafts(logits, V, s.prop.tokens, s.prop.q, s.req.sampling, s.rng);
      }
      if (!s.prop.tokens.empty() && !s.prop_lookup &&
          s.health.observe(static_cast<int>(s.prop.tokens.size()), v.accepted) == HealthEvent::FellBack) {
        std::fprintf(stderr, "engine: request %llu: self-healing: %d rounds without an accepted draft, plain decoding for a while (fallback %llu)\n",
                     static_cast<unsigned long long>(s.id), opts_.health.collapse_rounds,
                     static_cast<unsigned long long>(s.health.fallbacks()));
        std::lock_guard<std::mutex> lock(mu_);
        stats_.self_heal_fallbacks++;
      }
      s.prop_ready = false;
      kv_->truncate(s.slot, start + v.accepted + 1);
      // Rejected drafts leave the table; anchor + accepted drafts are committed, so their
      // full blocks become prefix-cache entries.
      pool_->truncate(s.table, start + v.accepted + 1);
      pool_->commit(s.table, start + v.accepted + 1);
      SpecRound r;
      r.draft_ids = s.prop.tokens;
      r.accepted = v.accepted;
      std::vector<int32_t> toks(s.prop.tokens.begin(), s.prop.tokens.begin() + v.accepted);
      toks.push_back(v.next_token);
      if (s.draft) {  // appended: a step that skipped drafting did not flush the previous ones
        s.pending_tokens.push_back(s.anchor);
        s.pending_tokens.insert(s.pending_tokens.end(), toks.begin(), toks.end() - 1);
      }
      if (s.lookup) {  // the committed positions: the anchor and the accepted drafts
        committed_.assign(1, s.anchor);
        committed_.insert(committed_.end(), toks.begin(), toks.end() - 1);
        s.lookup->commit(committed_.data(), static_cast<int>(committed_.size()), lookup_stats_);
      }
      if (s.prop_drafted) {
        s.yield.observe(v.accepted + 1, n_tok);
        pop_yield_.observe(v.accepted + 1, n_tok);
      }
      r.lookup = s.prop_lookup;
      s.anchor = v.next_token;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.accepted_draft_tokens += static_cast<uint64_t>(v.accepted);
        stats_.verify_entries++;
        if (s.prop_lookup) stats_.lookup_rounds++;
      }
      obs.decoding++;
      obs.verified_per_request.push_back(static_cast<int>(s.prop.tokens.size()));
      obs.accepted_per_request.push_back(v.accepted);
      r.index = s.spec.rounds;
      if (opts_.on_rounds) {
        r.start = start;
        r.anchor = e.tokens[0];
        r.confidences = s.prop.confidence;
        r.verify_len = n_tok;
        r.next_token = v.next_token;
        r.tokens = toks;
      }
      // The round joins the request's statistics before the tokens go out: the last one
      // may finish the request, whose final event carries the statistics.
      emit_tokens(s, toks, &r);
      if (opts_.on_rounds) {
        EngineRound er;
        er.request_id = s.id;
        er.log_id = s.req.log_id;
        er.step = step_clock_;
        auto it = proposed.find(&s);
        if (it != proposed.end()) {
          er.drafted_ids = std::move(it->second.first);
          er.drafted_confidences = std::move(it->second.second);
        }
        r.drafted = static_cast<int>(er.drafted_ids.size());
        er.round = r;
        rounds.push_back(std::move(er));
      }
    } else {
      obs.prefill_tokens += n_tok;
      if (s.draft) {
        s.pending_tokens.insert(s.pending_tokens.end(), e.tokens.begin(), e.tokens.end());
      }
      if (s.lookup) s.lookup->commit(e.tokens.data(), n_tok, lookup_stats_);
      s.prefilled += n_tok;
      pool_->commit(s.table, s.prefilled);
      if (s.prefilled == static_cast<int>(s.context.size()) && s.resumed) {
        s.decoding = true;  // recomputed after a preemption: continue from the same anchor
      } else if (!e.logit_rows.empty()) {  // the prompt is complete: its last row gives the first token
        {
          std::lock_guard<std::mutex> lock(mu_);
          stats_.prompt_tokens += s.req.prompt.size();
        }
        s.anchor = ids  ? ids[0]
                   : vr ? vr->next_token
                        : verify_drafts(logits, V, {}, {}, s.req.sampling, s.rng).next_token;
        s.decoding = true;
        emit_tokens(s, {s.anchor});
      }
    }
  }
  if (phases_) phases_->lap(7);
  if (join_on_exit.w) {
    // The prefetched drafts are ready for the next step (a drafter error ends the step
    // with the exception, as it would in sequence).
    join_on_exit.w = nullptr;
    draft_worker_->wait();
    for (Sequence* s : job.owners) s->prop_ready = true;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prefetch_passes++;
  }
  drop_finished(running_);
  int64_t stored = 0;
  for (const auto& s : running_) stored += kv_->length(s->slot);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = static_cast<int>(running_.size());
    stats_.waiting = static_cast<int>(waiting_.size() + inbox_.size());
    stats_.kv_blocks_used = static_cast<int>(pool_->stats().used);
    stats_.kv_tokens_stored = stored;
    stats_.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
  }
  if (phases_) phases_->lap(8);
  if (opts_.on_step) {
    obs.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    opts_.on_step(obs);
  }
  if (opts_.on_rounds && !rounds.empty()) {
    const auto now = std::chrono::steady_clock::now();
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    for (EngineRound& er : rounds) {
      er.batch = static_cast<int>(rounds.size());
      er.round.draft_ms = ms(draft_start, forward_start);
      er.round.verify_ms = ms(forward_start, now);
      er.step_ms = ms(step_start, now);
    }
    opts_.on_rounds(rounds);
  }
  return true;
}

void LLMEngine::run_until_idle() {
  while (step()) {
  }
}

void LLMEngine::start() {
  if (loop_.joinable()) return;
  stop_ = false;
  loop_ = std::thread([this] {
    while (!stop_) {
      try {
        if (step()) continue;
      } catch (const std::exception& e) {
        fail_in_flight(e.what());
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
    }
  });
}

void LLMEngine::fail_in_flight(const std::string& why) {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  std::fprintf(stderr, "engine: a step failed (%s); the requests in flight end with an error\n", why.c_str());
  take_inbox();
  for (auto* list : {&waiting_, &running_}) {
    for (auto& s : *list)
      if (!s->finished) finish(*s, "error", "engine step failed: " + why);
    list->clear();
  }
}

void LLMEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

std::vector<CachedPrefix> LLMEngine::largest_cached_prefixes(int k) const { return pool_->largest_cached_prefixes(k); }

std::string LLMEngine::check_kv_invariants() {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  std::vector<const BlockTable*> tables;
  for (const auto* list : {&waiting_, &running_})
    for (const auto& s : *list)
      if (s->table.admitted()) tables.push_back(&s->table);
  return pool_->check_invariants(tables);
}

EngineStats LLMEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.draft_seconds = draft_seconds_;
  s.kv_pool = pool_->stats();  // the pool has its own locks
  return s;
}

}  // namespace dsinfer
