// dsinfer harness: the tuning loop (see tuner.h).
#include "harness/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/mapped_file.h"
#include "harness/bench_runner.h"
#include "harness/compare.h"
#include "harness/load_client.h"
#include "harness/scheduler.h"
#include "harness/server_process.h"

namespace dsinfer::harness {

using nlohmann::json;

namespace {

std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The settings POST /api/v1/config/dflash changes that tune explores.
constexpr const char* kRuntimeKeys[] = {"schedule_policy", "validation_threshold", "max_reuse_depth", "window_size",
                                        "admission_policy"};

bool same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return std::fabs(a.get<double>() - b.get<double>()) < 1e-6;
  return a == b;
}

}  // namespace

std::string TuneConfig::label() const {
  std::string s;
  const auto add = [&](const std::string& k, const std::string& v) { s += (s.empty() ? "" : " ") + k + "=" + v; };
  if (!schedule_policy.empty()) add("schedule", schedule_policy);
  if (validation_threshold >= 0) add("threshold", num_str(validation_threshold));
  if (max_reuse_depth >= 0) add("depth", std::to_string(max_reuse_depth));
  if (window_size >= 0) add("window", std::to_string(window_size));
  if (shard_count >= 0) add("shards", std::to_string(shard_count));
  if (!admission_policy.empty()) add("admission", admission_policy);
  return s.empty() ? "baseline (server defaults)" : s;
}

std::vector<std::string> TuneConfig::restart_flags() const {
  std::vector<std::string> f;
  if (shard_count >= 0) f.insert(f.end(), {"--dspark-shard-count", std::to_string(shard_count)});
  return f;
}

json TuneConfig::runtime_patch() const {
  json p = json::object();
  if (!schedule_policy.empty()) p["schedule_policy"] = schedule_policy;
  if (validation_threshold >= 0) p["validation_threshold"] = validation_threshold;
  if (max_reuse_depth >= 0) p["max_reuse_depth"] = max_reuse_depth;
  if (window_size >= 0) p["window_size"] = window_size;
  if (!admission_policy.empty()) p["admission_policy"] = admission_policy;
  return p;
}

std::vector<std::string> TuneConfig::serve_flags() const {
  std::vector<std::string> f;
  if (!schedule_policy.empty()) f.insert(f.end(), {"--spec-schedule", schedule_policy});
  if (validation_threshold > 0) f.insert(f.end(), {"--dflash-validation-threshold", num_str(validation_threshold)});
  if (max_reuse_depth >= 0) f.insert(f.end(), {"--dflash-max-reuse-depth", std::to_string(max_reuse_depth)});
  if (window_size >= 0) f.insert(f.end(), {"--dflash-window-size", std::to_string(window_size)});
  if (!admission_policy.empty()) f.insert(f.end(), {"--dspark-scheduler-policy", admission_policy});
  const std::vector<std::string> r = restart_flags();
  f.insert(f.end(), r.begin(), r.end());
  return f;
}

