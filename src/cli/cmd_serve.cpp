// dsinfer CLI: `dsinfer serve` — the OpenAI-compatible HTTP server (src/server/) over the
// batched engine (engine/llm_engine.h).
//
// Order of events: SIGTERM/SIGINT are blocked in every thread (a dedicated thread waits for
// them) -> the HTTP server binds and answers /health with 503 -> target, tokenizer and
// drafter load (default: the embedded set, models/embedded/{target,dspark}) -> the DSpark
// policy's SPS(B) curve is profiled -> one warm-up request runs through the engine ->
// /health turns 200. On SIGTERM: stop accepting, drain in-flight requests for up to
// --drain-timeout seconds, cancel what is left, exit 0.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <pthread.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "engine/llm_engine.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/sps_profile.h"
#include "model/model.h"
#include "server/dflash_log.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/request_log.h"
#include "server/runtime_config.h"
#include "spec/calibration.h"
#include "spec/calibration_runner.h"
#include "spec/drafter.h"
#include "spec/drafter_loader.h"
#include "spec/prefix_scheduler.h"
#include "spec/v4_dspark_drafter.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

struct ServeArgs {
  std::string model_path, draft_model_path, served_model_name;
  DeviceArgs dev;  // --device cpu|cuda (the target and its paged KV pool), --cuda-gemm, --cuda-graphs
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string spec;             // "": the drafter's kind (none without a drafter)
  bool enable_dspark = false;
  std::string spec_schedule;    // "": dspark with a confidence head, else fixed
  float validation_threshold = -1;
  int max_reuse_depth = -1;
  int window_size = -1;
  int draft_vocab = -1;  // DrafterOptions::draft_vocab_size
  std::string draft_vocab_file;
  std::string admission_policy = "fcfs";
  bool async_prefetch = false;  // --dflash-enable-async-prefetch / --disable-dflash-async-prefetch
  std::string spec_lookup;      // --spec-lookup on|off; "": on with a model drafter
  double synthetic_acceptance = -1.0;  // refused: a benchmark mode whose output is not the target's
  std::string matmul_precision = "auto";
  int threads = 0;
  int max_running = 16, max_model_len = 0, max_batch_tokens = 0;
  size_t max_body_bytes = 1 << 20;
  int max_prompt_tokens = 0, max_tokens_limit = 0, default_max_tokens = 256;
  double drain_timeout = 30.0;
  int http_threads = 128;
  std::string record_requests;
  std::string log_dflash_details;
  bool enable_metrics = true, enable_health_check = true;
  // KV pool (engine/block_pool.h)
  int kv_block_size = 16;
  int64_t kv_blocks = 0;
  double cache_prealloc_ratio = 0;  // 0: unset (pool sized for max-running full-length requests)
  int shard_count = 8;
  bool enable_cache_defrag = false;
  std::string cache_warmup_file;
  // Self-healing and the dynamic drafter window (engine/spec_health.h)
  int dsw_min_window = 0, dsw_max_window = 0;
  int self_heal_rounds = -1;  // -1: the engine's default
};

// MemAvailable from /proc/meminfo in bytes (0 when unreadable).
uint64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// The embedded default set: $DSINFER_EMBEDDED_DIR, else models/embedded next to the build
// directory of this binary (<repo>/build*/dsinfer), else ./models/embedded.
std::string find_embedded_dir() {
  if (const char* env = std::getenv("DSINFER_EMBEDDED_DIR"); env && *env) return env;
  std::vector<std::string> candidates;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/'));
    candidates.push_back(dir + "/../models/embedded");
    candidates.push_back(dir + "/../share/dsinfer/models/embedded");
  }
  candidates.push_back("models/embedded");
  for (const std::string& c : candidates)
    if (file_exists(c + "/target/config.json")) return c;
  throw Error("--model-path: not given and the embedded models were not found (set DSINFER_EMBEDDED_DIR or pass "
              "--model-path DIR)");
}

