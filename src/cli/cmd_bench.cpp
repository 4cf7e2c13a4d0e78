// dsinfer CLI: `dsinfer bench` — the load generator (src/harness/) against any
// OpenAI-compatible server, and `bench --compare`, which starts our own server in each mode
// and prints the article's table.
//
// Flags -> BenchOptions (workload from --dataset or --preset, levels, limits) ->
// harness::run_bench (or run_compare) -> Markdown + JSON + HTML reports in --out-dir and a
// summary on stdout. Exit 0 when every request succeeded; 1 on bad input, an unreachable
// server, or when any request failed (the reports are still written).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "harness/bench_runner.h"
#include "harness/compare.h"
#include "harness/report.h"

namespace dsinfer::cli {

namespace {

struct BenchArgs {
  std::string url, model, dataset, preset, data_dir, concurrency = "1,4,16", out_dir = "bench-results", api_key, name;
  int num_prompts = 0, max_tokens = 0, warmup = 0;
  double duration = 0, request_rate = 0, temperature = -1, timeout = 600;
  uint64_t seed = 1;
  bool ignore_eos = false, no_progress = false, concurrency_given = false;
  // --compare
  bool compare = false;
  std::string model_path, draft_model_path, dflash_model_path, modes = "plain,dflash,dflash+dspark";
  std::vector<std::string> serve_args;
  double ready_timeout = 600;
  std::string command_line;
};

std::string utc_now() {
  char buf[64];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// This process's argv as one line (/proc/self/cmdline), for the report's provenance.
std::string own_command_line() {
  std::FILE* f = std::fopen("/proc/self/cmdline", "rb");
  if (!f) return "dsinfer bench";
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  for (char& c : s)
    if (c == '\0') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

int run_bench_cmd(const BenchArgs& a) {
  using namespace harness;
  BenchOptions o;
  if (!a.dataset.empty() && !a.preset.empty()) throw Error("--dataset/--preset: give one");
  if (!a.compare && a.url.empty()) throw Error("--url: required (or --compare to start our own server)");
  if (a.compare && !a.url.empty()) throw Error("--url: not used with --compare (it starts its own servers)");
  if (!a.compare && (!a.model_path.empty() || !a.draft_model_path.empty() || !a.dflash_model_path.empty()))
    throw Error("--model-path/--draft-model-path: only used with --compare");
  o.workload = !a.dataset.empty() ? load_dataset(a.dataset) : make_preset(a.preset.empty() ? "chat" : a.preset, find_eval_dir(a.data_dir));
  o.concurrency = parse_int_list(a.concurrency, "--concurrency");
  o.request_rate = a.request_rate;
  if (a.request_rate > 0) {
    // Open loop: --concurrency, when given, is one value: the cap on requests in flight.
    if (!a.concurrency_given) o.concurrency.clear();
    else if (o.concurrency.size() > 1)
      throw Error("--request-rate: runs one open-loop level; give at most one --concurrency value (the in-flight cap)");
  }
  o.num_prompts = a.num_prompts;
  o.duration_s = a.duration;
  o.seed = a.seed;
  o.progress = !a.no_progress;
  o.warmup_requests = a.warmup;
  o.http.api_key = a.api_key;
  o.http.read_timeout_s = a.timeout;
  o.request.model = a.model;
  o.request.max_tokens = a.max_tokens;
  o.request.ignore_eos = a.ignore_eos;
  o.request.temperature = a.temperature;

  nlohmann::json meta = {{"date", utc_now()},
                         {"command", a.command_line},
                         {"workload", o.workload.name},
                         {"workload_requests", o.workload.items.size()},
                         {"max_tokens", a.max_tokens > 0 ? a.max_tokens : o.workload.default_max_tokens},
                         {"concurrency", a.concurrency},
                         {"request_rate", a.request_rate},
                         {"num_prompts_per_level", a.num_prompts},
                         {"duration_s_per_level", a.duration},
                         {"ignore_eos", a.ignore_eos},
                         {"warmup_requests", a.warmup},
                         {"note", "figures from one machine at one time; CPU timings are noisy"}};
  const std::string name = a.name.empty() ? (a.compare ? "compare" : "bench") : a.name;

  if (a.compare) {
    CompareOptions c;
    c.bench = o;
    c.model_path = a.model_path;
    c.draft_model_path = a.draft_model_path;
    c.dflash_model_path = a.dflash_model_path;
    c.modes = split_commas(a.modes);
    c.serve_args = a.serve_args;
    c.out_dir = a.out_dir;
    c.ready_timeout_s = a.ready_timeout;
    std::vector<std::string> errors;
    CompareReport rep = run_compare(c, errors);
    for (const auto& [k, v] : meta.items()) rep.meta[k] = v;
    const size_t levels = rep.runs.empty() ? 0 : rep.runs[0].size();
    for (size_t i = 0; i < levels; ++i) std::printf("%s\n", compare_table_text(rep, i).c_str());
    const auto paths = write_reports(a.out_dir, name, to_json(rep), to_markdown(rep), to_html(rep));
    std::printf("reports: %s %s %s\n", paths[0].c_str(), paths[1].c_str(), paths[2].c_str());
    int failed = 0;
    for (const auto& run : rep.runs)
      for (const LevelReport& l : run) failed += l.failed;
    for (const std::string& e : errors) std::fprintf(stderr, "dsinfer: error: bench --compare: %s\n", e.c_str());
    if (failed) std::fprintf(stderr, "dsinfer: error: bench --compare: %d request(s) failed (see the reports)\n", failed);
    return errors.empty() && failed == 0 ? 0 : 1;
  }

  o.url = parse_base_url(a.url, "--url");
  const std::string listed = check_server(o.url, o.http);
  if (o.request.model.empty()) o.request.model = listed;
  meta["url"] = o.url.origin();
  meta["model"] = o.request.model;
  BenchReport rep;
  rep.meta = meta;
  rep.levels = run_bench(o);
  std::printf("%s", to_markdown(rep).c_str());
  const auto paths = write_reports(a.out_dir, name, to_json(rep), to_markdown(rep), to_html(rep));
  std::printf("\nreports: %s %s %s\n", paths[0].c_str(), paths[1].c_str(), paths[2].c_str());
  int failed = 0, completed = 0;
  std::string first;
  for (const LevelReport& l : rep.levels) {
    failed += l.failed;
    completed += l.completed;
    if (first.empty()) first = l.first_error;
  }
  if (failed) {
    std::fprintf(stderr, "dsinfer: error: bench: %d of %d request(s) failed; first: %s\n", failed, failed + completed,
                 first.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

Runner register_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Load generator against an OpenAI-compatible server (ours or a peer's); "
                                              "--compare starts our server in each mode");
  sub->add_option("--url", a->url, "Server base URL, http://HOST:PORT");
  sub->add_option("--model", a->model, "Model id sent in requests (default: the first id of GET /v1/models)");
  sub->add_option("--dataset", a->dataset,
                  "JSON lines: {\"prompt\": ...}, {\"messages\": [...]} or a `serve --record-requests` log");
  sub->add_option("--preset", a->preset, "Built-in workload: chat (default), summarize (~1280 in / 512 out), code")
      ->check(CLI::IsMember({"chat", "summarize", "code"}));
  sub->add_option("--data-dir", a->data_dir, "Held-out data of the presets (default: models/eval next to the binary)");
  CLI::Option* concurrency = sub->add_option("--concurrency", a->concurrency,
                                              "Closed-loop levels, e.g. 1,4,16,64,128 (open loop: the in-flight cap)");
  sub->add_option("--num-prompts", a->num_prompts, "Requests per level (default max(8, 2 x concurrency); 64 open loop)")
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--duration", a->duration, "Seconds per level (stops sending after it)")->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--request-rate", a->request_rate, "Open loop: Poisson arrivals at R requests/s")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--max-tokens", a->max_tokens, "Output tokens per request (overrides the workload's)")
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--temperature", a->temperature, "Sampling temperature (default: the dataset's, else 0 = greedy)")
      ->check(CLI::Range(0.0, 10.0));
  sub->add_flag("--ignore-eos", a->ignore_eos, "Send ignore_eos: true so every request generates max_tokens");
  sub->add_option("--seed", a->seed, "Seed of the open-loop arrival times");
  sub->add_option("--warmup", a->warmup, "Untimed requests before the first level (per server with --compare)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--timeout", a->timeout, "Seconds a request may stay silent before it counts as failed")
      ->check(CLI::Range(1.0, 86400.0));
  sub->add_option("--out-dir", a->out_dir, "Where NAME.json / NAME.md / NAME.html go (default bench-results)");
  sub->add_option("--name", a->name, "Report file name (default bench, or compare)");
  sub->add_option("--api-key", a->api_key, "Sent as Authorization: Bearer KEY");
  sub->add_flag("--no-progress", a->no_progress, "No live progress line on stderr");
  sub->add_flag("--compare", a->compare, "Start our own server per mode and print the side-by-side table");
  sub->add_option("--model-path", a->model_path, "--compare: target model directory (default: the embedded set)");
  sub->add_option("--draft-model-path", a->draft_model_path, "--compare: DSpark drafter (default: the embedded one)");
  sub->add_option("--dflash-model-path", a->dflash_model_path,
                  "--compare: DFlash drafter of the dflash mode (default: the embedded one, else --draft-model-path "
                  "with the fixed schedule)");
  sub->add_option("--modes", a->modes, "--compare: comma list of plain, dflash, dflash+dspark");
  sub->add_option("--serve-arg", a->serve_args, "--compare: extra argument for every server (repeat), e.g. --serve-arg=--threads=2")
      ->allow_extra_args(false);
  sub->add_option("--ready-timeout", a->ready_timeout, "--compare: seconds a server may take to load")
      ->check(CLI::Range(1.0, 86400.0));
  return [a, concurrency] {
    a->concurrency_given = concurrency->count() > 0;
    a->command_line = own_command_line();
    return run_bench_cmd(*a);
  };
}

}  // namespace dsinfer::cli
