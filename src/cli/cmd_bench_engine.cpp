// dsinfer CLI: `dsinfer bench-engine` — offline throughput of the in-process batched engine
// (engine/llm_engine.h) over concurrency levels and verify policies, on real prompts.
//
// For each policy (none = plain decoding; fixed / threshold / dspark with the drafter) and
// each concurrency C: an engine with C KV slots gets N requests at once (N = max(C, 8) ×
// --rounds-per-slot); it keeps C of them running. Reported per cell: output tokens/s
// (all generated tokens / wall time), tokens/s per request (mean over requests of
// generated tokens after the first / time from first to last token), mean τ and the
// policy's drafts verified per request-step. The dspark policy gets SPS(B) profiled at
// start-up (verify-only curve at B = 1, 2, 4, ..., plus the measured per-request draft
// time; sps_profile.h). Prints a Markdown table (or --json).
//
// KV pool flags (each engine gets a fresh pool): --kv-block-size, --kv-blocks (explicit
// pool size, e.g. small to force preemption), --cache-prealloc-ratio (pool = that share
// of the memory available after loading the weights), --dspark-shard-count,
// --enable-cache-defrag, --cache-warmup-file (prompts prefilled into the prefix cache at
// each engine's start). Per cell the pool's hit ratio, preemptions and peak blocks in use
// are reported. --dspark-scheduler-policy picks the admission order (engine/scheduler.h).
//
// --device cuda (a build with DSINFER_CUDA=ON): the target runs on the GPU with its paged KV
// pool in device memory (--cache-prealloc-ratio then takes that share of the device's free
// memory), greedy steps bring back only argmax ids, the drafter runs on the CPU. A model
// directory without tokenizer.json takes only {"prompt_ids": [...]} prompts (random-weight
// checkpoints of make-random-model).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/llm_engine.h"
#include "engine/sps_profile.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/calibration_runner.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "spec/v4_dspark_drafter.h"
#include "spec/prefix_scheduler.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

struct BenchEngineArgs {
  std::string matmul_precision = "auto";
  std::string model_path, draft_model_path, prompts_path;
  DeviceArgs dev;  // --device cpu|cuda, --cuda-gemm, --cuda-graphs
  std::string concurrency = "1,4,16,64,128";
  std::string policies = "none,fixed,threshold,dspark";
  int max_tokens = 64, prompt_tokens = 256, rounds_per_slot = 2, threads = 0;
  int repeat = 1;  // --repeat: the whole grid this many times, interleaved; medians reported
  float threshold = 0.3f;
  bool json = false;
  // KV pool.
  int kv_block_size = 16, shard_count = 8;
  int64_t kv_blocks = 0;
  double cache_prealloc_ratio = 0.0;
  bool prealloc_given = false;
  bool enable_cache_defrag = false;
  std::string cache_warmup_file;
  std::string scheduler_policy = "fcfs";
  // Speculation health and the benchmark-only synthetic acceptance.
  int dsw_min = 0, dsw_max = 0, self_heal_rounds = 5;
  double synthetic_acceptance = -1.0;
  // Sampling of every request (default greedy); request i is seeded with i.
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  // --dflash-enable-async-prefetch: every speculative policy prefetches (a policy name
  // ending in "+prefetch" does it for that entry only); drafter threads of the worker.
  bool async_prefetch = false;
  int async_draft_threads = 0;
  int draft_vocab = -1;  // DrafterOptions::draft_vocab_size
  std::string draft_vocab_file;
};

// MemAvailable of /proc/meminfo in bytes (the budget --cache-prealloc-ratio takes a share of).
uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  throw Error("--cache-prealloc-ratio: cannot read MemAvailable from /proc/meminfo");
}

std::vector<int> parse_int_list(const std::string& s, const char* flag) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t used = 0;
      int x = std::stoi(item, &used);
      if (used != item.size() || x < 1) throw std::invalid_argument("");
      v.push_back(x);
    } catch (const std::exception&) {
      throw Error(std::string(flag) + ": '" + item + "' is not a positive integer");
    }
  }
  if (v.empty()) throw Error(std::string(flag) + ": empty list");
  return v;
}

