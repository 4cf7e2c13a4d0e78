// dsinfer speculation floor: how many drafts of each request one verify step checks — the
// DSpark Hardware-Aware Prefix Scheduler (drafters_spec.md §4; DSpark paper §3.2.2
// Algorithm 1, §5.2, Appendix A) and the simpler `--spec-schedule` policies.
//
// Data flow (one verify step of a batch of R requests; the engine drives it, never here):
//   per request r: drafts d_1..d_n proposed → calibrated prefix survival a_{r,1..γ_r}
//   (spec/calibration.h calibrated_survival: a_{r,j} = ∏_{i≤j} c_{r,i}, non-increasing)
//   + SpsTable (engine steps/second of a target forward holding B tokens, profiled at
//     start-up, cached on disk as JSON keyed by model hash + machine fingerprint)
//   + ScheduleCaps (per request: drafts proposed, max depth, remaining tokens; global
//     batch-token cap)
//   → one policy → ScheduleResult: ℓ_r drafts to verify per request (0..γ_r), with the
//     batch B = Σ(1 + ℓ_r), expected commits τ = Σ(1 + Σ_{j≤ℓ_r} a_{r,j}), Θ = τ·SPS(B)
//   → the engine verifies [anchor, d_1..d_{ℓ_r}] for each r.
//
// Policies (one function each):
//   fixed        fixed_lengths        every proposed draft (subject to caps)
//   threshold    threshold_lengths    drafts while a_{r,j} >= τ (static_threshold_length)
//   dspark       schedule_greedy      Algorithm 1: greedy admission with early stop
//   dspark-async AsyncPrefixScheduler top-K by current a, K = budget_global(survivals of
//                                     two steps earlier); schedule_topk does the top-K.
//
// Every policy admits a prefix of one global candidate order: (r, j) sorted by a_{r,j}
// descending, ties by j ascending then r ascending. Because a_{r,j} is non-increasing in j,
// (r, j) always comes after (r, j−1), and whether draft k of request r is admitted depends
// only on candidates ranked before (r, k) — never on a_{r,k+1..}, which depend on the
// realisation of d_k. That is the non-anticipation that keeps verification lossless.
// Pure computation on small vectors (no model, no threads, no clock).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dsinfer {

// ---- SPS table --------------------------------------------------------------------------

// One measured point: a target forward holding `batch_tokens` tokens runs `sps` steps/s.
struct SpsPoint {
  int batch_tokens = 0;
  double sps = 0.0;
};

// Largest batch-token count a table may cover (the lookup is a dense array up to it).
constexpr int kMaxSpsBatchTokens = 1 << 20;

// Engine steps per second as a function of batch tokens B. Built from measured points
// (B strictly increasing, >= 1; sps finite > 0). Lookup is O(1) from a dense array over
// [1, last B]. Between two points the *step time* 1/SPS is interpolated linearly — step
// time, not SPS, because a forward's latency is close to affine in B inside one kernel
// regime, so a curve SPS(B) = 1/(c + d·B) is reproduced exactly from any two of its points;
// either way the interpolant is monotone between neighbouring points. Outside the measured
// range the value is clamped: B below the first point gets SPS(first), B above the last
// gets SPS(last) (the engine should cap batches at max_batch_tokens()).
class SpsTable {
 public:
  SpsTable() = default;  // empty: sps() returns 0, the policies refuse it
  // Throws Error ("sps table: points[i]: ...") when the points are invalid.
  explicit SpsTable(std::vector<SpsPoint> points, std::string model_hash = {}, std::string machine = {});

  double sps(int batch_tokens) const {
    if (dense_.empty()) return 0.0;
    if (batch_tokens < 1) batch_tokens = 1;
    if (batch_tokens >= static_cast<int>(dense_.size())) return dense_.back();
    return dense_[static_cast<size_t>(batch_tokens)];
  }
  bool empty() const { return points_.empty(); }
  int max_batch_tokens() const { return points_.empty() ? 0 : points_.back().batch_tokens; }
  const std::vector<SpsPoint>& points() const { return points_; }
  // Identity of what was profiled, so a cached table is only reused for the same model on
  // the same machine. Opaque strings chosen by the engine; may be empty (unknown).
  const std::string& model_hash() const { return model_hash_; }
  const std::string& machine() const { return machine_; }

