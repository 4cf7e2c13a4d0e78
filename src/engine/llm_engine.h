// dsinfer engine: the in-process batched engine — many requests at once, continuous
// batching, speculative decoding per request inside one shared target forward.
//
// Data flow of one step() (nano-vllm's shape: engine -> scheduler -> model runner):
//   1. inbox: submitted requests join the waiting queue, cancellations end requests at once
//      (their KV blocks and drafter state freed before anything else runs);
//   2. admission: waiting requests (priority then arrival, or the --dspark-scheduler-policy
//      order) take free slots while the paged KV pool can hold their prompts (cached prefix
//      blocks are shared, not recomputed); then, while the running decoders' next verify
//      blocks do not fit, the lowest-priority, latest running request is preempted (blocks
//      freed, requeued, recomputed later from prompt + emitted tokens);
//   3. drafting: every running request past its prefill flushes its committed context to
//      its drafter and proposes up to max drafts after its anchor; the verify policy
//      (fixed / threshold / dspark prefix scheduler over all requests) keeps a prefix;
//   4. batch: one ForwardBatch with a decode/verify entry [anchor, drafts] per running
//      request (logits for every row) and prefill chunks of prompts filling the rest of
//      the per-step token budget (chunked prefill; logits for a prompt's last row only);
//      the drafter's layer captures ride along unless the decode load alone has closed
//      drafting for 32 steps in a row (no drafting could pay at this concurrency: then
//      every request in the batch is retired from drafting) or nobody in the batch can
//      still draft;
//   5. one Model::forward (batch-invariant: every row's bits are what it would get alone);
//   6. per request: the lossless verify rule accepts a prefix and adds one token; the
//      table is rolled back to anchor + accepted and committed (full blocks become prefix-
//      cache entries); ids go through the request's
//      OutputStream (stop ids, stop strings, max tokens) and out through its callback.
// Greedy outputs are therefore exactly those of single-request plain greedy decoding,
// whatever the load, the schedule or the speculation method.
//
// Threads: submit()/cancel() may be called from any thread; step() runs on one thread at a
// time (run_until_idle(), or the background loop started by start()). Callbacks run on the
// stepping thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/block_pool.h"
#include "engine/output_stream.h"
#include "engine/spec_health.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/sps_profile.h"
#include "sampling/sampler.h"

namespace dsinfer {

class DeviceVerifier;  // model/device_verify.h

class Model;
class KVCache;
class BlockKVCache;
class Tokenizer;
class Drafter;
struct Calibration;
class SpsTable;
class AsyncPrefixScheduler;
class DraftWorker;

// What a request's callback receives: newly final tokens/text, then one event with
// finished = true (finish_reason "stop" | "length" | "cancelled" | "error").
struct RequestEvent {
  uint64_t id = 0;
  std::vector<int32_t> new_ids;
  std::string new_text;
  bool finished = false;
  std::string finish_reason;
  std::string error;  // finish_reason == "error": one line
  // Set on the final event.
  int prompt_tokens = 0, completion_tokens = 0;
  SpecStats spec;
};
using RequestCallback = std::function<void(const RequestEvent&)>;

struct EngineRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopConditions stop;
  int priority = 0;  // higher runs first; equal priorities in arrival order
  RequestCallback on_event;
  std::string log_id;  // opaque label echoed in EngineRound::log_id (the server: its response id)
};

// DSparkAsync: the production variant (paper §5.2) — the step's verify budget K comes from
// the survivals of two steps earlier (budget_global), the drafts admitted are the top K by
// current survival (AsyncPrefixScheduler in spec/prefix_scheduler.h).
enum class VerifyPolicy { Fixed, Threshold, DSpark, DSparkAsync };
inline bool is_dspark_policy(VerifyPolicy p) { return p == VerifyPolicy::DSpark || p == VerifyPolicy::DSparkAsync; }

