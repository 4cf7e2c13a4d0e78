// dsinfer CLI: `dsinfer tune --requests LOG (--url URL | --model-path DIR) --budget MIN
// --objective latency|throughput|p99` — replays recorded traffic over a settings grid
// (harness/tuner.h), writes tune.md / tune.json / tune.html and prints the ranked table and
// the `dsinfer serve` command line of the best configuration. Exit 0 when at least one
// configuration completed; 1 on bad input, an unreachable server, or nothing completed.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "harness/bench_runner.h"
#include "harness/report.h"
#include "harness/tuner.h"
#include "harness/workloads.h"

namespace dsinfer::cli {

namespace {

struct TuneArgs {
  std::string requests, url, model_path, draft_model_path, api_key, objective = "latency", out_dir = "tune-results";
  double budget_min = 10;
  int trials = 3, concurrency = 0, max_requests = 24, max_tokens = 0;
  std::string windows, thresholds, depths, policies, admissions, shards;
  std::vector<std::string> serve_args;
  bool full_grid = false, no_progress = false;
  uint64_t seed = 1;
};

std::vector<double> parse_doubles(const std::string& s, const std::string& flag) {
  std::vector<double> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    const std::string t = s.substr(a, b - a);
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size() || !(v >= 0.0 && v <= 1.0))
      throw Error(flag + ": expected comma-separated values in [0, 1], got '" + s + "'");
    out.push_back(v);
    a = b + 1;
  }
  return out;
}

std::vector<int> parse_ints0(const std::string& s, const std::string& flag) {
  // Like parse_int_list but 0 is allowed (window 0 = unlimited).
  std::vector<int> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    const std::string t = s.substr(a, b - a);
    if (t.empty() || t.size() > 8 || t.find_first_not_of("0123456789") != std::string::npos)
      throw Error(flag + ": expected comma-separated non-negative integers, got '" + s + "'");
    out.push_back(std::stoi(t));
    a = b + 1;
  }
  return out;
}

std::vector<std::string> parse_names(const std::string& s, const std::string& flag, const std::vector<std::string>& allowed) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    const std::string t = s.substr(a, b - a);
    if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) {
      std::string list;
      for (const auto& x : allowed) list += (list.empty() ? "" : ", ") + x;
      throw Error(flag + ": '" + t + "' is not one of " + list);
    }
    out.push_back(t);
    a = b + 1;
  }
  return out;
}