 private:
  std::vector<SpsPoint> points_;
  std::vector<double> dense_;  // dense_[B] for B in [0, last B]; dense_[0] = dense_[1]
  std::string model_hash_, machine_;
};

// JSON (version 1), pretty-printed with a trailing newline:
//   {"version": 1, "kind": "dsinfer-sps-table", "model_hash": "...", "machine": "...",
//    "points": [{"batch_tokens": 1, "sps": 52.1}, ...]}
std::string sps_table_to_json(const SpsTable& t);
// Strict parse; `file` names the source in the one-line Error ("FILE: field 'points[2].sps':
// ..."). Unknown top-level keys are ignored (forward compatibility); point objects must
// hold exactly batch_tokens and sps.
SpsTable parse_sps_table(const std::string& text, const std::string& file);
void write_sps_table(const std::string& path, const SpsTable& t);  // throws Error naming path
SpsTable read_sps_table(const std::string& path);                  // throws Error
// The start-up cache: nullopt when `path` does not exist or was profiled for another
// model_hash / machine (the engine then re-profiles and overwrites it); throws Error when
// the file exists but is malformed.
std::optional<SpsTable> load_sps_cache(const std::string& path, const std::string& model_hash,
                                       const std::string& machine);

// ---- scheduling -------------------------------------------------------------------------

// survivals[r] = a_{r,1..γ_r} (index j−1 holds a_{r,j}); γ_r may differ per request and may
// be 0. Values are sanitised before use: NaN → 0, clamped to [0, 1], and replaced by the
// running minimum so the sequence is non-increasing (each a'_{r,j} depends only on
// a_{r,1..j}, so the sanitising keeps non-anticipation).
using Survivals = std::vector<std::vector<float>>;

// Per-request limits; a negative value means "no limit". The effective cap on ℓ_r is
// min(γ_r, proposed, max_depth, remaining_tokens − 1), floored at 0.
struct RequestCaps {
  int proposed = -1;          // drafts actually proposed this step
  int max_depth = -1;         // configured max verify depth (e.g. --block-size, reuse depth)
  int remaining_tokens = -1;  // tokens the request may still emit; a step commits <= ℓ+1
};

struct ScheduleCaps {
  std::vector<RequestCaps> per_request;  // empty = no per-request caps, else exactly R entries
  // Global cap on B = Σ(1 + ℓ_r) (< 0: none). Anchors are never dropped: when R alone
  // reaches the cap every ℓ_r is 0 and B = R.
  int max_batch_tokens = -1;
};

struct ScheduleResult {
  std::vector<int> lengths;      // ℓ_r per request
  int draft_tokens = 0;          // K = Σ ℓ_r
  int batch_tokens = 0;          // B = R + K
  double expected_tokens = 0.0;  // τ = R + Σ_r Σ_{j≤ℓ_r} a'_{r,j}
  double throughput = 0.0;       // Θ = τ·SPS(B); 0 for the policies that take no table
  bool fallback = false;         // AsyncPrefixScheduler only: this step used schedule_greedy
};

// `dspark`: Algorithm 1 exactly. Candidates (r, j) with a'_{r,j} > 0 and j <= cap_r in the
// global order; start ℓ = 0, B = R, τ = R, Θ_best = R·SPS(R); admit in order (B += 1,
// τ += a), Θ = τ·SPS(B); keep when Θ > Θ_best (strict), else stop. Admission also stops
// before B would exceed max_batch_tokens. R = 0 gives an empty result with Θ = 0.
// Throws Error when caps.per_request has the wrong size or the table is empty.
ScheduleResult schedule_greedy(const Survivals& survivals, const SpsTable& sps, const ScheduleCaps& caps = {});

