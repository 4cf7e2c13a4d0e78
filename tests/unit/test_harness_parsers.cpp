// Harness parsers: SSE framing on canned streams split at every byte, OpenAI chunk fields,
// the Prometheus text format and the before/after figures, workload files (good and bad
// lines), request bodies, the cache-stats text, the report writers and the tune grid.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "harness/cache_report.h"
#include "harness/env_check.h"
#include "harness/http_client.h"
#include "harness/prometheus.h"
#include "harness/report.h"
#include "harness/sse.h"
#include "harness/tuner.h"
#include "harness/workloads.h"

using namespace dsinfer::harness;
using nlohmann::json;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("dsinfer_harness_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dsinfer::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HarnessSse, ParsesEventsWhateverTheSplit) {
  const std::string stream =
      ": keep-alive comment\r\n\r\n"
      "data: {\"a\":1}\r\n\r\n"
      "event: message\ndata: line1\ndata:line2\n\n"
      "data: [DONE]\r\r";
  const std::vector<std::string> expect = {"{\"a\":1}", "line1\nline2", "[DONE]"};
  for (size_t split = 0; split <= stream.size(); ++split) {
    SseParser p;
    std::vector<std::string> got = p.feed(stream.substr(0, split));
    for (const std::string& e : p.feed(stream.substr(split))) got.push_back(e);
    EXPECT_EQ(got, expect) << "split at " << split;
  }
  // Byte by byte.
  SseParser p;
  std::vector<std::string> got;
  for (char c : stream)
    for (const std::string& e : p.feed(std::string(1, c))) got.push_back(e);
  EXPECT_EQ(got, expect);
  EXPECT_FALSE(p.has_partial());
  SseParser cut;
  EXPECT_TRUE(cut.feed("data: {\"x\"").empty());
  EXPECT_TRUE(cut.has_partial());
}

TEST(HarnessSse, OpenAiChunkFields) {
  StreamChunk c = parse_openai_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]})");
  EXPECT_EQ(c.text, "Hi");
  EXPECT_EQ(c.finish_reason, "");
  c = parse_openai_chunk(R"({"choices":[{"index":0,"text":" there","finish_reason":"length"}]})");
  EXPECT_EQ(c.text, " there");
  EXPECT_EQ(c.finish_reason, "length");
  c = parse_openai_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}})");
  EXPECT_EQ(c.prompt_tokens, 12);
  EXPECT_EQ(c.completion_tokens, 34);
  c = parse_openai_chunk(R"({"error":{"message":"server is shutting down","type":"server_error"}})");
  EXPECT_EQ(c.error, "server is shutting down");
  EXPECT_TRUE(parse_openai_chunk("[DONE]").done);
  EXPECT_THROW(parse_openai_chunk("{not json"), dsinfer::Error);
  EXPECT_THROW(parse_openai_chunk("[1,2]"), dsinfer::Error);
}

TEST(HarnessPrometheus, ParsesSamplesLabelsAndEscapes) {
  const std::string text =
      "# HELP dsinfer_requests_total Requests\n"
      "# TYPE dsinfer_requests_total counter\n"
      "dsinfer_requests_total{outcome=\"stop\"} 3\n"
      "dsinfer_requests_total{outcome=\"length\"} 4 1700000000000\n"
      "dsinfer_build_info{version=\"0.1.0\",model=\"a \\\"q\\\", b}\"} 1\n"
      "dflash_kv_reuse_rate 0.25\n"
      "h_bucket{le=\"+Inf\"} 7\n"
      "nan_metric NaN\n"
      "inf_metric +Inf\n";
  const Scrape s = parse_prometheus(text);
  EXPECT_DOUBLE_EQ(s.get("dsinfer_requests_total{outcome=\"stop\"}"), 3);
  EXPECT_DOUBLE_EQ(s.sum("dsinfer_requests_total"), 7);
  EXPECT_DOUBLE_EQ(s.get("dflash_kv_reuse_rate"), 0.25);
  EXPECT_DOUBLE_EQ(s.get("h_bucket{le=\"+Inf\"}"), 7);
  // Labels are sorted by name in the key; the escaped value survives.
  EXPECT_DOUBLE_EQ(s.get("dsinfer_build_info{model=\"a \\\"q\\\", b}\",version=\"0.1.0\"}"), 1);
  EXPECT_TRUE(std::isnan(s.get("nan_metric")));
  EXPECT_TRUE(std::isinf(s.get("inf_metric")));
  EXPECT_TRUE(std::isnan(s.get("absent")));
  EXPECT_TRUE(std::isnan(s.sum("dsinfer_requests")));  // a prefix of a name is not the name
  EXPECT_NE(error_of([] { parse_prometheus("ok 1\nbad{x=\"1\" 2\n"); }).find("metrics line 2"), std::string::npos);
  EXPECT_NE(error_of([] { parse_prometheus("m abc\n"); }).find("bad sample value"), std::string::npos);
  EXPECT_NE(error_of([] { parse_prometheus("m\n"); }).find("missing sample value"), std::string::npos);
}