int run_tune_cmd(const TuneArgs& a) {
  using namespace harness;
  TuneOptions o;
  if (!a.url.empty() && !a.serve_args.empty())
    throw Error("--serve-arg: only used when tune starts its own server (no --url)");
  o.workload = load_dataset(a.requests, "--requests");
  if (!a.url.empty()) {
    o.have_url = true;
    o.url = parse_base_url(a.url, "--url");
    HttpOptions h;
    h.api_key = a.api_key;
    check_server(o.url, h);  // unreachable: one clear line before any work
  }
  o.model_path = a.model_path;
  o.draft_model_path = a.draft_model_path;
  o.serve_args = a.serve_args;
  o.api_key = a.api_key;
  o.objective = a.objective;
  o.trials = a.trials;
  o.concurrency = a.concurrency;
  o.max_requests = a.max_requests;
  o.max_tokens = a.max_tokens;
  o.budget_s = a.budget_min * 60.0;
  o.out_dir = a.out_dir;
  o.seed = a.seed;
  o.progress = !a.no_progress;
  o.grid.full = a.full_grid;
  if (!a.windows.empty()) o.grid.window_sizes = parse_ints0(a.windows, "--window-sizes");
  if (!a.thresholds.empty()) o.grid.thresholds = parse_doubles(a.thresholds, "--thresholds");
  if (!a.depths.empty()) o.grid.reuse_depths = parse_int_list(a.depths, "--reuse-depths");
  if (!a.policies.empty()) o.grid.schedule_policies = parse_names(a.policies, "--schedule-policies", {"fixed", "threshold", "dspark", "dspark-async"});
  if (!a.admissions.empty())
    o.grid.admission_policies = parse_names(a.admissions, "--admission-policies", {"fcfs", "hit-rate", "latency-aware", "hybrid"});
  if (!a.shards.empty()) o.grid.shard_counts = parse_int_list(a.shards, "--shard-counts");

  TuneReport r = run_tune(o);
  r.meta["requests_log"] = a.requests;
  r.meta["target"] = o.have_url ? o.url.origin() + " (runtime settings only)" : std::string("our own server, restarted per group");
  const std::string md = tune_markdown(r);
  std::printf("%s", md.c_str());
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dsinfer tune</title></head><body><pre>";
  for (char c : md) {
    if (c == '<') html += "&lt;";
    else if (c == '>') html += "&gt;";
    else if (c == '&') html += "&amp;";
    else html += c;
  }
  html += "</pre></body></html>\n";
  const auto paths = write_reports(a.out_dir, "tune", tune_json(r), md, html);
  std::printf("reports: %s %s %s\n", paths[0].c_str(), paths[1].c_str(), paths[2].c_str());
  if (r.best_command.empty()) {
    std::string why = r.results.empty() ? "empty grid" : r.results[0].status;
    std::fprintf(stderr, "dsinfer: error: tune: no configuration completed a trial (first: %s)\n", why.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

Runner register_tune(CLI::App& app) {
  auto a = std::make_shared<TuneArgs>();
  CLI::App* sub = app.add_subcommand("tune", "Replay recorded requests over a settings grid; rank configurations with "
                                             "bootstrap confidence intervals; print the best `dsinfer serve` line");
  sub->add_option("--requests", a->requests, "A `serve --record-requests` log (or any bench --dataset file)")->required();
  sub->add_option("--url", a->url, "Tune a running server (runtime settings only)");
  sub->add_option("--model-path", a->model_path, "Start our own server on this model (default: the embedded set); with "
                                                 "--url: only names the model in the recommended command");
  sub->add_option("--draft-model-path", a->draft_model_path, "Drafter of our own server (default: the embedded DSpark)");
  sub->add_option("--serve-arg", a->serve_args, "Extra argument for our own server (repeat), e.g. --serve-arg=--threads=2");
  sub->add_option("--budget", a->budget_min, "Minutes; nothing starts after it")->check(CLI::Range(0.01, 10080.0));
  sub->add_option("--objective", a->objective, "latency (P50 e2e), p99 (P99 e2e) or throughput (output tok/s)")
      ->check(CLI::IsMember({"latency", "throughput", "p99"}));
  sub->add_option("--trials", a->trials, "Replays per configuration")->check(CLI::Range(1, 1000));
  sub->add_option("--concurrency", a->concurrency, "Users replaying (default: the log's peak concurrency)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-requests", a->max_requests, "Requests per trial (the first N of the log)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-tokens", a->max_tokens, "Overrides the log's max_tokens")->check(CLI::Range(1, 1 << 24));
  sub->add_option("--window-sizes", a->windows, "Grid: drafter windows (a running server can only shrink its window), e.g. 128,256");
  sub->add_option("--thresholds", a->thresholds, "Grid: validation thresholds of the threshold policy, e.g. 0.5,0.75");
  sub->add_option("--reuse-depths", a->depths, "Grid: max reuse depths, e.g. 2,4");
  sub->add_option("--schedule-policies", a->policies, "Grid: fixed,threshold,dspark (also dspark-async)");
  sub->add_option("--admission-policies", a->admissions, "Grid: fcfs,hit-rate,latency-aware,hybrid");
  sub->add_option("--shard-counts", a->shards, "Grid (restart): KV pool shard counts, e.g. 1,8");
  sub->add_flag("--full-grid", a->full_grid, "Every combination instead of one parameter at a time");
  sub->add_option("--api-key", a->api_key, "Sent as Authorization: Bearer KEY");
  sub->add_option("--out-dir", a->out_dir, "Where tune.md / tune.json / tune.html and server logs go");
  sub->add_option("--seed", a->seed, "Seed of the bootstrap");
  sub->add_flag("--no-progress", a->no_progress, "No per-trial lines on stderr");
  return [a] { return run_tune_cmd(*a); };
}

}  // namespace dsinfer::cli