std::string base_name(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// Everything the server's engine points at; lives for the whole run.
struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Drafter> drafter;
  std::optional<Calibration> calibration;
  std::optional<SpsTable> sps;
  std::unique_ptr<LLMEngine> engine;
  server::DflashSettings settings;
  server::SettingsCaps caps;
  std::vector<int32_t> stop_ids;
  int max_model_len = 0;
};

void load(const ServeArgs& a, Loaded& L, server::ServerMetrics& metrics, server::DflashDetailsLog* details) {
  std::string model_path = a.model_path, draft_path = a.draft_model_path;
  std::string method = a.spec;
  if (model_path.empty()) {
    const std::string dir = find_embedded_dir();
    model_path = dir + "/target";
    if (draft_path.empty() && method != "none" && file_exists(dir + "/dspark/config.json")) draft_path = dir + "/dspark";
  }
  if (a.enable_dspark) {
    if (!method.empty() && method != "dspark") throw Error("--enable-dspark: conflicts with --spec " + method);
    method = "dspark";
  }
  if (method == "none" && !draft_path.empty() && !a.draft_model_path.empty())
    throw Error("--draft-model-path: not used with --spec none");
  if (method == "none") draft_path.clear();
  // A DeepSeek-V4 target carries its own DSpark drafter (mtp.*): --spec dspark alone uses it.
  if (method == "dspark" && draft_path.empty() && is_deepseek_v4_dir(model_path)) draft_path = model_path;
  if ((method == "dspark" || method == "dflash") && draft_path.empty())
    throw Error("--spec " + method + ": needs --draft-model-path");
  std::fprintf(stderr, "serve: loading %s%s%s\n", model_path.c_str(), draft_path.empty() ? "" : " + drafter ",
               draft_path.c_str());
  L.model = load_model_on_device(model_path, a.dev);
  if (device_is_cuda(a.dev)) std::fprintf(stderr, "serve: target on %s\n", device_summary(a.dev).c_str());
  if (!file_exists(model_path + "/tokenizer.json"))
    throw Error(model_path + "/tokenizer.json: not found (the server needs the tokenizer)");
  L.tok = load_model_tokenizer(model_path, *L.model);
  const ModelConfig& cfg = L.model->config();
  for (int32_t id : cfg.eos_token_ids) L.stop_ids.push_back(id);
  if (!L.tok->eos_token().empty())
    if (auto id = L.tok->token_to_id(L.tok->eos_token())) L.stop_ids.push_back(*id);

  EngineOptions o;
  o.tokenizer = L.tok.get();
  o.max_running = a.max_running;
  L.max_model_len = a.max_model_len > 0 ? a.max_model_len : std::min(cfg.max_position_embeddings, 4096);
  if (L.max_model_len > cfg.max_position_embeddings)
    throw Error("--max-model-len: " + std::to_string(L.max_model_len) + " exceeds the model's max_position_embeddings (" +
                std::to_string(cfg.max_position_embeddings) + ")");
  o.max_model_len = L.max_model_len;

  std::string schedule = a.spec_schedule;
  if (!draft_path.empty()) {
    DrafterOptions dopts;
    if (a.window_size >= 0) dopts.window_size = a.window_size;  // else the drafter's recommended window
    dopts.draft_vocab_size = a.draft_vocab;
    dopts.draft_vocab_file = a.draft_vocab_file;
    L.drafter = load_drafter(draft_path, *L.model, dopts);
    if (L.drafter->info().draft_vocab > 0)
      std::fprintf(stderr, "serve: drafting from the %d most frequent ids (--draft-vocab)\n", L.drafter->info().draft_vocab);
    if (!method.empty()) check_drafter_kind(method, L.drafter->info());
    const DrafterInfo& info = L.drafter->info();
    o.drafter = L.drafter.get();
    L.caps.has_drafter = true;
    L.caps.confidence_head = info.confidence_head;
    L.caps.max_drafts = info.max_draft_tokens;
    L.caps.window_supported = L.drafter->supports_window();
    L.caps.configured_window = std::max(0, a.window_size);
    if (a.max_reuse_depth > info.max_draft_tokens)
      throw Error("--dflash-max-reuse-depth: " + std::to_string(a.max_reuse_depth) + " exceeds the drafter's block (" +
                  std::to_string(info.max_draft_tokens) + " drafts)");
    if (schedule.empty()) schedule = a.validation_threshold > 0 ? "threshold" : info.confidence_head ? "dspark" : "fixed";
    if (schedule != "fixed" && !info.confidence_head)
      throw Error("--spec-schedule " + schedule + ": the drafter in " + draft_path + " has no confidence head");
    if (a.validation_threshold > 0 && !info.confidence_head)
      throw Error("--dflash-validation-threshold: the drafter in " + draft_path + " has no confidence head");
    if (schedule == "threshold" && a.validation_threshold <= 0)
      throw Error("--spec-schedule threshold: needs --dflash-validation-threshold T in (0, 1]");
    if (info.confidence_head) {
      L.calibration = load_calibration(draft_path);
      if (L.calibration) o.calibration = &*L.calibration;
      else std::fprintf(stderr, "serve: warning: %s has no calibration.json: raw confidences\n", draft_path.c_str());
    }
    if (a.enable_dspark && schedule != "dspark" && schedule != "dspark-async")
      throw Error("--enable-dspark: needs the dspark schedule (got --spec-schedule " + schedule + ")");
    if (info.confidence_head) {
      // SPS(B) over the step's verify tokens (verify-only), plus the measured per-request
      // draft time: the engine's dspark policy builds each step's curve from both.
      const int max_b = std::max(1, a.max_running * (info.max_draft_tokens + 1));
      SpsProfileOptions po;
      for (int b = 1; b < max_b; b *= 2) po.points.push_back(b);
      po.points.push_back(max_b);
      po.include_draft = false;
      po.repeats = 3;
      po.context = std::min(512, L.max_model_len / 2);
      double draft_ms = 0;
      L.sps = profile_sps(*L.model, L.drafter.get(), po, &draft_ms);
      o.sps = &*L.sps;
      o.draft_ms_per_request = draft_ms;
      o.draft_cost = profile_draft_cost(*L.model, *L.drafter, draft_cost_batches(a.max_running), po.context);
      L.caps.has_sps = true;
      std::fprintf(stderr, "serve: profiled SPS(B) at %zu points up to B = %d; drafter pass %s\n", po.points.size(),
                   max_b, draft_cost_summary(o.draft_cost).c_str());
    }
  } else {
    if (!schedule.empty() && schedule != "fixed") throw Error("--spec-schedule " + schedule + ": needs a drafter");
    if (a.validation_threshold >= 0) throw Error("--dflash-validation-threshold: needs a drafter");
    if (a.max_reuse_depth >= 0) throw Error("--dflash-max-reuse-depth: needs a drafter");
    if (a.window_size >= 0) throw Error("--dflash-window-size: needs a drafter");
    if (a.draft_vocab >= 0 || !a.draft_vocab_file.empty()) throw Error("--draft-vocab: needs a drafter");
    schedule = "fixed";
  }
  o.policy = server::parse_policy(schedule);
  o.validation_threshold = std::max(0.0f, a.validation_threshold);
  if (a.max_reuse_depth >= 0) o.max_draft_tokens = a.max_reuse_depth;
  o.kv_block_size = a.kv_block_size;
  o.kv_num_blocks = a.kv_blocks;
  if (a.cache_prealloc_ratio > 0) {
    if (a.kv_blocks > 0) throw Error("--cache-prealloc-ratio: conflicts with --kv-blocks (give one)");
    o.kv_budget_bytes = available_memory_bytes();  // measured after the weights loaded
    if (o.kv_budget_bytes == 0) throw Error("--cache-prealloc-ratio: cannot read MemAvailable from /proc/meminfo");
    o.cache_prealloc_ratio = a.cache_prealloc_ratio;
  }
  o.shard_count = a.shard_count;
  o.scheduler_policy = parse_scheduler_policy(a.admission_policy);
  o.health.min_window = a.dsw_min_window;
  o.health.max_window = a.dsw_max_window;
  if (a.self_heal_rounds >= 0) o.health.collapse_rounds = a.self_heal_rounds;
  o.enable_cache_defrag = a.enable_cache_defrag;
  if (!a.cache_warmup_file.empty())
    o.cache_warmup_prompts = read_calibration_prompts(a.cache_warmup_file, cfg.vocab_size,
                                                      [&](const std::string& t) { return L.tok->encode(t, false); });
  o.max_batch_tokens = a.max_batch_tokens > 0 ? a.max_batch_tokens
                                              : std::max(512, a.max_running * (L.caps.max_drafts + 1));
  // Prompts are chunked as plain decoding's default budget would chunk them; the rest of
  // max_batch_tokens is for verify blocks.
  o.prefill_step_tokens = std::min(o.max_batch_tokens, std::max(512, a.max_running));

  metrics.set_max_drafts(L.caps.max_drafts);
  server::ServerMetrics* m = &metrics;
  o.on_step = [m](const StepObservation& obs) { m->observe_step(obs); };
  o.async_prefetch = a.async_prefetch;
  if (a.spec_lookup == "on" && draft_path.empty())
    throw Error("--spec-lookup on: needs a model drafter (--spec dflash or dspark with --draft-model-path)");
  o.lookup_assist = !draft_path.empty() && a.spec_lookup != "off";
  if (details) o.on_rounds = [details](const std::vector<EngineRound>& rounds) { details->write_step(rounds); };
  L.engine = std::make_unique<LLMEngine>(*L.model, o);

  L.settings.window_size = std::max(0, a.window_size);
  L.settings.validation_threshold = o.validation_threshold;
  L.settings.max_reuse_depth = a.max_reuse_depth >= 0 ? a.max_reuse_depth : L.caps.max_drafts;
  L.settings.schedule_policy = schedule;
  L.settings.admission_policy = a.admission_policy;
  L.settings.async_prefetch = o.async_prefetch;
}

