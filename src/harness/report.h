// dsinfer harness: what a benchmark level measured, and the reports people read.
//
// Data flow: LevelRun (per-request results) + the server's before/after figures
// --summarize_level--> LevelReport; BenchReport (levels of one server) or CompareReport
// (the same levels against several server modes) --> JSON (everything, machine-readable),
// Markdown (tables) and one self-contained HTML page (the tables plus inline SVG plots:
// latency percentiles per concurrency; per-user against total tokens/s, the Pareto view;
// no scripts, no network).
//
// Definitions (also in docs/HARNESS.md):
//   TTFT          send -> first chunk with text
//   ITL           gap between consecutive text chunks of a request (all gaps pooled)
//   TPOT          per request (e2e - TTFT) / (output tokens - 1), requests with >= 2 tokens
//   E2E           send -> end of the stream
//   output tok/s  output tokens of completed requests / the level's wall time
//   per-user tok/s  mean over requests of 1 / TPOT (the streaming speed a user sees)
//   percentiles   linear interpolation between closest ranks (stats.h)
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/prometheus.h"
#include "harness/scheduler.h"
#include "harness/stats.h"

namespace dsinfer::harness {

struct LevelReport {
  std::string label;           // "c=16" or "rate=4/s"
  int concurrency = 0;
  double request_rate = 0;
  int requests = 0, completed = 0, failed = 0;
  std::map<std::string, int> errors;  // by kind (load_client.h)
  std::string first_error;
  double wall_s = 0;
  Summary ttft, tpot, itl, e2e;
  double output_tokens = 0, output_tps = 0, per_user_tps = 0, request_tps = 0;
  double mean_prompt_tokens = 0;  // NaN when the server sent no usage
  bool tokens_from_usage = true;  // false: some counts are text chunks, not tokens
  bool server_scraped = false;
  ServerFigures server;
  // Filled by bench --compare for the server process it started (NaN otherwise).
  double process_peak_rss_bytes = 0, process_cpu_utilisation = 0;
};

LevelReport summarize_level(const std::string& label, const LoadPlan& plan, const LevelRun& run);

struct BenchReport {
  nlohmann::json meta = nlohmann::json::object();  // url, model, workload, plan, date, command
  std::vector<LevelReport> levels;
};

struct CompareReport {
  nlohmann::json meta = nlohmann::json::object();
  std::vector<std::string> modes;           // "plain", "dflash", "dflash+dspark"
  std::vector<std::vector<LevelReport>> runs;  // [mode][level]
};

nlohmann::json level_json(const LevelReport& l);
nlohmann::json to_json(const BenchReport& r);
nlohmann::json to_json(const CompareReport& r);
std::string to_markdown(const BenchReport& r);
std::string to_markdown(const CompareReport& r);
std::string to_html(const BenchReport& r);
std::string to_html(const CompareReport& r);

// The article's table for one level index: rows P50/P99 latency, throughput, memory peak,
// CPU utilisation, reuse rate, cache hit rate, τ; one column per mode plus the relative
// change of each mode against the first. Plain text (what `bench --compare` prints).
std::string compare_table_text(const CompareReport& r, size_t level);

// Writes DIR/NAME.json, NAME.md, NAME.html (creating DIR); returns the three paths.
std::vector<std::string> write_reports(const std::string& dir, const std::string& name, const nlohmann::json& json,
                                       const std::string& markdown, const std::string& html);

// Plot primitives, exposed for tests: a line/point chart as an <svg> element.
struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
  std::vector<std::string> point_labels;  // optional, drawn beside each point
};
std::string svg_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<PlotSeries>& series, bool log2_x);

}  // namespace dsinfer::harness