// Speculation settings that may change while the engine runs (the server's
// POST /api/v1/config/dflash). set_runtime_config() validates and queues them; the next
// step() takes them before drafting, so one step never mixes two settings.
struct EngineRuntimeConfig {
  VerifyPolicy policy = VerifyPolicy::Fixed;
  float validation_threshold = 0.0f;  // Threshold policy; a floor under DSpark; 0 = off
  int max_reuse_depth = -1;           // cap on drafts verified per round; -1: the drafter's block
  // Drafter context window of every request (Drafter::set_window; 0: the drafter's configured
  // one). The dynamic window (--dspark-dsw-*), when on, takes precedence.
  int window_size = 0;
  // Admission order of waiting requests (--dspark-scheduler-policy).
  SchedulerPolicy scheduler_policy = SchedulerPolicy::Fcfs;
  // --dflash-enable-async-prefetch: draft one cohort while the target verifies the other
  // (EngineOptions::async_prefetch). Needs a drafter.
  bool async_prefetch = false;
};

// What one step did (EngineOptions::on_step, called on the stepping thread after the
// step's tokens were emitted). Per decoding request (same order in both vectors): drafts
// verified and drafts accepted this step.
struct StepObservation {
  int decoding = 0;                 // requests with a verify entry this step
  int prefill_tokens = 0;           // prompt tokens in this step's forward
  int drafted = 0;                  // drafts proposed (before the verify policy)
  int verified = 0;                 // drafts verified: the step's verify budget
  int prefetched = 0;               // async prefetch: requests drafted during the forward
  std::vector<int> verified_per_request, accepted_per_request;
  double seconds = 0.0;             // wall time of the step
};

// One speculative round of one request in one step (EngineOptions::on_rounds; what
// `serve --log-dflash-details` writes). `round` has generate's SpecRound fields: index (the
// request's round number), start, anchor, draft_ids / confidences (the drafts verified, after
// the verify policy), drafted (drafts proposed), verify_len (1 + verified drafts), accepted,
// next_token, tokens, committed (fewer than accepted + 1 when a stop cut the round). The
// engine drafts and verifies every request in one batch, so the timings are the step's,
// shared by all its rounds: draft_ms = start of drafting to the forward (drafter pass, verify
// policy, batch assembly), verify_ms = forward + verification + emission.
struct EngineRound {
  uint64_t request_id = 0;          // LLMEngine::submit's id
  std::string log_id;               // EngineRequest::log_id
  uint64_t step = 0;                // step() calls so far (the engine's step clock)
  int batch = 0;                    // requests verified in this step
  std::vector<int32_t> drafted_ids;  // every draft proposed, before the verify policy
  std::vector<float> drafted_confidences;  // their confidences (empty without a confidence head)
  SpecRound round;
  double step_ms = 0.0;             // wall time of the step
};

struct EngineOptions {
  int max_running = 16;            // concurrent requests (KV slots)
  int max_model_len = 4096;        // prompt + generated tokens per request
  int max_batch_tokens = 512;      // tokens per forward (prefill chunks + verify blocks)
  // When > 0: a step's prompt tokens + one row per decoding request stay within this (and
  // within max_batch_tokens; at least 64 prompt tokens when prompts wait), so a speculative
  // engine, whose max_batch_tokens also holds verify blocks, prefills in the chunks a plain
  // one would. 0: prompts take whatever max_batch_tokens leaves.
  int prefill_step_tokens = 0;
  const Drafter* drafter = nullptr;  // null: plain decoding
  int max_draft_tokens = -1;       // cap on drafts per round (-1: the drafter's)
  VerifyPolicy policy = VerifyPolicy::Fixed;
  float validation_threshold = 0.0f;      // Threshold policy (and a floor under DSpark)
  const Calibration* calibration = nullptr;
  const SpsTable* sps = nullptr;          // DSpark policy: SPS(B) over the step's batch tokens
  // DSpark policy: with a draft cost, `sps` is a verify-only curve and each step's curve
  // becomes 1 / (t_draft(R) + t_verify(B)) for its R drafting requests. t_draft(R) is
  // draft_cost.ms(R) when that table is given (profile_draft_cost: a batched pass reads the
  // drafter's weights once, so R requests cost far less than R passes), else
  // R * draft_ms_per_request.
  double draft_ms_per_request = 0.0;
  DraftCostTable draft_cost;
  const Tokenizer* tokenizer = nullptr;   // for text and stop strings (may be null)
  std::function<void(const StepObservation&)> on_step;  // optional per-step observer
  // Optional per-round observer: the step's rounds (one per decoding request), called on the
  // stepping thread after the step's tokens were emitted (after on_step). Off: no cost.
  std::function<void(const std::vector<EngineRound>&)> on_rounds;