int run_serve(const ServeArgs& a) {
  // Signals are taken by one thread with sigwait; every thread created after this
  // (HTTP workers, engine, thread pool) inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a crash

  (void)parse_scheduler_policy(a.admission_policy);  // Error naming the flag before anything loads
  if (a.synthetic_acceptance >= 0)
    throw Error("--synthetic-acceptance-rate: a benchmark mode of bench-engine (drafts accepted at random, output "
                "not the target's); a server never serves it");
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  apply_matmul_precision(a.matmul_precision);
  check_device_available(a.dev);  // refused by name before the port is bound

  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  if (ho.api_key.empty())
    if (const char* env = std::getenv("DSINFER_API_KEY"); env && *env) ho.api_key = env;
  ho.max_body_bytes = a.max_body_bytes;
  ho.drain_timeout_s = a.drain_timeout;
  ho.http_threads = a.http_threads;
  ho.limits.model_id = a.served_model_name.empty()
                           ? (a.model_path.empty() ? std::string("dsinfer-embedded") : base_name(a.model_path))
                           : a.served_model_name;
  ho.limits.default_max_tokens = a.default_max_tokens;

  ho.limits.max_tokens_cap = a.max_tokens_limit;  // 0: resolved after the load
  ho.limits.max_prompt_tokens = a.max_prompt_tokens;

  std::unique_ptr<server::RequestLog> request_log;
  if (!a.record_requests.empty()) request_log = std::make_unique<server::RequestLog>(a.record_requests);
  std::unique_ptr<server::DflashDetailsLog> details;
  if (!a.log_dflash_details.empty()) details = std::make_unique<server::DflashDetailsLog>(a.log_dflash_details);
  ho.enable_metrics = a.enable_metrics;
  ho.enable_health_check = a.enable_health_check;

  // The limits that depend on the model are known only after the load; the server does
  // not accept completions before then (503 while loading), so it is built after it. To
  // answer /health during the load, a first server binds now and is replaced without
  // releasing the port: the same object is reused with set_limits.
  server::ServerMetrics metrics(0);
  server::HttpServer http(ho, metrics);
  http.start();
  std::fprintf(stderr, "serve: listening on http://%s:%d (loading; %s)\n", a.host.c_str(), http.port(),
               a.enable_health_check ? "/health is 503 until ready" : "/health disabled: wait for 'serve: ready'");

  // Signal thread: the first SIGTERM/SIGINT starts the drain.
  std::thread signal_thread([&http, sigs] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "serve: %s: draining (up to the drain timeout), then exiting\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT");
    http.begin_drain();
  });
  signal_thread.detach();

  Loaded L;
  load(a, L, metrics, details.get());
  server::ProtocolLimits limits = ho.limits;
  if (limits.max_prompt_tokens <= 0) limits.max_prompt_tokens = L.max_model_len - 1;
  if (limits.max_tokens_cap <= 0) limits.max_tokens_cap = L.max_model_len - 1;
  http.set_limits(limits);
  L.engine->start();

  // Warm-up: one short request through the whole engine path (prefill, drafting, verify)
  // before /health reports ready.
  {
    EngineRequest wr;
    wr.prompt = L.tok->encode("Hello", false);
    if (wr.prompt.empty()) wr.prompt = {0};
    wr.stop.max_tokens = std::min(8, L.max_model_len - static_cast<int>(wr.prompt.size()));
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    wr.on_event = [&](const RequestEvent& ev) {
      if (!ev.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    };
    L.engine->submit(std::move(wr));
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }

  server::Backend be;
  be.engine = L.engine.get();
  be.tokenizer = L.tok.get();
  be.stop_ids = L.stop_ids;
  be.max_model_len = L.max_model_len;
  be.caps = L.caps;
  be.settings = L.settings;
  be.request_log = request_log.get();
  http.set_backend(be);
  http.mark_ready();
  std::fprintf(stderr, "serve: ready: model '%s', schedule %s, max running %d, max model len %d\n",
               limits.model_id.c_str(), L.settings.schedule_policy.c_str(), a.max_running, L.max_model_len);

  http.wait();  // returns after a drain
  L.engine->stop();
  std::fprintf(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace

Runner register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server over the batched engine");
  sub->add_option("--model-path", a->model_path, "Target model directory (default: the embedded model set)");
  sub->add_option("--draft-model-path", a->draft_model_path,
                  "DFlash/DSpark drafter directory (default with the embedded set: its DSpark drafter; with a DeepSeek-V4 target and --spec dspark: its own mtp.* stages)");
  sub->add_option("--served-model-name", a->served_model_name, "Model id clients use (default: the directory name)");
  sub->add_option("--host", a->host, "Address to bind (default loopback)");
  sub->add_option("--port", a->port, "TCP port (0: any free port, printed at start)")->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", a->api_key, "Require Authorization: Bearer KEY on every endpoint but /health "
                                          "(default: $DSINFER_API_KEY, else none)");
  sub->add_option("--spec", a->spec, "Speculation: none, dflash or dspark (default: the drafter's kind)")
      ->check(CLI::IsMember({"none", "dflash", "dspark"}));
  sub->add_flag("--enable-dspark", a->enable_dspark,
                "DSpark: semi-autoregressive drafter + confidence-scheduled verification (dspark schedule)");
  sub->add_option("--spec-schedule", a->spec_schedule,
                  "Verify policy: fixed, threshold, dspark, dspark-async (default: dspark with a confidence head, "
                  "else fixed)")
      ->check(CLI::IsMember({"fixed", "threshold", "dspark", "dspark-async"}));
  sub->add_option("--dflash-validation-threshold", a->validation_threshold,
                  "Verify only drafts whose calibrated prefix survival stays >= T (threshold policy; floor under dspark)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--dflash-max-reuse-depth", a->max_reuse_depth, "Cap on drafts verified per round")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--dflash-window-size", a->window_size, "Drafter context window (0 = all)")->check(CLI::Range(0, 1 << 24));
  add_draft_vocab_options(sub, &a->draft_vocab, &a->draft_vocab_file);
  sub->add_option("--dspark-scheduler-policy", a->admission_policy,
                  "Admission order of waiting requests: fcfs, hit-rate, latency-aware, hybrid")
      ->check(CLI::IsMember({"fcfs", "hit-rate", "latency-aware", "hybrid"}));
  sub->add_option("--dspark-dsw-min-window", a->dsw_min_window, "Dynamic drafter window: lower bound (with the max)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--dspark-dsw-max-window", a->dsw_max_window, "Dynamic drafter window: upper bound (with the min)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--dspark-self-heal-rounds", a->self_heal_rounds,
                  "Fall back to plain decoding after this many rounds without an accepted draft (0 = off)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_flag("--dflash-enable-async-prefetch,!--disable-dflash-async-prefetch", a->async_prefetch,
                "Draft one cohort of requests while the target verifies the other (a second thread; default off)");
  sub->add_option("--spec-lookup", a->spec_lookup,
                  "With a DFlash/DSpark drafter: a suffix lookup over each request's prompt and output stands in for "
                  "its drafter pass when expected to yield more (default on; lossless)")
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--synthetic-acceptance-rate", a->synthetic_acceptance, "Benchmark-only mode of bench-engine: rejected");
  add_matmul_precision_option(sub, &a->matmul_precision);
  add_device_options(sub, &a->dev, /*with_cache_prealloc=*/false);
  sub->add_option("--threads", a->threads, "Worker threads (default: all hardware threads)")->check(CLI::Range(1, 1024));
  sub->add_option("--max-running", a->max_running, "Requests decoding at once (KV slots)")->check(CLI::Range(1, 4096));
  sub->add_option("--max-model-len", a->max_model_len, "Prompt + generated tokens per request (default min(model, 4096))")
      ->check(CLI::Range(2, 1 << 24));
  sub->add_option("--max-batch-tokens", a->max_batch_tokens, "Tokens per engine forward (default max(512, running x block))")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-body-bytes", a->max_body_bytes, "Largest request body (413 above)")->check(CLI::Range(1, 1 << 30));
  sub->add_option("--max-prompt-tokens", a->max_prompt_tokens, "Longest prompt after tokenization (default: max-model-len - 1)")
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--max-tokens-limit", a->max_tokens_limit, "Largest max_tokens a request may ask (default: max-model-len - 1)")
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--default-max-tokens", a->default_max_tokens, "max_tokens when a request gives none")
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--drain-timeout", a->drain_timeout, "SIGTERM: seconds in-flight requests get before cancellation")
      ->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--http-threads", a->http_threads, "Connections served at once")->check(CLI::Range(1, 4096));
  sub->add_option("--record-requests", a->record_requests, "Append one JSON line per finished request to FILE");
  sub->add_option("--log-dflash-details", a->log_dflash_details,
                  "Append one JSON line per speculative round (request id, drafts, confidences, verify length, "
                  "accepted, timings) to FILE");
  sub->add_flag("--enable-metrics,!--disable-metrics", a->enable_metrics,
                "Serve GET /metrics (default on; --enable-metrics=false or --disable-metrics: 404)");
  sub->add_flag("--enable-health-check,!--disable-health-check", a->enable_health_check,
                "Serve GET /health (default on; --enable-health-check=false or --disable-health-check: 404)");
  sub->add_option("--kv-block-size", a->kv_block_size, "Tokens per KV block")->check(CLI::Range(1, 4096));
  sub->add_option("--kv-blocks", a->kv_blocks, "KV blocks in the pool (default: max-running full-length requests)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--cache-prealloc-ratio", a->cache_prealloc_ratio,
                  "Size the KV pool as this share of the memory available after loading the weights (with "
                  "--device cuda: of the device's free memory)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--dspark-shard-count", a->shard_count, "Independently locked shards of the KV pool")
      ->check(CLI::Range(1, 1024));
  sub->add_flag("--enable-cache-defrag", a->enable_cache_defrag, "Compact the KV pool when the engine is idle");
  sub->add_option("--cache-warmup-file", a->cache_warmup_file,
                  "JSON lines {\"prompt\": text} or {\"prompt_ids\": [...]} prefilled into the prefix cache before ready");
  return [a] { return run_serve(*a); };
}

}  // namespace dsinfer::cli