// The unconstrained global search over the same admission path (no early stop): the
// prefix of K candidates maximising Θ (ties → smallest K), K in [0, path length]. Equals
// the optimum of Θ over all prefix-respecting allocations within the caps (for a fixed B
// the best τ takes the highest a's). NOT non-anticipating on current survivals — only for
// survivals from two steps earlier (AsyncPrefixScheduler). result.draft_tokens is K.
ScheduleResult budget_global(const Survivals& survivals, const SpsTable& sps, const ScheduleCaps& caps = {});

// Top-K: the first K candidates (a' > 0, within caps) of the global order; fewer when the
// candidates or max_batch_tokens run out. K < 0 is treated as 0. throughput is filled
// only when `sps` is given.
ScheduleResult schedule_topk(const Survivals& survivals, int k, const ScheduleCaps& caps = {},
                             const SpsTable* sps = nullptr);

// `threshold`: per request static_threshold_length(a_r, τ, cap_r) (the first j with
// a_{r,j} < τ, NaN below; τ <= 0 keeps every draft, zero-survival ones included), then, if
// B would exceed max_batch_tokens, only the first admissible drafts of the global order.
ScheduleResult threshold_lengths(const Survivals& survivals, float threshold, const ScheduleCaps& caps = {});

// `fixed`: every proposed draft, ℓ_r = cap_r. R = caps.per_request.size() and every
// per_request[r].proposed must be >= 0 (throws Error otherwise). Under max_batch_tokens the
// drafts are shared breadth-first (all first drafts, then all second drafts, ...; the
// global order with every a = 1). expected_tokens and throughput are 0 (no survivals).
ScheduleResult fixed_lengths(const ScheduleCaps& caps);

// `dspark-async` (paper §5.2): the batch budget K for step t is fixed from the survivals
// of step t−2 with budget_global, so the next step's batch size is known before the
// current step ends (CUDA-graph replay / zero-overhead scheduling); step t then admits the
// top-K of its *current* survivals. K depends only on step t−2's information, so it is
// independent of step t's draft realisations, and top-K with a fixed K is
// non-anticipating. Steps 0 and 1 have no history: they fall back to schedule_greedy,
// which is itself lossless (result.fallback = true). K is a token count carried across
// steps even when requests join or leave; a stale K only costs throughput, never
// losslessness.
class AsyncPrefixScheduler {
 public:
  explicit AsyncPrefixScheduler(SpsTable sps) : sps_(std::move(sps)) {}

  // Schedules the current step and records its survivals/caps for step + 2. A step whose
  // survivals hold no draft at all records no budget (step + 2 falls back to greedy). The
  // budget K from step − 2 is scaled by how many requests have drafts now against then
  // (rounded to the nearest token).
  ScheduleResult step(const Survivals& survivals, const ScheduleCaps& caps = {});
  // K from two steps back, as recorded (nullopt: the next step falls back to
  // schedule_greedy); step() scales it by the requests with drafts.
  std::optional<int> upcoming_budget() const;
  int64_t steps() const { return steps_; }
  // Forgets the history (e.g. after the batch is drained); the next two steps fall back.
  void reset();
  const SpsTable& table() const { return sps_; }

 private:
  SpsTable sps_;
  int64_t steps_ = 0;
  // With t the next step to run: next_budget_ = K_t (from step t−2's survivals),
  // after_next_budget_ = K_{t+1} (from step t−1's). Computing K as soon as a step's
  // survivals are known is what the pipelined engine does in the background.
  std::optional<int> next_budget_, after_next_budget_;
  // How many requests had drafts in the step each budget came from: step() scales K by the
  // requests with drafts now against then (the engine's drafting choice changes that set
  // from step to step; a K from one drafting request spread over seven starved them all,
  // and the gains they measured then kept the batch from drafting).
  int next_drafting_ = 0, after_next_drafting_ = 0;
};

}  // namespace dsinfer