  // Paged KV cache (engine/block_pool.h + the storage Model::make_paged_kv_cache makes,
  // model/block_kv_cache.h). Pool size: kv_num_blocks when > 0; else, when kv_budget_bytes
  // > 0, cache_prealloc_ratio (--cache-prealloc-ratio) of the model's free device memory
  // when its pool lives on a device (Model::device_kv_blocks), otherwise
  // blocks_for_budget(kv_budget_bytes, cache_prealloc_ratio); else max_running full-length
  // requests (the dense cache's memory). Requests that do not fit wait (admission control); a
  // running request that cannot grow preempts the lowest-priority, latest one.
  int kv_block_size = 16;                 // --kv-block-size: tokens per block
  int64_t kv_num_blocks = 0;
  uint64_t kv_budget_bytes = 0;           // memory for K/V (after the weights)
  double cache_prealloc_ratio = 1.0;      // share of kv_budget_bytes taken at start-up
  int shard_count = 8;                    // --dspark-shard-count
  bool enable_cache_defrag = false;       // --enable-cache-defrag: compact the pool when idle
  // --cache-warmup-file: prompts prefilled at start-up so their full blocks are cached.
  std::vector<std::vector<int32_t>> cache_warmup_prompts;
  // --dspark-scheduler-policy: admission order of waiting requests (engine/scheduler.h);
  // the score policies age waiting requests by 1 per scheduler_aging_steps steps waited.
  SchedulerPolicy scheduler_policy = SchedulerPolicy::Fcfs;
  int scheduler_aging_steps = 64;
  // Per-request self-healing (fall back to plain decoding after collapse_rounds rounds
  // without an accepted draft, re-probe later) and the dynamic drafter window
  // (--dspark-dsw-min-window / --dspark-dsw-max-window), engine/spec_health.h.
  SpecHealthOptions health;
  // BENCHMARK ONLY (--synthetic-acceptance-rate): when in (0, 1], verification accepts each
  // draft with this probability (the accepted drafts are emitted as they are) and the
  // drafter's confidences are replaced by it, so scheduling can be measured on random-weight
  // models whose drafts would never be accepted. Output is NOT the target's: the server
  // refuses it. < 0: off.
  double synthetic_acceptance_rate = -1.0;
  // --dflash-enable-async-prefetch: drafting overlaps verification. Decoding requests
  // alternate between two cohorts: in each step the target verifies one cohort's drafts
  // (proposed during the previous step) while a DraftWorker thread with its own kernel
  // pool of async_draft_threads threads (0: half the global pool, at least 1) runs the
  // drafter pass for the other cohort. Each request then verifies every other step, and a
  // step costs max(verify, draft) instead of their sum where the two passes really run in
  // parallel (free cores or memory bandwidth); output is lossless either way. Also
  // switchable at run time (EngineRuntimeConfig::async_prefetch).
  bool async_prefetch = false;
  int async_draft_threads = 0;
  // --spec-lookup: per request, a suffix lookup over its prompt and output
  // (spec/lookup_assist.h) proposes drafts for free; a request whose lookup is expected to
  // yield about what its drafter pass would (relative to that pass's cost) verifies the
  // lookup instead of drafting, and a request left out of drafting verifies its lookup
  // when the verify policy finds it worth the rows. Needs a model drafter; off with async
  // prefetch and in synthetic-acceptance mode. Lossless: only the proposals change.
  bool lookup_assist = false;
  LookupAssistOptions lookup;
};

