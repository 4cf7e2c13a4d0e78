// dsinfer harness: when requests are sent — closed loop (a fixed number of users, each
// sending its next request when the previous one ends) or open loop (Poisson arrivals at a
// given rate, whatever the server's speed).
//
// Data flow: Workload items (cycled in order) + LoadPlan --> worker threads each running
// run_streaming_request --> RequestResult per request, in completion order, and the
// level's wall time. A progress callback sees counters every `progress_interval_s` (the
// live line on stderr). A run ends after `num_prompts` requests or when `duration_s` has
// passed (requests still in flight then are waited for and counted).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/load_client.h"
#include "harness/workloads.h"

namespace dsinfer::harness {

struct LoadPlan {
  int concurrency = 1;        // closed loop: users; open loop: cap on requests in flight (0 = none)
  double request_rate = 0;    // > 0: open loop, requests per second (Poisson)
  int num_prompts = 0;        // 0: no count limit (duration must be set)
  double duration_s = 0;      // 0: no time limit (num_prompts must be set)
  uint64_t seed = 1;          // arrival times of the open loop
  size_t first_item = 0;      // workload index of the first request (items are cycled)
  double progress_interval_s = 0.5;
};

struct Progress {
  int done = 0, failed = 0, in_flight = 0, sent = 0;
  long long output_tokens = 0;
  double elapsed_s = 0;
};

struct LevelRun {
  std::vector<RequestResult> results;
  double wall_s = 0;  // first send to last completion
};

// Throws Error for a plan with neither a count nor a duration, or an empty workload.
LevelRun run_level(const BaseUrl& url, const Workload& w, const RequestOptions& ro, const HttpOptions& ho,
                   const LoadPlan& plan, const std::function<void(const Progress&)>& on_progress = {});

// "[c=16] 37/64 done, 2 failed, 16 in flight, 812 tok, 41.2 tok/s, 19.7 s" (no newline).
std::string progress_line(const std::string& label, const Progress& p);

}  // namespace dsinfer::harness
