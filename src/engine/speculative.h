// dsinfer engine: the speculative round driver for one sequence. generate() (generator.h)
// runs every request through it; plain decoding is speculation with no drafter, so there
// is one decode loop.
//
// Data flow of one sequence:
//   prefill: prompt -> Model::forward (logits of the last row, capturing the drafter's
//     target_layer_ids for every prompt position) -> verify rule with no drafts (= plain
//     sampling) -> first token, which becomes the anchor. The prompt ids + captured rows
//     are queued for the drafter's commit_context.
//   round (max_new = tokens the caller may still emit, >= 1):
//     1. flush the queued commit_context (prompt, or last round's anchor + accepted drafts);
//     2. propose n <= min(max drafts, max reuse depth, max_new - 1) drafts after the anchor;
//        keep the prefix the validation threshold and/or the DSpark scheduler choose (both
//        read only confidences of earlier drafts: non-anticipating, so still lossless);
//     3. one Model::forward over [anchor, d_1..d_n] at positions start..start+n, logits for
//        all n+1 rows, capturing the same layers;
//     4. verify_drafts (spec/verify.h) -> acc accepted drafts + next token (correction or
//        bonus);
//     5. truncate the target KV to start + acc + 1 (anchor + accepted drafts; the next
//        token is not in the cache, it is the next round's anchor);
//     6. queue commit_context(anchor + accepted drafts, their captured rows).
//   The round returns the tokens to emit (accepted drafts, then the next token, at most
//   max_new); the caller applies stop ids / stop strings token by token.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "sampling/sampler.h"
#include "spec/drafter.h"
#include "spec/lookup_assist.h"
#include "spec/verify.h"

namespace dsinfer {

class KVCache;
class Model;
struct Calibration;
class SpsTable;

// What happened in one round (also what --log-dflash-details writes, one JSON line each).
struct SpecRound {
  int index = 0;             // 0-based round number
  int start = 0;             // absolute position of the anchor
  int32_t anchor = 0;
  std::vector<int32_t> draft_ids;
  std::vector<float> confidences;  // drafter confidence per draft (empty without a head)
  int drafted = 0;           // drafts the drafter returned (before threshold pruning)
  int verify_len = 0;        // tokens in the verify forward: 1 + drafts
  int accepted = 0;          // accepted drafts
  int32_t next_token = 0;    // correction or bonus
  std::vector<int32_t> tokens;  // accepted drafts + next token
  int committed = 0;         // tokens actually emitted (fewer when a stop cut the round)
  double draft_ms = 0.0;     // commit_context + propose
  double verify_ms = 0.0;    // verify forward + verification rule + KV truncation
  bool lookup = false;       // the drafts came from the lookup assist (no drafter pass)
};

// One JSON object (no newline) for a round: index, start, anchor, draft_ids, confidences,
// verify_len, accepted, next_token, committed, draft_ms, verify_ms, source ("drafter",
// "lookup"; "none" for plain decoding).
std::string spec_round_json(const SpecRound& r);

struct SpecStats {
  int rounds = 0;
  int64_t committed = 0;  // tokens emitted by rounds (the prefill's first token excluded)
  // Per draft position k (index k-1): rounds that proposed >= k drafts / accepted >= k.
  std::vector<int64_t> proposed, accepted;
  double draft_ms = 0.0, verify_ms = 0.0;
  int lookup_rounds = 0;  // rounds that verified lookup-assist drafts
  // Mean committed tokens per round, bonus included (1.0 for plain decoding).
  double tau() const { return rounds ? static_cast<double>(committed) / rounds : 0.0; }
  void add(const SpecRound& r);
};

struct SpecOptions {
  const Drafter* drafter = nullptr;  // null: plain decoding (every round verifies the anchor only)
  int max_draft_tokens = -1;         // cap on drafts per round; -1: drafter->info().max_draft_tokens
  int max_reuse_depth = -1;          // --dflash-max-reuse-depth: further cap; -1: unset
  // --dflash-validation-threshold: verify only the drafts whose prefix survival probability
  // â_k = prod_{i<=k} sigmoid(z_i / T_i) stays >= the threshold (0 = off). T_i come from
  // `calibration` (calibration.json, STS) or are 1 without one. Non-anticipating: whether
  // d_k is verified depends on z_1..z_k only, which depend on d_1..d_{k-1}; lossless.
  float validation_threshold = 0.0f;
  const Calibration* calibration = nullptr;
  // --spec-schedule dspark: the DSpark hardware-aware prefix scheduler (prefix_scheduler.h,
  // Algorithm 1 with R = 1) picks how many of the (threshold-pruned) drafts to verify so
  // that expected committed tokens × SPS(1 + ℓ) is maximal. SPS comes from sps_profile.h.
  // Needs a drafter with a confidence head; null: verify every (remaining) draft.
  const SpsTable* sps = nullptr;
  // --spec-lookup: in each round the lookup assist (spec/lookup_assist.h) proposes the
  // continuation of the longest earlier occurrence of the current suffix; when its expected
  // tokens per millisecond (learned from how far its proposals matched what was committed)
  // beat the drafter's measured yield, it is verified instead and the drafter pass is
  // skipped (its context commit waits for its next pass). Needs a model drafter (dflash,
  // dspark). Output is unchanged: only the proposal differs.
  bool lookup_assist = false;
  LookupAssistOptions lookup;
  std::function<void(const SpecRound&)> on_round;  // called after each round is emitted
};

// Checks that the loaded drafter's kind fits the requested --spec method: "dflash" takes
// the z-lab and DeepSpec DFlash kinds, "dspark" the DSpark kind, "ngram" the n-gram
// drafter. Throws Error naming both otherwise.
void check_drafter_kind(const std::string& method, const DrafterInfo& info);

// --block-size N for a loaded DFlash/DSpark drafter: 1 <= N <= info.block_size, else Error.
// Returns the drafts per round such a block holds: info.max_draft_tokens - (block_size - N),
// i.e. N - 1 for z-lab DFlash (the anchor takes one slot) and N for DeepSpec drafters.
int drafts_for_block_size(const DrafterInfo& info, int block_size);

class SpecDecoder {
 public:
  // capacity: KV positions to reserve (prompt + max new tokens); the largest verify block
  // is added on top.
  SpecDecoder(Model& model, const SamplingParams& params, const SpecOptions& opts, int capacity);
  ~SpecDecoder();

