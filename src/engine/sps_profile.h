// dsinfer engine: measures the SPS(B) curve the DSpark prefix scheduler needs (steps per
// second of one speculative step whose verify forward holds B tokens) for the loaded target
// + drafter on this machine, and caches it on disk.
//
// Data flow: profile_sps builds a deterministic dummy context of `context` tokens, prefills it
// (capturing the drafter's layers), commits it to a draft sequence, then times
//   t_draft   = one drafter proposal of the full block at that context (fastest of reps)
//   t_verify(B) = one target forward of B tokens appended at that context, logits for every
//                 row (a model on a device: their argmax ids, forward_argmax, as the engine's
//                 greedy steps), the drafter's layers captured, rolled back after (fastest of reps,
//                 the points interleaved, then made non-decreasing in B by pooling)
// for B = 1..max_batch_tokens, and returns SPS(B) = 1 / (t_draft + t_verify(B)): at batch 1
// the draft runs before every verify whatever length the scheduler picks, so it belongs to
// the step. Without a drafter t_draft = 0.
// load_or_profile_sps keeps the table in a JSON cache (prefix_scheduler.h's format) keyed by a
// hash of the target + drafter checkpoints and a machine string (CPU model, ISA, threads,
// profiled context), re-profiling when either changes.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "spec/prefix_scheduler.h"

namespace dsinfer {

class Model;
class Drafter;

struct SpsProfileOptions {
  int max_batch_tokens = 9;  // B = 1..this (block + anchor at batch 1)
  std::vector<int> points;   // instead: exactly these B (increasing), e.g. powers of two
  int context = 512;         // committed positions before the timed step
  int repeats = 7;           // timed repetitions per point (fastest kept), after one warm-up
  bool include_draft = true; // add t_draft to every point (batch 1: one draft per step)
};

// draft_ms (optional): the measured t_draft (0 without a drafter).
SpsTable profile_sps(Model& target, const Drafter* drafter, const SpsProfileOptions& opts = {},
                     double* draft_ms = nullptr);

// Isotonic regression (pool adjacent violators): the non-decreasing sequence closest to y
// in least squares. Used on measured t_verify(B), which physically cannot fall as B grows.
std::vector<double> monotone_nondecreasing(const std::vector<double>& y);

// SPS(B) of a batched step whose drafter pass costs draft_ms in all and that verifies B
// tokens: 1 / (draft_ms + t_verify(B)), from a verify-only table.
SpsTable sps_with_drafting(const SpsTable& verify_only, double draft_ms);

// t_draft(k): one batched drafter pass (propose_batch) over k requests, in ms. A batched pass
// reads the drafter's weights once, so where a single pass is bound by reading them (a GPU,
// a large drafter) k requests cost far less than k single passes; where it is bound by
// arithmetic it is nearly linear (the embedded DSpark drafter on one Zen 5 core: k = 1, 2, 4
// took 0.70, 1.13, 2.24 ms). Measured, not assumed: linear between measured k, and past the
// last one with the last segment's per-request slope; below the first, proportional to it.
class DraftCostTable {
 public:
  DraftCostTable() = default;
  // Points (k, ms) with k >= 1 strictly increasing and ms > 0; Error otherwise.
  explicit DraftCostTable(std::vector<std::pair<int, double>> points);
  bool empty() const { return points_.empty(); }
  double ms(int k) const;  // 0 for k <= 0
  const std::vector<std::pair<int, double>>& points() const { return points_; }
  // Committing context rows to the drafter (context projection + K/V of every draft layer):
  // a request that drafts after `rows` steps without drafting (or for the first time, with
  // its whole prompt pending) pays rows x this before its block. 0 = not measured.
  void set_commit_ms_per_row(double ms);
  double commit_ms_per_row() const { return commit_ms_per_row_; }
  double commit_ms(int rows) const { return rows > 0 ? rows * commit_ms_per_row_ : 0.0; }

 private:
  std::vector<std::pair<int, double>> points_;
  double commit_ms_per_row_ = 0.0;
};

// Times propose_batch of full blocks over k sequences (each with `context` committed rows of
// a deterministic dummy context) for every k in `batches` (increasing), fastest of
// `repeats` after a warm-up, the points interleaved and made non-decreasing in k; and the
// commit of `context` rows into a fresh sequence (commit_ms_per_row, fastest of `repeats`).
DraftCostTable profile_draft_cost(Model& target, const Drafter& drafter, const std::vector<int>& batches,
                                  int context = 512, int repeats = 3);
// The k profiled for an engine of max_running requests: 1, 2, 4, ... up to
// min(max_running, 64) (past that the per-request slope is extrapolated).
std::vector<int> draft_cost_batches(int max_running);
// "k=1 0.78 ms, k=4 1.30 ms, ...; commit 5.1 us/row" for start-up logs.
std::string draft_cost_summary(const DraftCostTable& t);
// "1: 0.241, 4: 0.339, ...": the verify ms per step, 1000 / SPS(B), at each profiled B.
std::string sps_curve_summary(const SpsTable& t);

// The default cache file for a target/drafter pair: $DSINFER_CACHE_DIR, else
// $XDG_CACHE_HOME/dsinfer, else $HOME/.cache/dsinfer, + "/sps-<hash>.json". Returns "" when
// no directory can be determined (then nothing is cached).
std::string default_sps_cache_path(const std::string& model_hash);

// Identity strings for the cache (see SpsTable::model_hash / machine). The machine string
// also names the running build (sps_build_identity): a profile measured by an older build
// prices verify rows and drafter passes with that build's kernels, so an upgrade re-profiles.
std::string sps_model_hash(const std::string& target_dir, const std::string& draft_dir);
std::string sps_machine_string(int threads, const SpsProfileOptions& opts);
// "build <bytes>-<mtime ns>" of the running executable (/proc/self/exe), "build unknown"
// where that cannot be read.
std::string sps_build_identity();

// Reads the cache at `path` when it matches, else profiles and (best effort) writes it.
// `profiled` reports which happened. path == "" profiles without caching.
SpsTable load_or_profile_sps(Model& target, const Drafter* drafter, const std::string& model_hash,
                             const std::string& machine, const std::string& path, const SpsProfileOptions& opts,
                             bool* profiled = nullptr);

}  // namespace dsinfer
