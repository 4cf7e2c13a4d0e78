// dsinfer harness: the per-level benchmark loop (see bench_runner.h).
#include "harness/bench_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "harness/prometheus.h"

namespace dsinfer::harness {

namespace {

// nullopt-like: returns false when the server has no parseable /metrics.
bool scrape(const BaseUrl& url, const HttpOptions& http, Scrape& out) {
  HttpOptions h = http;
  h.read_timeout_s = 10;
  const HttpResponse r = http_get(url, "/metrics", h);
  if (!r.ok()) return false;
  try {
    out = parse_prometheus(r.body);
  } catch (const Error&) {
    return false;
  }
  return !out.series.empty();
}

}  // namespace

std::string check_server(const BaseUrl& url, const HttpOptions& http) {
  HttpOptions h = http;
  h.read_timeout_s = 15;
  const HttpResponse r = http_get(url, "/v1/models", h);
  if (r.status == 0) throw Error("--url: cannot reach " + url.origin() + ": " + r.error);
  if (r.status == 401 || r.status == 403)
    throw Error("--url: " + url.origin() + " refused the API key (HTTP " + std::to_string(r.status) + "; see --api-key)");
  if (!r.ok()) return "";  // some servers have no /v1/models; the completions will tell
  try {
    const auto j = nlohmann::json::parse(r.body);
    if (j.contains("data") && j["data"].is_array() && !j["data"].empty() && j["data"][0].contains("id") &&
        j["data"][0]["id"].is_string())
      return j["data"][0]["id"];
  } catch (const nlohmann::json::exception&) {
  }
  return "";
}

std::vector<LevelReport> run_bench(const BenchOptions& o, const std::function<void(LevelReport&)>& after_level) {
  std::vector<std::pair<std::string, LoadPlan>> plans;
  if (o.request_rate > 0) {
    LoadPlan p;
    p.request_rate = o.request_rate;
    p.concurrency = o.concurrency.empty() ? 0 : o.concurrency.front();
    p.num_prompts = o.num_prompts > 0 || o.duration_s > 0 ? o.num_prompts : 64;
    p.duration_s = o.duration_s;
    p.seed = o.seed;
    char label[64];
    std::snprintf(label, sizeof label, "rate=%g/s", o.request_rate);
    plans.emplace_back(label, p);
  } else {
    for (int c : o.concurrency) {
      LoadPlan p;
      p.concurrency = c;
      p.num_prompts = o.num_prompts > 0 || o.duration_s > 0 ? o.num_prompts : std::max(8, 2 * c);
      p.duration_s = o.duration_s;
      p.seed = o.seed;
      plans.emplace_back("c=" + std::to_string(c), p);
    }
  }
  // Each level continues where the previous one stopped in the workload, so a level does
  // not replay prompts the server has just cached (which would inflate the cache hit rate).
  size_t next_item = 0;
  for (auto& lp : plans) {
    lp.second.first_item = next_item;
    if (lp.second.num_prompts > 0) next_item += static_cast<size_t>(lp.second.num_prompts);
  }
  if (o.warmup_requests > 0) {
    // Taken from the end of the workload, away from the prompts the levels measure.
    LoadPlan warm;
    warm.concurrency = std::max(1, std::min(o.warmup_requests, o.concurrency.empty() ? 1 : o.concurrency.front()));
    warm.num_prompts = o.warmup_requests;
    const size_t n = o.workload.items.size();
    warm.first_item = n - static_cast<size_t>(o.warmup_requests) % n;
    run_level(o.url, o.workload, o.request, o.http, warm);
  }
  const bool tty = isatty(2);
  std::vector<LevelReport> out;
  for (auto& [label, plan] : plans) {
    Scrape before, after;
    const bool have_before = scrape(o.url, o.http, before);
    const std::string shown = o.progress_prefix.empty() ? label : o.progress_prefix + " " + label;
    double last_print = -1e9;
    const auto on_progress = [&](const Progress& p) {
      if (!o.progress) return;
      // A terminal gets one line rewritten in place; a log gets a line every 5 s.
      if (tty) {
        std::fprintf(stderr, "\r%-100s", progress_line(shown, p).c_str());
      } else if (p.elapsed_s - last_print >= 5.0) {
        std::fprintf(stderr, "%s\n", progress_line(shown, p).c_str());
        last_print = p.elapsed_s;
      }
      std::fflush(stderr);
    };
    LevelRun run = run_level(o.url, o.workload, o.request, o.http, plan, on_progress);
    if (o.progress) {
      Progress fin;
      fin.done = static_cast<int>(run.results.size());
      for (const auto& r : run.results) {
        fin.failed += !r.ok;
        fin.output_tokens += r.output_tokens;
      }
      fin.elapsed_s = run.wall_s;
      std::fprintf(stderr, "%s%s\n", tty ? "\r" : "", progress_line(shown, fin).c_str());
    }
    LevelReport l = summarize_level(label, plan, run);
    if (have_before && scrape(o.url, o.http, after)) {
      l.server_scraped = true;
      l.server = server_figures(before, after);
    }
    if (after_level) after_level(l);
    out.push_back(std::move(l));
  }
  return out;
}

std::vector<int> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  size_t a = 0;
  while (a <= text.size()) {
    size_t b = text.find(',', a);
    if (b == std::string::npos) b = text.size();
    const std::string t = text.substr(a, b - a);
    if (t.empty() || t.size() > 4 || t.find_first_not_of("0123456789") != std::string::npos)
      throw Error(flag + ": expected a comma-separated list of integers like 1,4,16, got '" + text + "'");
    const int v = std::stoi(t);
    if (v < 1 || v > 4096) throw Error(flag + ": each value must be in [1, 4096], got " + t);
    out.push_back(v);
    a = b + 1;
  }
  return out;
}

}  // namespace dsinfer::harness