// A --policies entry: the verify policy, whether it ends in "+prefetch" (async prefetch) and
// whether in "+lookup" (the lookup assist, EngineOptions::lookup_assist).
struct PolicyEntry {
  std::string policy;
  bool prefetch = false;
  bool lookup = false;
};
PolicyEntry parse_policy_entry(const std::string& entry) {
  PolicyEntry e;
  e.policy = entry;
  auto strip = [&e](const std::string& suffix) {
    const std::string& s = e.policy;
    if (s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) {
      e.policy = s.substr(0, s.size() - suffix.size());
      return true;
    }
    return false;
  };
  // In either order: dspark+lookup+prefetch, dspark+prefetch+lookup.
  for (int i = 0; i < 2; ++i) {
    if (strip("+prefetch")) e.prefetch = true;
    if (strip("+lookup")) e.lookup = true;
  }
  return e;
}

struct Cell {
  std::string policy;
  int concurrency = 0, requests = 0;
  double seconds = 0, out_tok_s = 0, per_request_tok_s = 0, tau = 0, verified_per_step = 0;
  uint64_t tokens = 0;
  // KV pool: blocks, peak blocks in use, prefix-cache hit ratio, preemptions.
  int64_t kv_blocks = 0, kv_peak_used = 0;
  double hit_ratio = 0;
  uint64_t preemptions = 0;
  // Engine steps that did work and where their wall time went, ms per step (EngineStats).
  uint64_t steps = 0;
  double step_ms = 0, draft_ms = 0, forward_ms = 0;
  uint64_t choice_steps = 0, choice_closed = 0, choice_chosen = 0, choice_probes = 0;
  uint64_t capture_skipped_steps = 0, drafting_retired = 0, drafting_rearmed = 0;
  // Over --repeat runs: how many, and the range of output tok/s.
  int runs = 1;
  double out_tok_s_min = 0, out_tok_s_max = 0;
};

// The median cell of each (policy, concurrency) over the repeated runs (by output tok/s;
// its other figures come with it), in first-seen order. Repeats are interleaved (the whole
// grid once per repeat), so a slow spell of a shared machine hits every policy alike.
std::vector<Cell> median_cells(const std::vector<Cell>& runs) {
  std::vector<Cell> out;
  std::vector<std::vector<Cell>> groups;
  for (const Cell& c : runs) {
    size_t g = 0;
    while (g < groups.size() && !(groups[g][0].policy == c.policy && groups[g][0].concurrency == c.concurrency)) ++g;
    if (g == groups.size()) groups.emplace_back();
    groups[g].push_back(c);
  }
  for (auto& g : groups) {
    std::sort(g.begin(), g.end(), [](const Cell& a, const Cell& b) { return a.out_tok_s < b.out_tok_s; });
    Cell m = g[(g.size() - 1) / 2];
    if (g.size() % 2 == 0) {  // even count: the mean of the two middle runs' rates
      const Cell& hi = g[g.size() / 2];
      m.out_tok_s = 0.5 * (m.out_tok_s + hi.out_tok_s);
      m.per_request_tok_s = 0.5 * (m.per_request_tok_s + hi.per_request_tok_s);
    }
    m.runs = static_cast<int>(g.size());
    m.out_tok_s_min = g.front().out_tok_s;
    m.out_tok_s_max = g.back().out_tok_s;
    out.push_back(m);
  }
  return out;
}

