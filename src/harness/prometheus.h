// dsinfer harness: reading a Prometheus text exposition (format 0.0.4) and the server-side
// figures a benchmark reports from two scrapes.
//
// Data flow: GET /metrics body --parse_prometheus--> Scrape (one value per series: name +
// sorted labels) ; Scrape before + Scrape after --server_figures--> ServerFigures: τ
// (tokens per verify round, from the dsinfer_spec_tokens_per_round histogram's _sum/_count
// deltas), the reuse rate and cache hit ratio over the window (counter deltas), the
// article's gauges as last reported, and peak memory where the server exports one. A
// figure the server does not export stays NaN ("n/a" in reports): nothing is invented.
#pragma once
#include <map>
#include <string>
#include <string_view>

namespace dsinfer::harness {

struct Scrape {
  // key: metric name, or name{l1="v1",l2="v2"} with labels sorted by name.
  std::map<std::string, double> series;
  bool has(const std::string& key) const { return series.count(key) != 0; }
  // NaN when absent.
  double get(const std::string& key) const;
  // Sum over every series of this metric name (all label sets); NaN when none.
  double sum(const std::string& name) const;
};

// Throws dsinfer::Error naming the line number for a malformed sample line.
Scrape parse_prometheus(std::string_view text);

struct ServerFigures {
  double tau = 0;                  // mean tokens committed per verify round in the window
  double reuse_rate_window = 0;    // accepted drafts / generated tokens in the window
  double cache_hit_window = 0;     // cached prompt tokens / prompt tokens in the window
  double reuse_rate_gauge = 0;     // dflash_kv_reuse_rate after (since server start)
  double cache_hit_gauge = 0;      // dspark_cache_hit_ratio after (since server start)
  double validation_failures = 0;  // delta dflash_validation_failures_total
  double generated_tokens = 0;     // delta of the server's generated-token counter
  double peak_memory_bytes = 0;    // process peak / resident memory if exported
  double kv_fragmentation = 0;     // dsinfer_kv_cache_fragmentation_ratio after
};

// All fields NaN where the metric is missing from either scrape.
ServerFigures server_figures(const Scrape& before, const Scrape& after);

}  // namespace dsinfer::harness
