// dsinfer harness: one benchmark against one server — every concurrency level (or one open
// loop rate) in turn, with the server's /metrics scraped around each level.
//
// Data flow: BenchOptions --check_server (GET /v1/models: reachable? which model id?)-->
// for each level: scrape /metrics --run_level--> results --scrape /metrics--> LevelReport
// (summarize_level + server_figures) --> the caller's reports. A server without /metrics
// (a peer) is benchmarked all the same; its server-side figures read n/a.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "harness/http_client.h"
#include "harness/report.h"
#include "harness/scheduler.h"
#include "harness/workloads.h"

namespace dsinfer::harness {

struct BenchOptions {
  BaseUrl url;
  HttpOptions http;
  RequestOptions request;
  Workload workload;
  std::vector<int> concurrency = {1};  // closed-loop levels (ignored with request_rate > 0)
  double request_rate = 0;             // > 0: one open-loop level at this rate (concurrency[0] caps it)
  int num_prompts = 0;                 // per level; 0 with duration 0: max(8, 2 x concurrency)
  double duration_s = 0;               // per level
  uint64_t seed = 1;
  int warmup_requests = 0;             // untimed requests before the first level (the workload's last items)
  bool progress = true;                // live line on stderr
  std::string progress_prefix;         // e.g. the mode name in --compare
};

// Checks the server answers GET /v1/models; returns the first model id it lists ("" when
// it lists none). Throws Error "--url: cannot reach ..." when it does not answer, or
// "--url: ... HTTP 401" etc.
std::string check_server(const BaseUrl& url, const HttpOptions& http);

// Runs every level. `after_level` (optional) may add process figures to each report.
std::vector<LevelReport> run_bench(const BenchOptions& o, const std::function<void(LevelReport&)>& after_level = {});

// Parses "1,4,16" (each >= 1, at most 4096). Throws Error naming `flag`.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag);

}  // namespace dsinfer::harness
