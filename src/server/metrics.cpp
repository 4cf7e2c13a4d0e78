// dsinfer server floor: Prometheus exposition of the engine's and the server's figures
// (see metrics.h). Every figure is measured: the article's three names are defined as in
// docs/SERVER.md (reuse rate = accepted drafts / generated tokens; cache hit ratio =
// prompt tokens served from cached KV / prompt tokens; validation failures = verified
// drafts the target rejected).
#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dsinfer::server {

namespace {

std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Appends piece by piece (no temporaries: also keeps GCC 12's -Wrestrict false positive away).
void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name);
  out.append(" ").append(type).append("\n");
}

void sample(std::string& out, const std::string& name, double v, const std::string& labels = {}) {
  out.append(name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  out.append(" ").append(num(v)).append("\n");
}

void gauge(std::string& out, const std::string& name, const char* help, double v) {
  header(out, name, "gauge", help);
  sample(out, name, v);
}

void counter(std::string& out, const std::string& name, const char* help, double v) {
  header(out, name, "counter", help);
  sample(out, name, v);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    sample(out, name + "_bucket", static_cast<double>(cum), "le=\"" + num(bounds_[i]) + "\"");
  }
  sample(out, name + "_bucket", static_cast<double>(count_), "le=\"+Inf\"");
  sample(out, name + "_sum", sum_);
  sample(out, name + "_count", static_cast<double>(count_));
}

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 300};
}

static std::vector<double> integer_buckets(int max) {
  std::vector<double> b;
  for (int i = 0; i <= max; ++i) b.push_back(i);
  return b;
}

static std::vector<double> budget_buckets() { return {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}; }

ServerMetrics::ServerMetrics(int max_drafts)
    : max_drafts_(std::max(max_drafts, 0)),
      ttft_(latency_buckets()),
      tpot_(latency_buckets()),
      e2e_(latency_buckets()),
      tokens_per_round_(integer_buckets(std::max(max_drafts, 0) + 1)),
      verify_budget_(budget_buckets()),
      pos_verified_(static_cast<size_t>(std::max(max_drafts, 0)), 0),
      pos_accepted_(static_cast<size_t>(std::max(max_drafts, 0)), 0) {}

void ServerMetrics::set_max_drafts(int max_drafts) {
  std::lock_guard<std::mutex> lock(mu_);
  max_drafts_ = std::max(max_drafts, 0);
  tokens_per_round_ = Histogram(integer_buckets(max_drafts_ + 1));
  pos_verified_.assign(static_cast<size_t>(max_drafts_), 0);
  pos_accepted_.assign(static_cast<size_t>(max_drafts_), 0);
}

void ServerMetrics::observe_step(const StepObservation& o) {
  std::lock_guard<std::mutex> lock(mu_);
  if (o.decoding == 0) return;
  decode_steps_++;
  verify_budget_.observe(o.verified);
  for (size_t r = 0; r < o.verified_per_request.size(); ++r) {
    const int v = o.verified_per_request[r], a = o.accepted_per_request[r];
    rounds_++;
    tokens_per_round_.observe(a + 1);
    for (int k = 0; k < v && k < max_drafts_; ++k) {
      pos_verified_[static_cast<size_t>(k)]++;
      if (k < a) pos_accepted_[static_cast<size_t>(k)]++;
    }
  }
}

void ServerMetrics::observe_request(const RequestTiming& t) {
  std::lock_guard<std::mutex> lock(mu_);
  outcomes_[t.outcome]++;
  e2e_.observe(t.e2e_s);
  if (t.ttft_s >= 0) {
    ttft_.observe(t.ttft_s);
    if (t.completion_tokens > 1) tpot_.observe((t.e2e_s - t.ttft_s) / (t.completion_tokens - 1));
  }
}

void ServerMetrics::count_rejected(int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  rejected_[http_status]++;
}

void ServerMetrics::count_config_change() {
  std::lock_guard<std::mutex> lock(mu_);
  config_changes_++;
}