std::vector<TuneConfig> plan_grid(const TuneGrid& g, bool restart_allowed) {
  std::vector<TuneConfig> out;
  // Runtime part: the policies (threshold with each threshold value), then depths.
  std::vector<TuneConfig> runtime;
  for (const std::string& p : g.schedule_policies) {
    if (p == "threshold") {
      for (double t : g.thresholds) {
        TuneConfig c;
        c.schedule_policy = p;
        c.validation_threshold = t;
        runtime.push_back(c);
      }
    } else {
      TuneConfig c;
      c.schedule_policy = p;
      runtime.push_back(c);
    }
  }
  // Values equal to serve's defaults (fcfs, 8 shards) are the baseline. The default window
  // depends on the drafter, so a window equal to it is found at run time (empty patch).
  std::vector<TuneConfig> runtime_other;
  for (int w : g.window_sizes) {
    TuneConfig c;
    c.window_size = w;
    runtime_other.push_back(c);
  }
  for (const std::string& a : g.admission_policies)
    if (a != "fcfs") {
      TuneConfig c;
      c.admission_policy = a;
      runtime_other.push_back(c);
    }
  std::vector<TuneConfig> restart;
  if (restart_allowed)
    for (int s : g.shard_counts)
      if (s != 8) {
        TuneConfig c;
        c.shard_count = s;
        restart.push_back(c);
      }
  if (!g.full) {
    out.push_back(TuneConfig{});  // baseline
    for (const TuneConfig& c : runtime) out.push_back(c);
    for (int d : g.reuse_depths) {
      TuneConfig c;
      c.max_reuse_depth = d;
      out.push_back(c);
    }
    for (const TuneConfig& c : runtime_other) out.push_back(c);
    for (const TuneConfig& c : restart) out.push_back(c);
    return out;
  }
  // Full product: runtime (policy x depth) x restart (window x shards x admission).
  std::vector<TuneConfig> rt;
  std::vector<int> depths = g.reuse_depths;
  depths.insert(depths.begin(), -1);
  for (const TuneConfig& p : runtime)
    for (int d : depths) {
      TuneConfig c = p;
      c.max_reuse_depth = d;
      rt.push_back(c);
    }
  std::vector<int> windows = {-1}, shards = {-1};
  std::vector<std::string> admissions = {""};
  for (int w : g.window_sizes) windows.push_back(w);
  for (const std::string& a : g.admission_policies)
    if (a != "fcfs") admissions.push_back(a);
  if (restart_allowed)
    for (int s : g.shard_counts)
      if (s != 8) shards.push_back(s);
  for (int w : windows)
    for (int s : shards)
      for (const std::string& a : admissions)
        for (TuneConfig c : rt) {
          c.window_size = w;
          c.shard_count = s;
          c.admission_policy = a;
          out.push_back(c);
        }
  return out;
}