TEST(HarnessPrometheus, FiguresFromTwoScrapes) {
  const Scrape before = parse_prometheus(
      "dsinfer_spec_tokens_per_round_sum 100\ndsinfer_spec_tokens_per_round_count 50\n"
      "dsinfer_generation_tokens_total 100\ndsinfer_accepted_draft_tokens_total 50\n"
      "dsinfer_prompt_tokens_total 1000\ndsinfer_prompt_tokens_cached_total 0\n"
      "dflash_validation_failures_total 10\n");
  const Scrape after = parse_prometheus(
      "dsinfer_spec_tokens_per_round_sum 400\ndsinfer_spec_tokens_per_round_count 150\n"
      "dsinfer_generation_tokens_total 400\ndsinfer_accepted_draft_tokens_total 200\n"
      "dsinfer_prompt_tokens_total 2000\ndsinfer_prompt_tokens_cached_total 250\n"
      "dflash_validation_failures_total 30\ndflash_kv_reuse_rate 0.5\ndspark_cache_hit_ratio 0.125\n"
      "process_resident_memory_bytes 1048576\n");
  const ServerFigures f = server_figures(before, after);
  EXPECT_DOUBLE_EQ(f.tau, 3.0);                  // 300 tokens / 100 rounds
  EXPECT_DOUBLE_EQ(f.reuse_rate_window, 0.5);    // 150 accepted / 300 generated
  EXPECT_DOUBLE_EQ(f.cache_hit_window, 0.25);    // 250 / 1000
  EXPECT_DOUBLE_EQ(f.validation_failures, 20);
  EXPECT_DOUBLE_EQ(f.reuse_rate_gauge, 0.5);
  EXPECT_DOUBLE_EQ(f.cache_hit_gauge, 0.125);
  EXPECT_DOUBLE_EQ(f.peak_memory_bytes, 1048576);
  // A peer without these metrics: NaN, not zero.
  const ServerFigures none = server_figures(parse_prometheus("x 1\n"), parse_prometheus("x 2\n"));
  EXPECT_TRUE(std::isnan(none.tau));
  EXPECT_TRUE(std::isnan(none.reuse_rate_window));
  EXPECT_TRUE(std::isnan(none.peak_memory_bytes));
}