std::string ServerMetrics::render(const EngineStats& st, const std::string& model_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out.reserve(16384);
  header(out, "dsinfer_build_info", "gauge", "Constant 1, labelled with the served model");
  std::string safe_id;
  for (char c : model_id) {
    if (c == '\\' || c == '"') safe_id += '\\';
    if (c == '\n') { safe_id += "\\n"; continue; }
    safe_id += c;
  }
  sample(out, "dsinfer_build_info", 1, "model=\"" + safe_id + "\",version=\"0.1.0\"");

  // The article's three figures.
  gauge(out, "dflash_kv_reuse_rate",
        "Accepted draft tokens / generated tokens since start (tokens that skipped their own target pass)",
        st.generated_tokens ? static_cast<double>(st.accepted_draft_tokens) / static_cast<double>(st.generated_tokens) : 0.0);
  gauge(out, "dspark_cache_hit_ratio", "Prompt tokens served from cached KV / prompt tokens of admitted requests",
        st.kv_pool.hit_ratio);
  counter(out, "dflash_validation_failures_total", "Verified draft tokens the target rejected",
          static_cast<double>(st.verified_draft_tokens - st.accepted_draft_tokens));

  // Requests.
  header(out, "dsinfer_requests_total", "counter",
         "Requests that reached the engine, by outcome (stop, length, disconnected, cancelled, error)");
  for (const char* o : {"stop", "length", "disconnected", "cancelled", "error"}) {
    auto it = outcomes_.find(o);
    sample(out, "dsinfer_requests_total", it == outcomes_.end() ? 0.0 : static_cast<double>(it->second),
           std::string("outcome=\"") + o + "\"");
  }
  header(out, "dsinfer_requests_rejected_total", "counter", "Requests refused before the engine, by HTTP status");
  for (int code : {400, 401, 404, 405, 413, 503}) {
    auto it = rejected_.find(code);
    sample(out, "dsinfer_requests_rejected_total", it == rejected_.end() ? 0.0 : static_cast<double>(it->second),
           "code=\"" + std::to_string(code) + "\"");
  }
  gauge(out, "dsinfer_requests_waiting", "Requests queued for admission (queue depth)", st.waiting);
  gauge(out, "dsinfer_requests_running", "Requests holding KV and decoding", st.running);
  header(out, "dsinfer_time_to_first_token_seconds", "histogram", "Arrival to first generated token");
  ttft_.render(out, "dsinfer_time_to_first_token_seconds");
  header(out, "dsinfer_time_per_output_token_seconds", "histogram",
         "Per request: (end - first token) / (completion tokens - 1)");
  tpot_.render(out, "dsinfer_time_per_output_token_seconds");
  header(out, "dsinfer_e2e_request_latency_seconds", "histogram", "Arrival to the request's last event");
  e2e_.render(out, "dsinfer_e2e_request_latency_seconds");

  // Tokens and speculation.
  counter(out, "dsinfer_prompt_tokens_total", "Prompt tokens prefilled", static_cast<double>(st.prompt_tokens));
  counter(out, "dsinfer_generation_tokens_total", "Tokens generated", static_cast<double>(st.generated_tokens));
  counter(out, "dsinfer_drafted_tokens_total", "Draft tokens proposed (before the verify policy)",
          static_cast<double>(st.drafted_tokens));
  counter(out, "dsinfer_verified_draft_tokens_total", "Draft tokens verified by the target",
          static_cast<double>(st.verified_draft_tokens));
  counter(out, "dsinfer_accepted_draft_tokens_total", "Draft tokens accepted", static_cast<double>(st.accepted_draft_tokens));
  counter(out, "dsinfer_engine_steps_total", "Engine steps (one target forward each)", static_cast<double>(st.steps));
  counter(out, "dsinfer_decode_steps_total", "Engine steps with at least one verify entry",
          static_cast<double>(decode_steps_));
  header(out, "dsinfer_verify_budget_per_step", "histogram",
         "Draft tokens verified in one engine step, over all its requests (steps with a verify entry)");
  verify_budget_.render(out, "dsinfer_verify_budget_per_step");
  header(out, "dsinfer_spec_tokens_per_round", "histogram",
         "Tau: tokens a verify round commits (accepted drafts + 1), one observation per request-round");
  tokens_per_round_.render(out, "dsinfer_spec_tokens_per_round");
  header(out, "dsinfer_spec_position_verified_total", "counter", "Verify rounds that verified a draft at this position");
  for (int k = 0; k < max_drafts_; ++k)
    sample(out, "dsinfer_spec_position_verified_total", static_cast<double>(pos_verified_[static_cast<size_t>(k)]),
           "position=\"" + std::to_string(k + 1) + "\"");
  header(out, "dsinfer_spec_position_accepted_total", "counter", "Verify rounds that accepted the draft at this position");
  for (int k = 0; k < max_drafts_; ++k)
    sample(out, "dsinfer_spec_position_accepted_total", static_cast<double>(pos_accepted_[static_cast<size_t>(k)]),
           "position=\"" + std::to_string(k + 1) + "\"");
  counter(out, "dsinfer_self_heal_fallbacks_total",
          "Requests routed to plain decoding after their acceptance collapsed (re-probed later)",
          static_cast<double>(st.self_heal_fallbacks));
  counter(out, "dsinfer_lookup_rounds_total",
          "Verify blocks whose drafts came from the lookup assist instead of a drafter pass (--spec-lookup)",
          static_cast<double>(st.lookup_rounds));
  counter(out, "dsinfer_async_prefetch_passes_total",
          "Drafter passes run on the async-prefetch thread while a forward verified other requests",
          static_cast<double>(st.prefetch_passes));
  counter(out, "dsinfer_engine_step_seconds_total", "Wall time of engine steps that did work",
          st.step_seconds);
  counter(out, "dsinfer_engine_draft_seconds_total",
          "Wall time of drafter passes (context commit + propose; overlapping the forward with async prefetch)",
          st.draft_seconds);
  counter(out, "dsinfer_engine_forward_seconds_total", "Wall time of target forwards", st.forward_seconds);
  counter(out, "dsinfer_drafting_choice_steps_total", "Steps the dspark drafting choice decided",
          static_cast<double>(st.choice_steps));
  counter(out, "dsinfer_drafting_choice_closed_total",
          "Steps where no number of drafting requests could pay at that load (nobody drafted or probed)",
          static_cast<double>(st.choice_closed));
  counter(out, "dsinfer_drafting_choice_chosen_total", "Requests the drafting choice chose by estimated gain",
          static_cast<double>(st.choice_chosen));
  counter(out, "dsinfer_drafting_choice_probes_total", "Re-probes of requests left out of drafting",
          static_cast<double>(st.choice_probes));
  counter(out, "dsinfer_capture_skipped_steps_total",
          "Forwards run without the drafter's layer captures (closed load, or nobody left who can draft)",
          static_cast<double>(st.capture_skipped_steps));
  counter(out, "dsinfer_drafting_retired_total",
          "Requests retired from drafting because rows of their context were computed without captures",
          static_cast<double>(st.drafting_retired));
  counter(out, "dsinfer_drafting_rearmed_total",
          "Retired requests given a fresh drafter context from their current position once the load reopened",
          static_cast<double>(st.drafting_rearmed));
  counter(out, "dsinfer_config_changes_total", "Accepted POST /api/v1/config/dflash", static_cast<double>(config_changes_));

  // KV memory: the engine's paged block pool (engine/block_pool.h).
  const PoolStats& p = st.kv_pool;
  gauge(out, "dsinfer_kv_blocks_capacity", "KV blocks in the pool", static_cast<double>(p.total));
  gauge(out, "dsinfer_kv_blocks_used", "KV blocks referenced by at least one request", static_cast<double>(p.used));
  gauge(out, "dsinfer_kv_blocks_free", "KV blocks on the free lists", static_cast<double>(p.free));
  gauge(out, "dsinfer_kv_blocks_cached", "KV blocks that are prefix-cache entries (in use or idle)",
        static_cast<double>(p.cached));
  gauge(out, "dsinfer_kv_blocks_cached_idle", "Prefix-cache blocks no request holds (evictable)",
        static_cast<double>(p.cached_idle));
  gauge(out, "dsinfer_kv_block_tokens", "Token positions per KV block", p.block_size);
  gauge(out, "dsinfer_kv_cache_fragmentation_ratio",
        "Slots reserved by requests but holding no token / slots of the blocks in use", p.fragmentation);
  int64_t evictions = 0;
  for (const ShardStats& sh : p.shards) evictions += sh.evictions;
  counter(out, "dsinfer_kv_cache_evictions_total", "Prefix-cache entries evicted to make room", static_cast<double>(evictions));
  counter(out, "dsinfer_kv_copy_on_write_total", "Shared partial blocks copied before a write", static_cast<double>(p.cow_copies));
  counter(out, "dsinfer_kv_alloc_failures_total", "Pool allocations that found no block", static_cast<double>(p.alloc_failures));
  counter(out, "dsinfer_preemptions_total", "Running requests sent back to the queue for lack of KV blocks",
          static_cast<double>(st.preemptions));
  counter(out, "dsinfer_cache_defrags_total", "Idle compactions of the KV pool", static_cast<double>(st.cache_defrags));
  counter(out, "dsinfer_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache",
          static_cast<double>(p.cached_prompt_tokens));

  // Process memory (Linux /proc/self/status): current and peak resident set.
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    double rss = -1, hwm = -1;
    unsigned long kb = 0;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "VmRSS: %lu kB", &kb) == 1) rss = kb * 1024.0;
      if (std::sscanf(line, "VmHWM: %lu kB", &kb) == 1) hwm = kb * 1024.0;
    }
    std::fclose(f);
    if (rss >= 0) gauge(out, "process_resident_memory_bytes", "Resident memory of the server process", rss);
    if (hwm >= 0) gauge(out, "dsinfer_memory_peak_bytes", "Peak resident memory of the server process", hwm);
  }
  return out;
}