TuneReport run_tune(const TuneOptions& o) {
  if (o.objective != "latency" && o.objective != "p99" && o.objective != "throughput")
    throw Error("--objective: expected latency, throughput or p99, got '" + o.objective + "'");
  if (o.trials < 1) throw Error("--trials: must be >= 1");
  if (o.budget_s <= 0) throw Error("--budget: must be > 0 minutes");
  if (o.workload.items.empty()) throw Error("--requests: no requests");
  const double start = now_s();
  const double deadline = start + o.budget_s;

  TuneReport rep;
  rep.objective = o.objective;
  rep.budget_s = o.budget_s;
  Workload w = o.workload;
  if (static_cast<int>(w.items.size()) > o.max_requests) w.items.resize(static_cast<size_t>(o.max_requests));
  rep.requests_per_trial = static_cast<int>(w.items.size());
  rep.concurrency = o.concurrency > 0 ? o.concurrency : recorded_peak_concurrency(o.workload);
  rep.concurrency = std::max(1, std::min(rep.concurrency, rep.requests_per_trial));

  // Our own server's model arguments (also the recommended command's).
  std::vector<std::string> model_args;
  std::string model = o.model_path, draft = o.draft_model_path;
  if (!o.have_url && model.empty()) {
    const std::string e = find_embedded_models_dir();
    if (e.empty()) throw Error("--model-path: not given and the embedded models were not found");
    model = e + "/target";
    if (draft.empty() && file_exists(e + "/dspark/config.json")) draft = e + "/dspark";
  }
  if (!o.have_url && !file_exists(model + "/config.json")) throw Error("--model-path: " + model + "/config.json not found");
  model_args = {"--model-path", model.empty() ? "MODEL_DIR" : model};
  if (!draft.empty()) model_args.insert(model_args.end(), {"--draft-model-path", draft});

  const std::vector<TuneConfig> grid = plan_grid(o.grid, !o.have_url);
  std::vector<ConfigResult> results(grid.size());
  for (size_t i = 0; i < grid.size(); ++i) results[i].config = grid[i];
  // Group by the restart key, keeping the first appearance order.
  std::vector<std::string> keys;
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < grid.size(); ++i) {
    std::string k;
    for (const std::string& f : grid[i].restart_flags()) k += f + " ";
    if (!groups.count(k)) keys.push_back(k);
    groups[k].push_back(i);
  }
  HttpOptions http;
  http.api_key = o.api_key;
  RequestOptions ro;
  ro.max_tokens = o.max_tokens;
  double trial_time = 0, start_time = 0;
  int trials_run = 0, starts = 0;
  if (!o.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
  }
  for (const std::string& key : keys) {
    const std::vector<size_t>& members = groups[key];
    if (now_s() + (starts ? start_time / starts : 0) + (trials_run ? trial_time / trials_run : 0) > deadline) break;
    std::unique_ptr<ManagedServer> srv;
    BaseUrl url = o.url;
    if (!o.have_url) {
      std::vector<std::string> args = model_args;
      const std::vector<std::string> rf = results[members[0]].config.restart_flags();
      args.insert(args.end(), rf.begin(), rf.end());
      args.insert(args.end(), o.serve_args.begin(), o.serve_args.end());
      const double t0 = now_s();
      const std::string log = (o.out_dir.empty() ? std::string("/tmp") : o.out_dir) + "/tune-server-" + std::to_string(starts) + ".log";
      try {
        srv = std::make_unique<ManagedServer>(args, log, std::max(5.0, deadline - now_s()), o.api_key);
      } catch (const Error& e) {
        for (size_t i : members) results[i].status = std::string("refused: ") + e.what();
        if (o.progress) std::fprintf(stderr, "tune: server for [%s] refused: %s\n", key.c_str(), e.what());
        continue;
      }
      start_time += now_s() - t0;
      ++starts;
      url = srv->url();
    }
    if (ro.model.empty()) ro.model = check_server(url, http);
    // The settings in force at start: every configuration is applied relative to them,
    // so the order of configurations does not matter.
    const HttpResponse g = http_get(url, "/api/v1/config/dflash", http);
    json initial = json::object();
    if (g.ok()) {
      try {
        initial = json::parse(g.body);
      } catch (const json::exception&) {
      }
    }
    json current = initial;
    // Warm-up: one untimed replay per server, so the first configuration measured on it
    // meets the same state as the others (pages touched, buffers grown, and the log's
    // prompts in the prefix cache, which every later configuration would otherwise enjoy
    // alone).
    {
      LoadPlan plan;
      plan.concurrency = rep.concurrency;
      plan.num_prompts = rep.requests_per_trial;
      plan.duration_s = std::max(1.0, deadline - now_s());
      HttpOptions th = http;
      th.read_timeout_s = std::max(5.0, deadline - now_s());
      run_level(url, w, ro, th, plan);
    }
    for (size_t i : members) {
      ConfigResult& cr = results[i];
      // Apply the runtime settings that differ from what is in force.
      json desired = json::object();
      for (const char* k : kRuntimeKeys)
        if (initial.contains(k)) desired[k] = initial[k];
      const json wanted = cr.config.runtime_patch();  // named: items() must not outlive it
      for (const auto& [k, v] : wanted.items()) desired[k] = v;
      json patch = json::object();
      for (const auto& [k, v] : desired.items())
        if (!current.contains(k) || !same(current[k], v)) patch[k] = v;
      bool is_baseline_setting = !wanted.empty() && g.ok();
      for (const auto& [k, v] : wanted.items())
        if (!initial.contains(k) || !same(initial[k], v)) is_baseline_setting = false;
      if (is_baseline_setting) {
        cr.status = "same as baseline (the server's own setting)";
        continue;
      }
      if (!patch.empty()) {
        if (!g.ok()) {
          cr.status = "refused: the server has no /api/v1/config/dflash (" + describe_failure(url, "GET", "/api/v1/config/dflash", g) + ")";
          continue;
        }
        const HttpResponse p = http_post_json(url, "/api/v1/config/dflash", patch.dump(), http);
        if (!p.ok()) {
          std::string msg = p.body;
          try {
            msg = json::parse(p.body)["error"]["message"].get<std::string>();
          } catch (const std::exception&) {
          }
          cr.status = "refused: " + (p.status ? msg : p.error);
          if (o.progress) std::fprintf(stderr, "tune: [%s] refused: %s\n", cr.config.label().c_str(), cr.status.c_str() + 9);
          continue;
        }
        try {
          current = json::parse(p.body);
        } catch (const json::exception&) {
          current = desired;
        }
      }
      for (int t = 0; t < o.trials; ++t) {
        const double est = trials_run ? trial_time / trials_run : 0;
        if (now_s() + est > deadline) break;
        LoadPlan plan;
        plan.concurrency = rep.concurrency;
        plan.num_prompts = rep.requests_per_trial;
        plan.duration_s = std::max(1.0, deadline - now_s());  // nothing is sent after the budget's end
        plan.seed = o.seed + static_cast<uint64_t>(t);
        const double t0 = now_s();
        HttpOptions th = http;  // a request silent past the budget's end fails instead of overrunning it
        th.read_timeout_s = std::max(5.0, deadline - now_s());
        const LevelRun run = run_level(url, w, ro, th, plan);
        trial_time += now_s() - t0;
        ++trials_run;
        ++cr.trials;
        double tokens = 0;
        for (const RequestResult& r : run.results) {
          if (r.ok) {
            cr.e2e_s.push_back(r.e2e_s);
            tokens += r.output_tokens;
          } else {
            ++cr.failed_requests;
          }
        }
        cr.trial_tps.push_back(run.wall_s > 0 ? tokens / run.wall_s : 0);
        if (o.progress)
          std::fprintf(stderr, "tune: [%s] trial %d/%d: %zu ok, %d failed, %.1f tok/s, %.0f s of %.0f s budget used\n",
                       cr.config.label().c_str(), t + 1, o.trials, run.results.size() - static_cast<size_t>(cr.failed_requests),
                       cr.failed_requests, cr.trial_tps.back(), now_s() - start, o.budget_s);
      }
      if (cr.trials == 0) {
        cr.status = "not run (budget)";
        continue;
      }
      cr.status = cr.e2e_s.empty() ? "failed: every request failed" : "ok";
    }
    // A server we do not own gets its settings back.
    if (!srv && g.ok()) {
      json restore = json::object();
      for (const char* k : kRuntimeKeys)
        if (initial.contains(k) && current.contains(k) && !same(current[k], initial[k])) restore[k] = initial[k];
      if (!restore.empty()) {
        const HttpResponse p = http_post_json(url, "/api/v1/config/dflash", restore.dump(), http);
        if (!p.ok() && o.progress)
          std::fprintf(stderr, "tune: warning: could not restore the server's settings: %s\n",
                       describe_failure(url, "POST", "/api/v1/config/dflash", p).c_str());
      }
    }
    if (srv) srv->stop(30);
  }
  for (ConfigResult& cr : results) {
    if (cr.status == "not run") cr.status = "not run (budget)";
    if (cr.status != "ok") continue;
    const auto p50 = [](const std::vector<double>& v) { return percentile(v, 50); };
    const auto p99 = [](const std::vector<double>& v) { return percentile(v, 99); };
    cr.p50 = bootstrap_ci(cr.e2e_s, p50, 1000, 0.95, o.seed);
    cr.p99 = bootstrap_ci(cr.e2e_s, p99, 1000, 0.95, o.seed);
    cr.tps = bootstrap_ci(cr.trial_tps, [](const std::vector<double>& v) { return mean(v); }, 1000, 0.95, o.seed);
    cr.objective_value = o.objective == "latency" ? cr.p50.estimate : o.objective == "p99" ? cr.p99.estimate : cr.tps.estimate;
  }
  const bool higher_better = o.objective == "throughput";
  std::stable_sort(results.begin(), results.end(), [&](const ConfigResult& a, const ConfigResult& b) {
    const bool ao = a.status == "ok", bo = b.status == "ok";
    if (ao != bo) return ao;
    if (!ao) return false;
    return higher_better ? a.objective_value > b.objective_value : a.objective_value < b.objective_value;
  });
  if (!results.empty() && results[0].status == "ok") {
    const auto ci = [&](const ConfigResult& c) {
      return o.objective == "latency" ? c.p50 : o.objective == "p99" ? c.p99 : c.tps;
    };
    const Interval best = ci(results[0]);
    for (size_t i = 1; i < results.size() && results[i].status == "ok"; ++i) {
      const Interval c = ci(results[i]);
      results[i].distinguishable = c.low > best.high || c.high < best.low;
    }
    std::string cmd = "dsinfer serve";
    for (const std::string& a : model_args) cmd += " " + a;
    for (const std::string& a : results[0].config.serve_flags()) cmd += " " + a;
    for (const std::string& a : o.serve_args) cmd += " " + a;
    rep.best_command = cmd;
  }
  rep.results = std::move(results);
  rep.elapsed_s = now_s() - start;
  return rep;
}