TEST(HarnessWorkloads, ReadsPromptsMessagesAndRecordedLogs) {
  const std::string path = write_temp("ds.jsonl",
                                      "{\"prompt\": \"hello\", \"max_tokens\": 7}\n"
                                      "\n"
                                      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n"
                                      "{\"prompt\": [1, 2, 3]}\n"
                                      "{\"endpoint\":\"/v1/chat/completions\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                      "\"prompt_ids\":[5,6],\"params\":{\"max_tokens\":4,\"temperature\":0.5,\"stream\":true},"
                                      "\"arrival_unix_s\":100.0,\"e2e_s\":2.0}\n"
                                      "{\"endpoint\":\"/v1/completions\",\"prompt_ids\":[9],\"params\":{},\"arrival_unix_s\":101.0,"
                                      "\"e2e_s\":0.5}\n");
  const Workload w = load_dataset(path);
  ASSERT_EQ(w.items.size(), 5u);
  EXPECT_FALSE(w.items[0].chat);
  EXPECT_EQ(w.items[0].prompt, "hello");
  EXPECT_EQ(w.items[0].max_tokens, 7);
  EXPECT_TRUE(w.items[1].chat);
  EXPECT_TRUE(w.items[2].prompt.is_array());
  EXPECT_TRUE(w.items[3].chat);
  EXPECT_EQ(w.items[3].max_tokens, 4);
  EXPECT_FALSE(w.items[3].params.contains("stream"));  // the body sets it itself
  EXPECT_DOUBLE_EQ(w.items[4].arrival_offset_s, 1.0);
  EXPECT_EQ(w.items[4].prompt, json::array({9}));
  EXPECT_EQ(recorded_peak_concurrency(w), 2);  // [0, 2] and [1, 1.5] overlap

  const json body = json::parse(request_body(w.items[3], w, RequestOptions{"m", 0, true, -1}));
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["max_tokens"], 4);
  EXPECT_EQ(body["temperature"], 0.5);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(request_path(w.items[3]), "/v1/chat/completions");
  const json b0 = json::parse(request_body(w.items[0], w, RequestOptions{"", 3, false, -1}));
  EXPECT_FALSE(b0.contains("model"));
  EXPECT_EQ(b0["max_tokens"], 3);
  EXPECT_EQ(b0["temperature"], 0.0);  // greedy unless told
}

TEST(HarnessWorkloads, BadInputNamesFileLineAndField) {
  EXPECT_NE(error_of([] { load_dataset("/nonexistent/x.jsonl"); }).find("--dataset: cannot open"), std::string::npos);
  EXPECT_NE(error_of([] { load_dataset("/nonexistent/x.jsonl", "--requests"); }).find("--requests"), std::string::npos);
  const auto err = [](const std::string& text) { return error_of([&] { load_dataset(write_temp("bad.jsonl", text)); }); };
  EXPECT_NE(err("").find("holds no requests"), std::string::npos);
  EXPECT_NE(err("{\"prompt\": \"a\"}\n{oops\n").find("bad.jsonl:2: invalid JSON"), std::string::npos);
  EXPECT_NE(err("[1]\n").find(":1: expected a JSON object"), std::string::npos);
  EXPECT_NE(err("{\"text\": \"a\"}\n").find("needs one of"), std::string::npos);
  EXPECT_NE(err("{\"messages\": []}\n").find("field 'messages'"), std::string::npos);
  EXPECT_NE(err("{\"prompt\": 5}\n").find("field 'prompt'"), std::string::npos);
  EXPECT_NE(err("{\"prompt\": [1, -2]}\n").find("non-negative"), std::string::npos);
  EXPECT_NE(err("{\"prompt\": \"a\", \"max_tokens\": 0}\n").find("field 'max_tokens'"), std::string::npos);
  EXPECT_NE(err("{\"prompt\": \"a\", \"endpoint\": \"/v1/embeddings\"}\n").find("field 'endpoint'"), std::string::npos);
}

TEST(HarnessWorkloads, PresetsFromHeldOutData) {
  const std::string dir = find_eval_dir(std::string(DSINFER_SOURCE_DIR) + "/models/eval");
  const Workload chat = make_preset("chat", dir), sum = make_preset("summarize", dir), code = make_preset("code", dir);
  ASSERT_FALSE(chat.items.empty());
  EXPECT_TRUE(chat.items[0].chat);
  EXPECT_EQ(chat.default_max_tokens, 128);
  EXPECT_EQ(sum.default_max_tokens, 512);
  // ~1280 tokens at 3.3 characters per token.
  const size_t len = sum.items[0].prompt.get<std::string>().size();
  EXPECT_GT(len, 3800u);
  EXPECT_LT(len, 4400u);
  EXPECT_FALSE(code.items[0].chat);
  EXPECT_NE(error_of([&] { make_preset("poetry", dir); }).find("--preset"), std::string::npos);
  EXPECT_NE(error_of([] { find_eval_dir("/nonexistent"); }).find("--data-dir"), std::string::npos);
}

