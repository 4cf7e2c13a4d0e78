// dsinfer harness: `dsinfer tune` — replay recorded traffic over a grid of speculation and
// cache settings, with repeated trials and bootstrap confidence intervals, and name the best
// configuration as a ready `dsinfer serve` command line.
//
// Data flow: --requests LOG (a `serve --record-requests` log, or any --dataset file) -->
// Workload; the grid (flags or defaults) --plan_grid--> configurations, one-at-a-time around
// the baseline (each parameter varied alone; the full product with --full-grid), grouped so
// that configurations needing the same server run together. Runtime-changeable settings
// (validation threshold, max reuse depth, schedule policy, drafter window, admission
// policy) are applied with POST /api/v1/config/dflash; the restart-only one (shard count)
// needs our own server (--model-path), restarted per group. Each configuration: `trials`
// closed-loop replays of the log --> pooled request latencies (bootstrap CI of P50 and P99)
// and per-trial output tokens/s (bootstrap CI of the mean) --> ranking by --objective.
// A server that refuses a setting (HTTP 400, or a serve flag it rejects) marks that
// configuration "refused" with the server's reason. Nothing starts after the budget's end.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/http_client.h"
#include "harness/stats.h"
#include "harness/workloads.h"

namespace dsinfer::harness {

// One grid point; a negative number / empty string = the server's default (not passed).
struct TuneConfig {
  int window_size = -1;               // runtime
  double validation_threshold = -1;   // runtime
  int max_reuse_depth = -1;           // runtime
  std::string schedule_policy;        // runtime
  std::string admission_policy;       // runtime
  int shard_count = -1;               // restart

  std::string label() const;
  // The part that needs a restart, as serve flags (grouping key).
  std::vector<std::string> restart_flags() const;
  // The runtime part as a POST /api/v1/config/dflash body ({} when none).
  nlohmann::json runtime_patch() const;
  // Every setting as serve flags.
  std::vector<std::string> serve_flags() const;
};

struct TuneGrid {
  std::vector<int> window_sizes = {128, 256};  // a running server can shrink its drafter window, not grow it
  std::vector<double> thresholds = {0.5, 0.75};
  std::vector<int> reuse_depths = {2, 4};  // the drafter's full block is the baseline
  std::vector<std::string> schedule_policies = {"fixed", "threshold", "dspark"};
  std::vector<std::string> admission_policies = {"fcfs", "hit-rate", "latency-aware", "hybrid"};
  std::vector<int> shard_counts = {1, 8};
  bool full = false;                  // full product instead of one-at-a-time
};

struct TuneOptions {
  Workload workload;
  bool have_url = false;
  BaseUrl url;                        // tune a running server (runtime settings only)
  std::string model_path, draft_model_path;  // our own server (all settings); "" = embedded set
  std::vector<std::string> serve_args;
  std::string api_key;
  TuneGrid grid;
  std::string objective = "latency";  // latency (P50 e2e) | p99 (P99 e2e) | throughput
  int trials = 3;
  int concurrency = 0;                // 0: the log's recorded peak concurrency
  int max_requests = 24;              // per trial (the first N of the log)
  int max_tokens = 0;                 // > 0: overrides the log's
  double budget_s = 600;
  std::string out_dir;
  uint64_t seed = 1;
  bool progress = true;
};

struct ConfigResult {
  TuneConfig config;
  std::string status = "not run";     // ok | refused: ... | failed: ... | not run (budget)
  int trials = 0;
  std::vector<double> e2e_s;          // pooled over trials, completed requests
  std::vector<double> trial_tps;      // output tokens/s per trial
  int failed_requests = 0;
  Interval p50, p99, tps;
  double objective_value = 0;         // what the ranking sorts by
  bool distinguishable = true;        // false: its CI overlaps the best one's
};

struct TuneReport {
  std::vector<ConfigResult> results;  // ranked: ok first by objective, then the rest
  std::string objective;
  std::string best_command;           // "" when nothing ran
  double elapsed_s = 0, budget_s = 0;
  int concurrency = 0, requests_per_trial = 0;
  nlohmann::json meta = nlohmann::json::object();
};

std::vector<TuneConfig> plan_grid(const TuneGrid& g, bool restart_allowed);

// Throws Error for bad options (objective, trials, no url and no model).
TuneReport run_tune(const TuneOptions& o);

std::string tune_markdown(const TuneReport& r);
nlohmann::json tune_json(const TuneReport& r);

}  // namespace dsinfer::harness