struct EngineStats {
  uint64_t steps = 0, forwards = 0;
  uint64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  uint64_t drafted_tokens = 0, verified_draft_tokens = 0, accepted_draft_tokens = 0;
  uint64_t verify_entries = 0;  // request-steps past prefill (one verify block each)
  int running = 0, waiting = 0;
  // Prompt tokens whose KV came from the prefix cache instead of a prefill (counted at
  // each request's first admission; re-admissions after a preemption are not counted).
  uint64_t prompt_tokens_cached = 0;
  // KV memory after the last step: the paged pool's blocks of kv_block_tokens positions.
  // used = held by request tables; token slots reserved = used blocks x kv_block_tokens;
  // stored = positions holding K/V of running requests.
  int kv_blocks_total = 0, kv_blocks_used = 0, kv_block_tokens = 0;
  int64_t kv_tokens_stored = 0;
  // The paged pool after the last step (blocks per shard, used / free / cached, hit ratio
  // = cached prompt tokens / admitted prompt tokens, fragmentation = reserved-but-empty
  // slots / slots of used blocks, evictions, copies on write). Preemptions: running
  // requests sent back to the queue for lack of blocks (recomputed later, streamed tokens
  // kept). Defrags: idle compactions run, blocks they moved. Warm-up: prompts prefilled
  // into the prefix cache at start-up.
  PoolStats kv_pool;
  uint64_t preemptions = 0, cache_defrags = 0, defrag_moves = 0;
  uint64_t self_heal_fallbacks = 0;  // requests routed to plain decoding by SpecHealth
  uint64_t prefetch_passes = 0;      // async prefetch: drafter passes overlapped with a forward
  uint64_t lookup_rounds = 0;        // verify blocks whose drafts came from the lookup assist
  int warmup_prompts = 0;
  // Where the steps' wall time went (seconds, summed over steps that did work): the whole
  // step, the drafter passes (context commit + propose; with async prefetch they overlap the
  // forward) and the target forward. The rest is the engine's own host work (scheduling,
  // drafting choice, verification, KV bookkeeping, streaming).
  double step_seconds = 0, draft_seconds = 0, forward_seconds = 0;
  // The dspark drafting choice (choose_drafting): steps it decided, of which steps where no
  // number of drafting requests could pay at that load (nobody drafts or probes), requests
  // it chose by estimated gain, and re-probes.
  uint64_t choice_steps = 0, choice_closed = 0, choice_chosen = 0, choice_probes = 0;
  // Forwards run without the drafter's layer captures (the running load closed for 32
  // steps, net, or no request in the batch that can still draft); requests whose drafting
  // ended because rows of their context were computed without captures (in such a step, or
  // reused from the prefix cache after one); and such requests re-armed with a fresh drafter
  // context from their current position once the load had reopened.
  uint64_t capture_skipped_steps = 0, drafting_retired = 0, drafting_rearmed = 0;
};

class LLMEngine {
 public:
  LLMEngine(Model& model, const EngineOptions& opts);
  ~LLMEngine();  // stops the background loop; unfinished requests end as "cancelled"

  // Validates the request (one-line Error naming the parameter) and queues it.
  uint64_t submit(EngineRequest req);
  // Ends the request at the next step boundary ("cancelled"); unknown/finished ids: no-op.
  void cancel(uint64_t id);

  // One scheduling step; returns false when there was nothing to do.
  bool step();
  void run_until_idle();
  // Background stepping thread (idle: blocks on a condition variable, no spinning).
  void start();
  void stop();

  EngineStats stats() const;
  const EngineOptions& options() const { return opts_; }
  // BlockPool::check_invariants over every request's block table ("" when all hold): for
  // tests and debugging (takes the step lock).
  std::string check_kv_invariants();
  // The k longest prefixes held by the prefix cache (BlockPool::largest_cached_prefixes;
  // safe from any thread: it takes every shard lock), for /api/v1/cache/stats.
  std::vector<CachedPrefix> largest_cached_prefixes(int k) const;

  // The speculation settings in force (or queued), and a change for the next step.
  // set_runtime_config throws Error naming the field (and changes nothing) when invalid.
  EngineRuntimeConfig runtime_config() const;
  void set_runtime_config(const EngineRuntimeConfig& c);