TEST(HarnessHttp, BaseUrlParsing) {
  BaseUrl b = parse_base_url("http://127.0.0.1:8000/v1");
  EXPECT_EQ(b.host, "127.0.0.1");
  EXPECT_EQ(b.port, 8000);
  EXPECT_EQ(parse_base_url("http://localhost").port, 80);
  EXPECT_EQ(parse_base_url("http://[::1]:9").host, "::1");
  for (const char* bad : {"127.0.0.1:8000", "https://x:1", "http://:80", "http://h:99999", "http://h:8x", "ftp://h"})
    EXPECT_NE(error_of([&] { parse_base_url(bad, "--url"); }).find("--url"), std::string::npos) << bad;
}

TEST(HarnessCacheStats, FormatsAndWarnsAboveThreshold) {
  json s = {{"block_size", 16}, {"blocks_total", 100}, {"blocks_used", 40}, {"blocks_free", 60}, {"blocks_cached", 10},
            {"blocks_cached_idle", 5}, {"prompt_tokens", 1000}, {"cached_prompt_tokens", 250}, {"cache_hit_ratio", 0.25},
            {"unused_slots", 40}, {"allocated_slots", 100}, {"cache_fragmentation_ratio", 0.4},
            {"shards", json::array({{{"total", 50}, {"used", 20}}, {{"total", 50}, {"used", 20}}})}};
  CacheStatsText t = format_cache_stats(s);
  EXPECT_TRUE(t.fragmentation_warning);
  EXPECT_NE(t.text.find("used 40 (40.0%)"), std::string::npos);
  EXPECT_NE(t.text.find("hit ratio: 25.0%"), std::string::npos);
  EXPECT_NE(t.text.find("WARNING"), std::string::npos);
  EXPECT_NE(t.text.find("Shards: 2"), std::string::npos);
  EXPECT_NE(t.text.find("Largest cached prefixes: not reported"), std::string::npos);
  s["cache_fragmentation_ratio"] = 0.35;  // at the level: no warning (warning above it)
  s["largest_cached_prefixes"] = json::array({{{"tokens", 64}, {"blocks", 4}}});
  t = format_cache_stats(s);
  EXPECT_FALSE(t.fragmentation_warning);
  EXPECT_NE(t.text.find("1. 64 tokens, 4 blocks"), std::string::npos);
  EXPECT_NE(format_cache_stats(json::object()).text.find("KV pool: not reported"), std::string::npos);
  EXPECT_THROW(format_cache_stats(json::array()), dsinfer::Error);
}

TEST(HarnessReport, LevelSummaryAndWriters) {
  LevelRun run;
  run.wall_s = 2.0;
  for (int i = 0; i < 4; ++i) {
    RequestResult r;
    r.ok = true;
    r.ttft_s = 0.1;
    r.e2e_s = 1.1;
    r.output_tokens = 11;  // TPOT = 1.0 / 10 = 0.1 s
    r.tokens_from_usage = true;
    r.itl_s = {0.1, 0.1};
    run.results.push_back(r);
  }
  RequestResult bad;
  bad.error_kind = "http_5xx";
  bad.error = "HTTP 503";
  run.results.push_back(bad);
  LoadPlan plan;
  plan.concurrency = 4;
  const LevelReport l = summarize_level("c=4", plan, run);
  EXPECT_EQ(l.requests, 5);
  EXPECT_EQ(l.completed, 4);
  EXPECT_EQ(l.failed, 1);
  EXPECT_EQ(l.errors.at("http_5xx"), 1);
  EXPECT_DOUBLE_EQ(l.output_tps, 22.0);
  EXPECT_NEAR(l.tpot.p50, 0.1, 1e-12);
  EXPECT_NEAR(l.per_user_tps, 10.0, 1e-9);
  EXPECT_DOUBLE_EQ(l.e2e.p99, 1.1);
  BenchReport rep;
  rep.levels = {l};
  const std::string md = to_markdown(rep), html = to_html(rep);
  EXPECT_NE(md.find("| c=4 | 4/5 | http_5xx:1 |"), std::string::npos);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);  // self-contained: nothing fetched
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(to_json(rep)["levels"][0]["server"], nullptr);
  CompareReport cmp;
  cmp.modes = {"plain", "dflash"};
  LevelReport faster = l;
  faster.e2e.p50 = 0.55;
  cmp.runs = {{l}, {faster}};
  const std::string table = compare_table_text(cmp, 0);
  EXPECT_NE(table.find("-50.0%"), std::string::npos);
  EXPECT_NE(to_html(cmp).find("<table>"), std::string::npos);
}

