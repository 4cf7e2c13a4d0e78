// dsinfer server floor: what GET /metrics (Prometheus text exposition 0.0.4) and
// GET /api/v1/cache/stats report.
//
// Data flow: the engine's stepping thread calls observe_step() after every step (drafts
// verified / accepted per request: per-position acceptance, tokens per round, verify budget
// per step); request handlers call observe_request() when a request ends (outcome, TTFT,
// time per output token, end-to-end latency) or count_rejected() for a 4xx; render()
// combines those with a fresh EngineStats snapshot (tokens, drafts, queue, KV memory).
// Counters only grow, so a client can diff two scrapes (e.g. the verify budget per step
// of a time window = delta dsinfer_verified_draft_tokens_total / delta dsinfer_decode_steps_total).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace dsinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends the _bucket / _sum / _count lines (cumulative buckets, +Inf last).
  void render(std::string& out, const std::string& name) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Latency buckets: log-spaced from 1 ms to 300 s (seconds).
std::vector<double> latency_buckets();

struct RequestTiming {
  std::string outcome;        // stop | length | disconnected | cancelled | error
  double ttft_s = -1;         // < 0: no token was produced
  double e2e_s = 0;
  int completion_tokens = 0;  // TPOT = (e2e - ttft) / (completion_tokens - 1) when > 1
};

class ServerMetrics {
 public:
  // max_drafts: the drafter's largest block (per-position labels 1..max_drafts).
  explicit ServerMetrics(int max_drafts);

  // Resets the per-position labels once the drafter is known (before serving).
  void set_max_drafts(int max_drafts);
  void observe_step(const StepObservation& o);
  void observe_request(const RequestTiming& t);
  void count_rejected(int http_status);  // a request refused before reaching the engine
  void count_config_change();

  // The whole exposition. `model_id` labels nothing (one model per server) but is
  // reported in dsinfer_build_info.
  std::string render(const EngineStats& st, const std::string& model_id) const;
  // GET /api/v1/cache/stats.
  nlohmann::json cache_stats_json(const EngineStats& st) const;

 private:
  mutable std::mutex mu_;
  int max_drafts_;
  std::map<std::string, uint64_t> outcomes_;      // finished requests by outcome
  std::map<int, uint64_t> rejected_;              // by HTTP status
  Histogram ttft_, tpot_, e2e_;
  Histogram tokens_per_round_;                    // tau: committed tokens per verify round
  Histogram verify_budget_;                       // drafts verified per decoding step
  std::vector<uint64_t> pos_verified_, pos_accepted_;
  uint64_t decode_steps_ = 0, rounds_ = 0, config_changes_ = 0;
};

}  // namespace dsinfer::server
