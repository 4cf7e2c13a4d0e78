// dsinfer engine: the in-process batched engine — many requests at once, continuous
// batching, speculative decoding per request inside one shared target forward.
//
// Data flow of one step() (nano-vllm's shape: engine -> scheduler -> model runner):
//   1. inbox: submitted requests join the waiting queue, cancellations end requests at once
//      (their KV slot and drafter state freed before anything else runs);
//   2. admission: waiting requests (priority, then arrival order) take free KV slots;
//   3. drafting: every running request past its prefill flushes its committed context to
//      its drafter and proposes up to max drafts after its anchor; the verify policy
//      (fixed / threshold / dspark prefix scheduler over all requests) keeps a prefix;
//   4. batch: one ForwardBatch with a decode/verify entry [anchor, drafts] per running
//      request (logits for every row) and prefill chunks of prompts filling the rest of
//      the per-step token budget (chunked prefill; logits for a prompt's last row only);
//   5. one Model::forward (batch-invariant: every row's bits are what it would get alone);
//   6. per request: the lossless verify rule accepts a prefix and adds one token; the
//      slot's KV is rolled back to anchor + accepted; ids go through the request's
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
#include <vector>

#include "engine/output_stream.h"
#include "engine/speculative.h"
#include "sampling/sampler.h"

namespace dsinfer {

class Model;
class KVCache;
class Tokenizer;
class Drafter;
struct Calibration;
class SpsTable;

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
};

enum class VerifyPolicy { Fixed, Threshold, DSpark };

struct EngineOptions {
  int max_running = 16;            // concurrent requests (KV slots)
  int max_model_len = 4096;        // prompt + generated tokens per request
  int max_batch_tokens = 512;      // tokens per forward (prefill chunks + verify blocks)
  const Drafter* drafter = nullptr;  // null: plain decoding
  int max_draft_tokens = -1;       // cap on drafts per round (-1: the drafter's)
  VerifyPolicy policy = VerifyPolicy::Fixed;
  float validation_threshold = 0.0f;      // Threshold policy (and a floor under DSpark)
  const Calibration* calibration = nullptr;
  const SpsTable* sps = nullptr;          // DSpark policy: SPS(B) over the step's batch tokens
  // DSpark policy: when > 0, `sps` is a verify-only curve and each step's curve becomes
  // 1 / (R * draft_ms_per_request + t_verify(B)) for its R drafting requests.
  double draft_ms_per_request = 0.0;
  const Tokenizer* tokenizer = nullptr;   // for text and stop strings (may be null)
};

struct EngineStats {
  uint64_t steps = 0, forwards = 0;
  uint64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  uint64_t drafted_tokens = 0, verified_draft_tokens = 0, accepted_draft_tokens = 0;
  uint64_t verify_entries = 0;  // request-steps past prefill (one verify block each)
  int running = 0, waiting = 0;
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

 private:
  struct Sequence;
  void take_inbox();
  void admit();
  void finish(Sequence& s, const std::string& reason, const std::string& error = {});
  void emit_tokens(Sequence& s, const std::vector<int32_t>& ids);
  // Which decoding requests get a drafter pass this step (see llm_engine.cpp).
  std::vector<bool> choose_drafting(const std::vector<Sequence*>& dec);

  Model& model_;
  EngineOptions opts_;
  std::unique_ptr<KVCache> kv_;
  std::vector<int> free_slots_;
  std::vector<int> capture_;
  int feat_ = 0, max_drafts_ = 0;

  mutable std::mutex mu_;  // inbox, cancellations, stats snapshot
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  EngineStats stats_;

  std::mutex step_mu_;  // one step at a time
  std::vector<std::unique_ptr<Sequence>> waiting_, running_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
};

}  // namespace dsinfer