nlohmann::json ServerMetrics::cache_stats_json(const EngineStats& st) const {
  const PoolStats& p = st.kv_pool;
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardStats& sh : p.shards)
    shards.push_back({{"total", sh.total}, {"used", sh.used}, {"free", sh.free}, {"cached", sh.cached},
                      {"cached_idle", sh.cached_idle}, {"hit_blocks", sh.hit_blocks}, {"evictions", sh.evictions},
                      {"lent", sh.lent}});
  return {{"block_size", p.block_size},
          {"blocks_total", p.total},
          {"blocks_used", p.used},
          {"blocks_free", p.free},
          {"blocks_cached", p.cached},
          {"blocks_cached_idle", p.cached_idle},
          {"prompt_tokens", p.prompt_tokens},
          {"cached_prompt_tokens", p.cached_prompt_tokens},
          {"cache_hit_ratio", p.hit_ratio},
          {"unused_slots", p.unused_slots},
          {"allocated_slots", p.allocated_slots},
          {"cache_fragmentation_ratio", p.fragmentation},
          {"alloc_failures", p.alloc_failures},
          {"copy_on_write", p.cow_copies},
          {"dedup_swaps", p.dedup_swaps},
          {"preemptions", st.preemptions},
          {"cache_defrags", st.cache_defrags},
          {"defrag_moves", st.defrag_moves},
          {"warmup_prompts", st.warmup_prompts},
          {"requests_running", st.running},
          {"requests_waiting", st.waiting},
          {"shards", shards}};
}

}  // namespace dsinfer::server