 private:
  struct Sequence;
  void take_inbox();
  void admit();
  // Blocks the running decoders need for next step's verify blocks (copy-on-write included).
  int64_t decode_reserve() const;
  // Preempts the lowest-priority, latest running requests until `need` more blocks fit.
  void make_room_for_decoding();
  void preempt(Sequence& s);
  // Binds the sequence's slot in the paged cache to its table, `length` positions held.
  void bind(Sequence& s, int length);
  // t_draft(k) of a drafter pass over k requests (EngineOptions::draft_cost, else k x
  // draft_ms_per_request); known when either is given.
  double draft_ms(int k) const {
    return opts_.draft_cost.empty() ? k * opts_.draft_ms_per_request : opts_.draft_cost.ms(k);
  }
  bool draft_cost_known() const { return !opts_.draft_cost.empty() || opts_.draft_ms_per_request > 0.0; }
  // What committing `rows` pending context rows costs before a request's block (0 when the
  // table has no commit time).
  double commit_ms(size_t rows) const { return opts_.draft_cost.commit_ms(static_cast<int>(rows)); }
  // Copies the drafter's captured rows of a forward into the per-block feature store
  // (nothing when the rows stay in the model's pool: device_features()).
  void store_features(std::span<const int32_t> blocks, int start, int n, const float* hidden);
  // Positions [start, start + n) of a block table from the feature store into dst, [n][feat_].
  void gather_features(std::span<const int32_t> blocks, int start, int n, float* dst) const;
  void warm_up();
  void defrag_if_idle();
  void finish(Sequence& s, const std::string& reason, const std::string& error = {});
  // The background loop's answer to a step that threw outside the forward (whose errors
  // end only the batch's requests): every request in flight ends with "error" and the
  // message, and the engine takes new requests; the process and the server stay up.
  void fail_in_flight(const std::string& why);
  // Pushes ids through the request's OutputStream and out through its callback (finishing
  // it when the stream ends). A verify round is first added to the request's statistics,
  // with the tokens the stream took as committed.
  void emit_tokens(Sequence& s, const std::vector<int32_t>& ids, SpecRound* round = nullptr);
  // Which of the candidates (decoding requests that may draft) get a drafter pass this step
  // (see llm_engine.cpp). base_rows / base_tokens: what the step verifies and is expected to
  // commit whatever is drafted (every decoding request's anchor, and the lookup-assist
  // proposals of the requests that took them), so drafting is priced at the step's real size.
  // Whether some number of drafting requests could pay at this load with every draft
  // accepted (full_block), with three quarters of each block by a margin (most_block: else
  // the load is closed: nobody drafts, and a closed running load retires the batch from
  // drafting, LLMEngine::step) and with half of each block (half_block).
  struct LoadPayoff {
    bool full_block = false, most_block = false, half_block = false;
  };
  // load: the step's (load_payoff over every decoding request).
  std::vector<bool> choose_drafting(const std::vector<Sequence*>& dec, int base_rows, double base_tokens,
                                    const LoadPayoff& load);
  LoadPayoff load_payoff(int R, int base_rows, double base_tokens);
  // One batched drafter pass: commits the owners' pending context rows, proposes their
  // drafts into Sequence::prop. Touches only the owners' drafter state, so it may run on
  // the DraftWorker while the stepping thread verifies other requests.
  struct DraftJob;
  void draft_pass(DraftJob& job) const;