std::string tune_markdown(const TuneReport& r) {
  std::string s = "# dsinfer tune\n\n";
  for (const auto& [k, v] : r.meta.items()) s += "- " + k + ": " + (v.is_string() ? v.get<std::string>() : v.dump()) + "\n";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "- objective: %s; %d requests per trial at concurrency %d; %.0f s used of a %.0f s budget\n\n",
                r.objective.c_str(), r.requests_per_trial, r.concurrency, r.elapsed_s, r.budget_s);
  s += buf;
  s += "| rank | configuration | trials | P50 e2e [95% CI] | P99 e2e [95% CI] | output tok/s [95% CI] | failed | status |\n"
       "|---|---|---|---|---|---|---|---|\n";
  int rank = 0;
  for (const ConfigResult& c : r.results) {
    const bool ok = c.status == "ok";
    const auto iv = [&](const Interval& i, bool secs) {
      if (!ok) return std::string("n/a");
      return secs ? format_seconds(i.estimate) + " [" + format_seconds(i.low) + ", " + format_seconds(i.high) + "]"
                  : format_number(i.estimate, 1) + " [" + format_number(i.low, 1) + ", " + format_number(i.high, 1) + "]";
    };
    std::string rank_cell = "-";
    if (ok) {
      ++rank;
      rank_cell = std::to_string(rank) + (c.distinguishable || rank == 1 ? "" : " (≈1)");
    }
    s += "| " + rank_cell + " | " +
         c.config.label() + " | " + std::to_string(c.trials) + " | " + iv(c.p50, true) + " | " + iv(c.p99, true) + " | " +
         iv(c.tps, false) + " | " + std::to_string(c.failed_requests) + " | " + c.status + " |\n";
  }
  s += "\n(≈1): its confidence interval overlaps the best configuration's, so the difference is not resolved by these trials.";
  s += " Latency intervals resample the pooled requests; the throughput interval resamples trials (a single trial gives a point).";
  s += " Every server got one untimed warm-up replay first, so all configurations meet the log's prompts already cached.\n";
  s += r.best_command.empty() ? "\nNo configuration completed a trial.\n" : "\nRecommended: " + r.best_command + "\n";
  return s;
}

json tune_json(const TuneReport& r) {
  json res = json::array();
  const auto iv = [](const Interval& i) { return json{{"estimate", i.estimate}, {"low", i.low}, {"high", i.high}}; };
  for (const ConfigResult& c : r.results) {
    json j = {{"configuration", c.config.label()}, {"serve_flags", c.config.serve_flags()}, {"status", c.status},
              {"trials", c.trials}, {"failed_requests", c.failed_requests}, {"trial_output_tokens_per_s", c.trial_tps}};
    if (c.status == "ok") {
      j["p50_e2e_s"] = iv(c.p50);
      j["p99_e2e_s"] = iv(c.p99);
      j["output_tokens_per_s"] = iv(c.tps);
      j["distinguishable_from_best"] = c.distinguishable;
    }
    res.push_back(j);
  }
  return {{"meta", r.meta}, {"objective", r.objective}, {"concurrency", r.concurrency},
          {"requests_per_trial", r.requests_per_trial}, {"elapsed_s", r.elapsed_s}, {"budget_s", r.budget_s},
          {"results", res}, {"recommended_command", r.best_command}};
}

}  // namespace dsinfer::harness