int run_bench_engine(const BenchEngineArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  apply_matmul_precision(a.matmul_precision);
  const std::vector<int> levels = parse_int_list(a.concurrency, "--concurrency");
  std::vector<std::string> policies;
  {
    std::stringstream ss(a.policies);
    for (std::string p; std::getline(ss, p, ',');) {
      const auto [base, pre, lookup] = parse_policy_entry(p);
      if (base != "none" && base != "fixed" && base != "threshold" && base != "dspark" && base != "dspark-async")
        throw Error("--policies: unknown policy '" + p +
                    "' (none, fixed, threshold, dspark, dspark-async; +prefetch for async prefetch, +lookup for the lookup assist)");
      if (base == "none" && pre) throw Error("--policies: 'none+prefetch': plain decoding has no drafts to prefetch");
      if (base == "none" && lookup) throw Error("--policies: 'none+lookup': the lookup assist needs a model drafter");
      policies.push_back(p);
    }
  }
  parse_scheduler_policy(a.scheduler_policy);  // refuse a bad name before loading anything
  auto model = load_model_on_device(a.model_path, a.dev);
  if (device_is_cuda(a.dev)) std::fprintf(stderr, "bench-engine: target on %s\n", device_summary(a.dev).c_str());
  // Text prompts need the tokenizer; a directory without one takes prompt_ids only.
  std::unique_ptr<Tokenizer> tok;
  tok = load_model_tokenizer(a.model_path, *model);
  std::function<std::vector<int32_t>(const std::string&)> encode;  // none: text prompts are refused by name
  if (tok) encode = [&](const std::string& t) { return tok->encode(t, false); };
  std::unique_ptr<Drafter> drafter;
  std::optional<Calibration> cal;
  const bool needs_drafter = std::any_of(policies.begin(), policies.end(), [](auto& p) { return p != "none"; });
  if (needs_drafter) {
    // A DeepSeek-V4 target carries its own DSpark drafter (mtp.*): used when none is given.
    const std::string draft_dir = !a.draft_model_path.empty() ? a.draft_model_path
                                  : is_deepseek_v4_dir(a.model_path) ? a.model_path
                                                                     : std::string();
    if (draft_dir.empty()) throw Error("--draft-model-path: needed by the policies other than none");
    DrafterOptions dopts;
    dopts.draft_vocab_size = a.draft_vocab;
    dopts.draft_vocab_file = a.draft_vocab_file;
    drafter = load_drafter(draft_dir, *model, dopts);
    cal = load_calibration(draft_dir);
  }
  // The same JSON-lines format as `dsinfer calibrate`: {"prompt": text} or {"prompt_ids": [...]}.
  std::vector<std::vector<int32_t>> prompts = read_calibration_prompts(a.prompts_path, model->config().vocab_size, encode);
  for (auto& ids : prompts)
    if (static_cast<int>(ids.size()) > a.prompt_tokens) ids.resize(static_cast<size_t>(a.prompt_tokens));
  std::vector<std::vector<int32_t>> warmup;
  if (!a.cache_warmup_file.empty()) {
    try {
      warmup = read_calibration_prompts(a.cache_warmup_file, model->config().vocab_size, encode);
    } catch (const Error& e) {  // the reader names its usual flag, --prompts
      std::string msg = e.what();
      if (msg.rfind("--prompts", 0) == 0) msg.replace(0, 9, "--cache-warmup-file");
      throw Error(msg);
    }
  }
  for (auto& ids : warmup)  // cut like the prompts, so a warm-up prompt is a prefix of its request
    if (static_cast<int>(ids.size()) > a.prompt_tokens) ids.resize(static_cast<size_t>(a.prompt_tokens));
  uint64_t kv_budget = 0;
  if (a.prealloc_given && a.kv_blocks > 0) throw Error("--kv-blocks, --cache-prealloc-ratio: give one of them, not both");
  if (a.prealloc_given && !(a.cache_prealloc_ratio > 0.0))
    throw Error("--cache-prealloc-ratio: must be in (0, 1], got " + std::to_string(a.cache_prealloc_ratio));
  if (a.prealloc_given) {
    kv_budget = available_memory_bytes();
    if (model->device_kv_blocks(a.kv_block_size, a.cache_prealloc_ratio, 0) > 0)
      std::fprintf(stderr, "bench-engine: KV pool in device memory: --cache-prealloc-ratio %.2f of the free device memory\n",
                   a.cache_prealloc_ratio);
    else
      std::fprintf(stderr, "bench-engine: KV budget %.1f GiB available x --cache-prealloc-ratio %.2f\n",
                   static_cast<double>(kv_budget) / (1ull << 30), a.cache_prealloc_ratio);
  }

  // SPS(B) for the dspark policy: verify-only points up to the largest batch, plus t_draft.
  std::optional<SpsTable> sps;
  double draft_ms = 0;
  DraftCostTable draft_cost;
  if (std::any_of(policies.begin(), policies.end(), [](const std::string& p) { return p.rfind("dspark", 0) == 0; })) {
    if (!drafter->info().confidence_head) throw Error("--policies dspark / dspark-async: the drafter has no confidence head");
    SpsProfileOptions po;
    const int max_b = *std::max_element(levels.begin(), levels.end()) * (drafter->info().max_draft_tokens + 1);
    for (int b = 1; b < max_b; b *= 2) po.points.push_back(b);
    po.points.push_back(max_b);
    po.include_draft = false;
    po.repeats = 3;
    sps = profile_sps(*model, drafter.get(), po, &draft_ms);
    draft_cost = profile_draft_cost(*model, *drafter, draft_cost_batches(*std::max_element(levels.begin(), levels.end())));
    std::fprintf(stderr, "bench-engine: profiled SPS(B) at %zu points up to B = %d (verify ms: %s); drafter pass %s\n",
                 po.points.size(), max_b, sps_curve_summary(*sps).c_str(), draft_cost_summary(draft_cost).c_str());
  }

  std::vector<Cell> runs;
  using clock = std::chrono::steady_clock;
  for (int rep = 0; rep < a.repeat; ++rep)
  for (const std::string& entry : policies)
    for (int c : levels) {
      const auto [policy, prefetch_entry, lookup_entry] = parse_policy_entry(entry);
      EngineOptions o;
      if (policy != "none") {
        o.async_prefetch = prefetch_entry || a.async_prefetch;
        o.lookup_assist = lookup_entry;
        o.async_draft_threads = a.async_draft_threads;
      }
      o.max_running = c;
      o.tokenizer = nullptr;
      o.max_model_len = a.prompt_tokens + a.max_tokens + 1;
      if (policy != "none") {
        o.drafter = drafter.get();
        o.calibration = cal ? &*cal : nullptr;
      }
      o.max_batch_tokens = std::max(512, c * ((drafter && policy != "none") ? drafter->info().max_draft_tokens + 1 : 1));
      o.prefill_step_tokens = std::max(512, c);  // every policy chunks prompts as plain decoding does
      o.kv_block_size = a.kv_block_size;
      o.kv_num_blocks = a.kv_blocks;
      o.kv_budget_bytes = kv_budget;
      if (a.prealloc_given) o.cache_prealloc_ratio = a.cache_prealloc_ratio;
      o.shard_count = a.shard_count;
      o.enable_cache_defrag = a.enable_cache_defrag;
      o.cache_warmup_prompts = warmup;
      o.scheduler_policy = parse_scheduler_policy(a.scheduler_policy);
      o.health.min_window = a.dsw_min;
      o.health.max_window = a.dsw_max;
      o.health.collapse_rounds = a.self_heal_rounds;
      if (policy != "none") o.synthetic_acceptance_rate = a.synthetic_acceptance;
      if (policy == "threshold") {
        o.policy = VerifyPolicy::Threshold;
        o.validation_threshold = a.threshold;
      } else if (policy == "dspark" || policy == "dspark-async") {
        o.policy = policy == "dspark" ? VerifyPolicy::DSpark : VerifyPolicy::DSparkAsync;
        o.sps = &*sps;
        o.draft_ms_per_request = draft_ms;
        o.draft_cost = draft_cost;
      }
      LLMEngine engine(*model, o);
      const int n = std::max(c, 8) * a.rounds_per_slot;
      struct Track {
        clock::time_point first, last;
        int tokens = 0;
        double tau = 0;
      };
      std::map<uint64_t, Track> tracks;
      // A request that fails (finish_reason "error") makes the cell's figures meaningless:
      // the run stops with its message instead of printing a throughput of what was left.
      std::string failed;
      for (int i = 0; i < n; ++i) {
        EngineRequest req;
        req.prompt = prompts[static_cast<size_t>(i) % prompts.size()];
        req.stop.max_tokens = a.max_tokens;
        req.sampling.temperature = a.temperature;
        req.sampling.top_k = a.top_k;
        req.sampling.top_p = a.top_p;
        req.sampling.seed = static_cast<uint64_t>(i);
        req.on_event = [&tracks, &failed](const RequestEvent& ev) {
          if (ev.finished && ev.finish_reason == "error" && failed.empty())
            failed = "request " + std::to_string(ev.id) + " failed: " + ev.error;
          Track& t = tracks[ev.id];
          const auto now = clock::now();
          if (t.tokens == 0 && !ev.new_ids.empty()) t.first = now;
          t.tokens += static_cast<int>(ev.new_ids.size());
          if (!ev.new_ids.empty()) t.last = now;
          if (ev.finished) t.tau = ev.spec.rounds ? ev.spec.tau() : 1.0;
        };
        engine.submit(std::move(req));
      }
      const auto t0 = clock::now();
      int64_t peak = 0;
      while (engine.step()) peak = std::max<int64_t>(peak, engine.stats().kv_blocks_used);
      if (!failed.empty()) throw Error("bench-engine: policy " + policy + ", concurrency " + std::to_string(c) + ": " + failed);
      const double secs = std::chrono::duration<double>(clock::now() - t0).count();
      Cell cell;
      cell.policy = policy + (o.lookup_assist ? "+lookup" : "") + (o.async_prefetch ? "+prefetch" : "");
      cell.concurrency = c;
      cell.requests = n;
      cell.seconds = secs;
      double per_req = 0, tau = 0;
      for (const auto& [id, t] : tracks) {
        cell.tokens += static_cast<uint64_t>(t.tokens);
        const double d = std::chrono::duration<double>(t.last - t.first).count();
        per_req += d > 0 ? (t.tokens - 1) / d : 0.0;
        tau += t.tau;
      }
      cell.out_tok_s = static_cast<double>(cell.tokens) / secs;
      cell.per_request_tok_s = per_req / static_cast<double>(tracks.size());
      cell.tau = tau / static_cast<double>(tracks.size());
      const EngineStats st = engine.stats();
      cell.verified_per_step = st.verify_entries ? static_cast<double>(st.verified_draft_tokens) / st.verify_entries : 0.0;
      cell.kv_blocks = st.kv_pool.total;
      cell.kv_peak_used = peak;
      cell.hit_ratio = st.kv_pool.hit_ratio;
      cell.preemptions = st.preemptions;
      cell.steps = st.steps;
      cell.choice_steps = st.choice_steps;
      cell.choice_closed = st.choice_closed;
      cell.choice_chosen = st.choice_chosen;
      cell.choice_probes = st.choice_probes;
      cell.capture_skipped_steps = st.capture_skipped_steps;
      cell.drafting_retired = st.drafting_retired;
      cell.drafting_rearmed = st.drafting_rearmed;
      if (st.steps) {
        const double k = 1e3 / static_cast<double>(st.steps);
        cell.step_ms = st.step_seconds * k;
        cell.draft_ms = st.draft_seconds * k;
        cell.forward_ms = st.forward_seconds * k;
      }
      runs.push_back(cell);
      std::fprintf(stderr,
                   "  %-9s C=%-4d %6.1f tok/s  %6.1f tok/s/request  tau %.2f  (%d requests, %.1f s; KV %lld blocks, "
                   "peak %lld used, hit ratio %.2f, %llu preemptions)\n",
                   cell.policy.c_str(), c, cell.out_tok_s, cell.per_request_tok_s, cell.tau, n, secs,
                   static_cast<long long>(cell.kv_blocks), static_cast<long long>(cell.kv_peak_used), cell.hit_ratio,
                   static_cast<unsigned long long>(cell.preemptions));
      std::fprintf(stderr, "            %llu steps, %.3f ms each: drafter %.3f, target forward %.3f, engine %.3f\n",
                   static_cast<unsigned long long>(cell.steps), cell.step_ms, cell.draft_ms, cell.forward_ms,
                   cell.step_ms - cell.draft_ms - cell.forward_ms);
      if (cell.choice_steps)
        std::fprintf(stderr,
                     "            drafting choice: %llu steps, %llu closed (no k could pay at 3/4 of a block), %.2f requests chosen "
                     "per open step, %llu re-probes; %llu steps without captures, %llu requests retired from drafting, "
                     "%llu re-armed\n",
                     static_cast<unsigned long long>(cell.choice_steps), static_cast<unsigned long long>(cell.choice_closed),
                     cell.choice_steps > cell.choice_closed
                         ? static_cast<double>(cell.choice_chosen) / static_cast<double>(cell.choice_steps - cell.choice_closed)
                         : 0.0,
                     static_cast<unsigned long long>(cell.choice_probes),
                     static_cast<unsigned long long>(cell.capture_skipped_steps),
                     static_cast<unsigned long long>(cell.drafting_retired),
                     static_cast<unsigned long long>(cell.drafting_rearmed));
    }

  const std::vector<Cell> cells = median_cells(runs);
  if (a.json) {
    nlohmann::ordered_json j;
    j["repeat"] = a.repeat;
    j["device"] = device_summary(a.dev);
    j["threads"] = ThreadPool::global().size();
    j["max_tokens"] = a.max_tokens;
    if (a.synthetic_acceptance > 0) j["synthetic_acceptance_rate"] = a.synthetic_acceptance;  // benchmark mode: not the target's output
    j["prompt_tokens_max"] = a.prompt_tokens;
    for (const Cell& c : cells)
      j["cells"].push_back({{"policy", c.policy}, {"concurrency", c.concurrency}, {"requests", c.requests},
                            {"seconds", c.seconds}, {"output_tokens", c.tokens}, {"output_tokens_per_s", c.out_tok_s},
                            {"tokens_per_s_per_request", c.per_request_tok_s}, {"tau", c.tau},
                            {"drafts_verified_per_step", c.verified_per_step}, {"kv_blocks", c.kv_blocks},
                            {"kv_peak_blocks_used", c.kv_peak_used}, {"cache_hit_ratio", c.hit_ratio},
                            {"preemptions", c.preemptions}, {"steps", c.steps}, {"step_ms", c.step_ms},
                            {"step_draft_ms", c.draft_ms}, {"step_forward_ms", c.forward_ms},
                            {"choice_steps", c.choice_steps}, {"choice_closed", c.choice_closed},
                            {"choice_chosen", c.choice_chosen}, {"choice_probes", c.choice_probes},
                            {"capture_skipped_steps", c.capture_skipped_steps}, {"drafting_retired", c.drafting_retired}, {"drafting_rearmed", c.drafting_rearmed},
                            {"runs", c.runs},
                            {"output_tokens_per_s_min", c.out_tok_s_min}, {"output_tokens_per_s_max", c.out_tok_s_max}});
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  if (a.synthetic_acceptance > 0)
    std::printf("SYNTHETIC ACCEPTANCE %.3f: drafts accepted at random, output is not the target's (benchmark mode)\n",
                a.synthetic_acceptance);
  if (device_is_cuda(a.dev)) std::printf("device %s\n", device_summary(a.dev).c_str());
  std::printf("threads %d, %d new tokens per request, prompts <= %d tokens%s\n\n", ThreadPool::global().size(),
              a.max_tokens, a.prompt_tokens,
              a.repeat > 1 ? (", median of " + std::to_string(a.repeat) + " interleaved runs (range in brackets)").c_str() : "");
  std::printf("| policy | concurrency | output tok/s | tok/s per request | τ | drafts verified/step | × none |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Cell& c : cells) {
    double base = 0;
    for (const Cell& b : cells)
      if (b.policy == "none" && b.concurrency == c.concurrency) base = b.out_tok_s;
    char range[64] = "";
    if (c.runs > 1) std::snprintf(range, sizeof range, " [%.0f-%.0f]", c.out_tok_s_min, c.out_tok_s_max);
    std::printf("| %s | %d | %.1f%s | %.1f | %.2f | %.2f | %s |\n", c.policy.c_str(), c.concurrency, c.out_tok_s, range,
                c.per_request_tok_s, c.tau, c.verified_per_step,
                base > 0 ? (std::to_string(c.out_tok_s / base).substr(0, 4)).c_str() : "–");
  }
  return 0;
}

}  // namespace