TEST(HarnessReport, SvgPointsStayInsideThePlot) {
  PlotSeries s{"a", {1, 2, 4, 128}, {0.3, 523, 17, 99.9}, {}};
  const std::string svg = svg_chart("t", "x", "y", {s}, true);
  // Every circle centre lies inside the 560 x 340 canvas.
  size_t pos = 0;
  int circles = 0;
  while ((pos = svg.find("<circle cx=\"", pos)) != std::string::npos) {
    pos += 12;
    const double cx = std::atof(svg.c_str() + pos);
    const size_t cy_at = svg.find("cy=\"", pos) + 4;
    const double cy = std::atof(svg.c_str() + cy_at);
    EXPECT_GE(cx, 0);
    EXPECT_LE(cx, 560);
    EXPECT_GE(cy, 0) << svg;
    EXPECT_LE(cy, 340);
    ++circles;
  }
  EXPECT_EQ(circles, 4);
  EXPECT_NE(svg_chart("t", "x", "y", {}, false).find("no data"), std::string::npos);
}

TEST(HarnessTune, GridPlansAndCommandFlags) {
  TuneGrid g;
  const std::vector<TuneConfig> url_only = plan_grid(g, false);
  // baseline + fixed + threshold x 2 + dspark + 2 depths + windows 128, 256 + admission x 3
  // (fcfs is serve's default: the baseline)
  EXPECT_EQ(url_only.size(), 12u);
  for (const TuneConfig& c : url_only) EXPECT_TRUE(c.restart_flags().empty());
  const std::vector<TuneConfig> all = plan_grid(g, true);
  EXPECT_EQ(all.size(), 13u);  // + shards 1 (restart only; 8 is serve's default)
  EXPECT_EQ(all.back().restart_flags(), (std::vector<std::string>{"--dspark-shard-count", "1"}));
  TuneConfig c;
  c.schedule_policy = "threshold";
  c.validation_threshold = 0.75;
  c.max_reuse_depth = 4;
  c.shard_count = 1;
  const std::vector<std::string> f = c.serve_flags();
  const std::vector<std::string> want = {"--spec-schedule", "threshold", "--dflash-validation-threshold", "0.75",
                                         "--dflash-max-reuse-depth", "4", "--dspark-shard-count", "1"};
  EXPECT_EQ(f, want);
  EXPECT_EQ(c.runtime_patch(), (json{{"schedule_policy", "threshold"}, {"validation_threshold", 0.75}, {"max_reuse_depth", 4}}));
  g.full = true;
  g.window_sizes = {};
  g.admission_policies = {"fcfs", "hybrid"};
  EXPECT_EQ(plan_grid(g, false).size(), 4u * 3u * 2u);  // 4 policy points x (default + 2 depths) x 2 admissions
}

TEST(HarnessEnv, NvidiaSmiOutput) {
  const auto gpus = parse_gpu_csv("NVIDIA H200, 9.0, 143771, 143160, 570.133.20\n"
                                  "NVIDIA A100-SXM4-80GB, 8.0, 81920, 100, 535.54.03\n\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(gpus[0].compute_capability, "9.0");
  EXPECT_DOUBLE_EQ(gpus[0].memory_total_mib, 143771);
  EXPECT_DOUBLE_EQ(gpus[0].memory_free_mib, 143160);
  EXPECT_EQ(gpus[0].driver, "570.133.20");
  EXPECT_EQ(gpus[1].compute_capability, "8.0");
  EXPECT_TRUE(parse_gpu_csv("garbage\n").empty());
  EXPECT_EQ(parse_cuda_version("| NVIDIA-SMI 570.133.20   Driver Version: 570.133.20   CUDA Version: 12.8     |\n"), "12.8");
  EXPECT_EQ(parse_cuda_version("no banner"), "");
}