  // Runs the prefill and returns the first generated token (the first anchor). With a
  // drafter this includes the drafter's own prefill: the prompt's captured target rows are
  // committed to it here (its context rows, sized once for `capacity` positions), as the
  // target's KV is, so decoding rounds only commit what they accept.
  int32_t prefill(const std::vector<int32_t>& prompt);
  // Runs one round; max_new >= 1. The returned record's `tokens` has 1..max_new entries.
  SpecRound& round(int max_new);

  int max_drafts() const { return max_drafts_; }
  int32_t anchor() const { return anchor_; }
  KVCache& kv() { return *kv_; }  // target cache (tests compare it with a fresh prefill)
  Rng& rng() { return rng_; }

 private:
  void flush_commit();
  // The verify forward over batch_-like `batch` (one entry, logit rows 0..drafts.size()) and
  // verify_drafts on its rows; on a model that verifies on its device
  // (model/device_verify.h: the CUDA one) both run there and only ids come back.
  VerifyResult forward_verify(const ForwardBatch& batch, ForwardOutput& out, const std::vector<int32_t>& drafts,
                              const std::vector<float>& q);

  Model& model_;
  SamplingParams params_;
  SpecOptions opts_;
  int max_drafts_ = 0;
  std::unique_ptr<KVCache> kv_;
  std::unique_ptr<DraftSequence> seq_;
  Rng rng_;
  int32_t anchor_ = 0;
  int rounds_ = 0;
  int capacity_ = 0;  // prompt + max new tokens
  std::vector<int> capture_;
  int feat_ = 0;  // captured floats per position
  std::vector<int32_t> pending_tokens_;
  std::vector<float> pending_hidden_;
  SpecRound rec_;
  // Lookup assist (opts_.lookup_assist): this sequence's history, what its proposals scored,
  // and the measured costs and drafter yield it is weighed against.
  std::unique_ptr<LookupTracker> lookup_;
  LookupStats lookup_stats_;
  RoundCosts costs_;
  // The drafter's yield overall and by the match-length bucket of the lookup proposal it
  // was weighed against (last slot: no proposal): the drafter mostly runs where lookups are
  // weak, so its overall yield understates it where they are strong; a bucket's own yield is
  // used once it has a few rounds.
  DrafterYield yield_;
  std::array<DrafterYield, LookupStats::kBuckets + 1> yield_by_match_;
  // Kept across rounds: a verify step's logits (up to (block + 1) x vocab floats) and captured
  // rows are reused instead of allocated and zero-filled every round.
  ForwardBatch batch_;
  ForwardOutput out_;
};

}  // namespace dsinfer