  Model& model_;
  EngineOptions opts_;
  std::unique_ptr<BlockKVCache> kv_;  // made by the model (host or device memory)
  BlockKVCache* paged_ = nullptr;      // kv_ (one name for the block-table calls)
  std::unique_ptr<BlockPool> pool_;    // declared before the sequences: their tables die first
  // Drafter features (captured target rows) per cached position, [block][block_size][feat_],
  // so a prefix served from the cache still gives the drafter its context rows. The only
  // copy: a drafter pass gathers a request's pending rows from here (gather_features), so
  // requests that do not draft (most of them under load) cost no second copy.
  // Rows are BF16 (rounded as matmul rounds activations: kv_round_bf16) when
  // features_bf16_, else F32.
  // With device_features() there is no host store: the model's paged pool keeps the rows
  // beside the K/V (BlockKVCache::feature_floats, written by forwards with
  // capture_to_cache) and the drafter reads them there (ContextBatchItem's cache source),
  // so they never cross to the host (a GPU target with the GPU drafter).
  std::unique_ptr<std::byte[]> features_;
  bool features_bf16_ = false;
  // Captured rows kept in the model's pool (a drafter that captures, and no host store).
  bool device_features() const { return feat_ && !features_; }
  // Positions [0, n_tokens) of block src -> dst: K/V (and feature rows) in the model's
  // storage, and the host feature store's rows when the engine keeps them.
  void copy_block(int32_t src, int32_t dst, int n_tokens);
  size_t feature_row_bytes() const { return static_cast<size_t>(feat_) * (features_bf16_ ? 2 : 4); }
  // Position p of a block table in the feature store.
  std::byte* feature_row(std::span<const int32_t> blocks, int p) const {
    const int bs = pool_->block_size();
    return features_.get() + (static_cast<size_t>(blocks[static_cast<size_t>(p / bs)]) * bs + p % bs) * feature_row_bytes();
  }
  // This step's drafter pass: the pending rows of its drafting requests, gathered.
  std::vector<float> draft_hidden_;
  ForwardBatch step_batch_;  // step()'s forward, reused
  std::vector<int32_t> step_ids_;  // step()'s argmax ids when the model reduces on the device
  std::vector<int32_t> committed_;  // a verify round's committed positions, for the lookup
  // The model's DeviceVerifier (model/device_verify.h) when it samples on its device: looked
  // up once here, not per step.
  DeviceVerifier* device_verifier_ = nullptr;
  ForwardOutput step_out_;
  int max_seq_tokens_ = 0;             // positions one request may hold (+ a verify block)
  bool defrag_due_ = false;            // something ran since the last idle compaction
  uint64_t step_clock_ = 0;            // step() calls so far (waiting-time unit of the scheduler)
  std::vector<int> free_slots_;
  std::vector<int> capture_;
  int feat_ = 0, max_drafts_ = 0;
  int block_max_drafts_ = 0;          // max_drafts_ before any runtime max_reuse_depth
  EngineRuntimeConfig runtime_;       // guarded by mu_; latest accepted settings
  bool runtime_pending_ = false;      // guarded by mu_; runtime_ not yet applied by step()
  int window_size_ = 0;               // runtime_.window_size as applied (stepping thread)
  std::unique_ptr<AsyncPrefixScheduler> async_sched_;  // DSparkAsync: its two-step budget history
  bool async_prefetch_ = false;       // runtime_.async_prefetch as applied (stepping thread)
  // choose_drafting: the running mean of measured gains / verify lengths (the estimate of
  // requests not measured yet), how many were measured, its calls and the call of the last
  // re-probe (all reset when the engine goes idle).
  double pop_gain_ = 0.0, pop_len_ = 0.0;
  uint64_t pop_measured_ = 0;
  // Lookup assist: how far proposals survived per match length (shared by all requests: a
  // property of the model and workload), and the population's drafter yield (tokens
  // committed per drafter round), the prior of requests not measured yet.
  LookupStats lookup_stats_;
  DrafterYield pop_yield_;
  uint64_t choice_clock_ = 0, last_probe_ = 0;
  // load_payoff's last two results, by (R, rows, tokens, max drafts).
  struct PayoffMemo {
    std::tuple<int, int, double, int> key{-1, -1, 0.0, -1};
    LoadPayoff payoff;
  };
  PayoffMemo payoff_memo_[2];
  int payoff_next_ = 0;
  int closed_streak_ = 0;  // closed steps of the running load, net (see step())
  // The dspark scheduler's curve with k requests' drafter pass added (sps_with_drafting),
  // per k: building it (a dense table over every batch size profiled, 1152 on the H200) was
  // most of the 8-10 us the scheduler took per step.
  std::map<int, SpsTable> drafting_sps_;
  // DSINFER_ENGINE_SKIP_CAPTURES=0 (an A/B switch): capture on every step, retire nobody.
  bool skip_captures_ = true;
  double open_margin_ = 1.0;  // kOpenMargin, or DSINFER_ENGINE_OPEN_MARGIN (set in the constructor)
  // Per block id: some row of the block was computed without the drafter's captures since
  // its first row was last written with them, so its feature rows are not the target's. A
  // request that reuses such a block from the prefix cache starts retired from drafting.
  std::vector<uint8_t> uncaptured_;
  // Re-probe back-off: the gap is multiplied by probe_backoff_, which doubles (up to 16) at
  // each probe when nobody was chosen on merit since the previous one, and returns to 1 when
  // someone is.
  uint64_t probe_backoff_ = 1;
  bool chosen_since_probe_ = false;
  std::unique_ptr<DraftWorker> draft_worker_;  // async prefetch: the drafter's thread (lazy)

  mutable std::mutex mu_;  // inbox, cancellations, stats snapshot
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  EngineStats stats_;
  mutable double draft_seconds_ = 0;  // EngineStats::draft_seconds, added by the const draft_pass (under mu_)

  // DSINFER_ENGINE_PHASES=1 (a diagnostic): host time per phase of step(), printed to stderr
  // when the engine is destroyed (llm_engine.cpp, PhaseClock).
  struct PhaseClock;
  std::unique_ptr<PhaseClock> phases_;

  std::mutex step_mu_;  // one step at a time
  std::vector<std::unique_ptr<Sequence>> waiting_, running_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
};

}  // namespace dsinfer