Runner register_bench_engine(CLI::App& app) {
  auto a = std::make_shared<BenchEngineArgs>();
  CLI::App* sub = app.add_subcommand("bench-engine", "Offline throughput of the batched engine over concurrency and verify policies");
  sub->add_option("--model-path", a->model_path, "Target model directory")->required();
  sub->add_option("--draft-model-path", a->draft_model_path, "DSpark/DFlash drafter (needed by fixed/threshold/dspark; left out: a DeepSeek-V4 target's own mtp.* stages)");
  add_draft_vocab_options(sub, &a->draft_vocab, &a->draft_vocab_file);
  sub->add_option("--prompts", a->prompts_path, "JSON lines: {\"prompt\": text} or {\"prompt_ids\": [...]}")->required();
  sub->add_option("--concurrency", a->concurrency, "Comma list of concurrency levels (KV slots)");
  sub->add_option("--policies", a->policies,
                  "Comma list: none, fixed, threshold, dspark, dspark-async; a suffix +lookup adds the lookup assist, "
                  "+prefetch async prefetch");
  sub->add_option("--max-tokens", a->max_tokens, "New tokens per request")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--prompt-tokens", a->prompt_tokens, "Prompts cut to at most this many tokens")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--repeat", a->repeat, "Run the whole grid this many times, interleaved; report medians")
      ->check(CLI::Range(1, 100));
  sub->add_option("--rounds-per-slot", a->rounds_per_slot, "Requests per level = max(C, 8) x this")->check(CLI::Range(1, 1000));
  sub->add_option("--threshold", a->threshold, "Validation threshold of the threshold policy")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--threads", a->threads, "Worker threads (default: all hardware threads)")->check(CLI::Range(1, 1024));
  add_matmul_precision_option(sub, &a->matmul_precision);
  add_device_options(sub, &a->dev, /*with_cache_prealloc=*/false);
  sub->add_option("--kv-block-size", a->kv_block_size, "Tokens per KV block of the paged pool")->check(CLI::Range(1, 4096));
  sub->add_option("--kv-blocks", a->kv_blocks, "KV pool size in blocks (default: max concurrency full-length requests)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--dspark-scheduler-policy", a->scheduler_policy,
                  "Admission order of waiting requests: fcfs, hit-rate, latency-aware, hybrid (with ageing)");
  CLI::Option* prealloc = sub->add_option("--cache-prealloc-ratio", a->cache_prealloc_ratio,
                  "Size the KV pool as this share (0, 1] of the memory available after loading the weights")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--dspark-shard-count", a->shard_count, "Shards of the KV block pool")->check(CLI::Range(1, 4096));
  sub->add_flag("--enable-cache-defrag", a->enable_cache_defrag, "Compact the KV pool whenever the engine goes idle");
  sub->add_option("--cache-warmup-file", a->cache_warmup_file,
                  "JSON lines ({\"prompt\": text} or {\"prompt_ids\": [...]}) prefilled into the prefix cache at start-up");
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->add_flag("--dflash-enable-async-prefetch", a->async_prefetch,
                "Speculative policies draft one cohort of requests while the target verifies the other (a second thread)");
  sub->add_option("--async-draft-threads", a->async_draft_threads,
                  "Kernel threads of the async drafter thread (default: half of --threads, at least 1)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--dspark-dsw-min-window", a->dsw_min, "Dynamic drafter window: lower bound (with --dspark-dsw-max-window)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--dspark-dsw-max-window", a->dsw_max, "Dynamic drafter window: upper bound (0 = off)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--dspark-self-heal-rounds", a->self_heal_rounds,
                  "Rounds without an accepted draft before a request falls back to plain decoding (0 = off)")
      ->check(CLI::Range(0, 1000));
  sub->add_option("--temperature", a->temperature, "Sampling temperature of every request (0 = greedy, the default)")
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", a->top_k, "Top-k of every request (0 = off)")->check(CLI::Range(0, 1 << 30));
  add_top_p_option(sub, &a->top_p, "Top-p of every request (1 = off)");
  sub->add_option("--synthetic-acceptance-rate", a->synthetic_acceptance,
                  "BENCHMARK ONLY: accept each draft with this probability instead of verifying it (output is not "
                  "the target's; for scheduling measurements on random-weight models)")
      ->check(CLI::Range(0.0, 1.0));
  return [a, prealloc] {
    a->prealloc_given = prealloc->count() > 0;
    return run_bench_engine(*a);
  };
}

}  // namespace dsinfer::cli
