// Harness commands end to end, through the built binary (DSINFER_BIN), no mocks:
// - every command with an unreachable URL, a missing file or a bad flag: one clear line on
//   stderr and a non-zero exit (bad flags: for serve and generate too, exit 2, --help still 0);
// - check-env on the embedded model (can run, exit 0) and on a broken directory (exit 1);
// - a real `dsinfer serve` on the embedded model (free loopback port, --record-requests):
//   bench with a few small requests (reports written, server figures scraped), cache-stats,
//   then tune on the recorded log within a tiny budget, whose recommended command line is
//   started and must become healthy;
// - bench --compare with two modes (it starts and stops its own servers).
// Behaviour only: no assertion on any timing.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli_helpers.h"
#include "harness/http_client.h"
#include "server_test_util.h"

using dsinfer_test::run_dsinfer;
using nlohmann::json;

using dsinfer_test::Server;

namespace {

const std::string kEmbedded = std::string(DSINFER_SOURCE_DIR) + "/models/embedded";

// The end-to-end tests serve the embedded model set; without it they cannot run.
#define REQUIRE_EMBEDDED_MODELS()                                                              \
  if (!std::filesystem::exists(kEmbedded + "/target/config.json") ||                            \
      !std::filesystem::exists(kEmbedded + "/dspark/config.json"))                              \
  GTEST_SKIP() << kEmbedded << " (target + dspark) not present"

// Exactly one non-empty line on stderr, starting "dsinfer: error:", naming `what`.
void expect_one_line_error(const dsinfer_test::RunResult& r, const std::string& what) {
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_EQ(dsinfer_test::count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("dsinfer: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
}

}  // namespace

TEST(HarnessCli, UnreachableUrlMissingFileAndBadFlags) {
  const std::string dir = dsinfer_test::make_temp_dir("harness_cli_err");
  const std::string log = dir + "/log.jsonl";
  std::ofstream(log) << "{\"prompt\": \"hi\"}\n";
  expect_one_line_error(run_dsinfer({"bench", "--url", "http://127.0.0.1:1", "--out-dir", dir}), "cannot reach");
  expect_one_line_error(run_dsinfer({"cache-stats", "--url", "http://127.0.0.1:1"}), "cannot connect");
  expect_one_line_error(run_dsinfer({"tune", "--requests", log, "--url", "http://127.0.0.1:1"}), "cannot reach");
  expect_one_line_error(run_dsinfer({"bench", "--url", "http://127.0.0.1:1", "--dataset", dir + "/missing.jsonl"}),
                        "--dataset: cannot open");
  expect_one_line_error(run_dsinfer({"tune", "--requests", dir + "/missing.jsonl", "--url", "http://127.0.0.1:1"}),
                        "--requests: cannot open");
  expect_one_line_error(run_dsinfer({"bench", "--url", "localhost:8000"}), "--url: expected http://");
  expect_one_line_error(run_dsinfer({"bench", "--url", "http://127.0.0.1:1", "--concurrency", "1,x"}), "--concurrency");
  expect_one_line_error(run_dsinfer({"bench"}), "--url: required");
  expect_one_line_error(run_dsinfer({"check-env", "--model-path", dir + "/no-model"}), "config.json: not found");
  // Missing files of the other commands.
  expect_one_line_error(run_dsinfer({"check-env", "--model-path", kEmbedded + "/target", "--draft-model-path",
                                     dir + "/no-drafter"}),
                        "no-drafter");
  expect_one_line_error(run_dsinfer({"bench", "--compare", "--model-path", dir + "/no-model", "--modes", "plain",
                                     "--out-dir", dir, "--no-progress"}),
                        "no-model");
  expect_one_line_error(run_dsinfer({"tune", "--requests", log, "--model-path", dir + "/no-model", "--budget", "0.2",
                                     "--out-dir", dir + "/tune", "--no-progress"}),
                        "no-model");
  // Unreachable URL, with --url spelled correctly but nothing listening, for the commands that take one.
  expect_one_line_error(run_dsinfer({"bench", "--url", "http://127.0.0.1:1", "--preset", "code", "--out-dir", dir}),
                        "127.0.0.1:1");
}

// A command line the parser rejects (unknown flag, bad or missing value, missing required
// flag, unknown command): exactly one line on stderr, "dsinfer: error: COMMAND: ...", naming
// the flag, exit code 2; --help prints the command's flags on stdout and exits 0.
TEST(HarnessCli, BadFlagsGiveOneLineForEveryCommand) {
  const std::string dir = dsinfer_test::make_temp_dir("harness_cli_flags");
  const std::string log = dir + "/log.jsonl";
  std::ofstream(log) << "{\"prompt\": \"hi\"}\n";
  struct Case {
    std::vector<std::string> args;
    std::string expected;  // what the one line must contain
  };
  const std::vector<Case> cases = {
      {{"bench", "--bogus"}, "bench: --bogus: unknown flag"},
      {{"bench", "--url", "http://127.0.0.1:1", "--concurrency"}, "bench: --concurrency: "},
      {{"bench", "--url", "http://127.0.0.1:1", "--preset", "poetry"}, "bench: --preset: "},
      {{"bench", "--url", "http://127.0.0.1:1", "--num-prompts", "0"}, "bench: --num-prompts: "},
      {{"bench", "--url", "http://127.0.0.1:1", "--max-tokens", "many"}, "bench: --max-tokens: "},
      {{"bench", "--url", "http://127.0.0.1:1", "stray"}, "bench: stray: unexpected argument"},
      {{"tune"}, "tune: --requests: required"},
      {{"tune", "--requests", log, "--objective", "speed"}, "tune: --objective: "},
      {{"tune", "--requests", log, "--trials", "zero"}, "tune: --trials: "},
      {{"tune", "--requests", log, "--window"}, "tune: --window: unknown flag"},
      {{"check-env", "--nope"}, "check-env: --nope: unknown flag"},
      {{"check-env", "--cache-prealloc-ratio", "2"}, "check-env: --cache-prealloc-ratio: "},
      {{"cache-stats"}, "cache-stats: --url: required"},
      {{"cache-stats", "--url", "http://127.0.0.1:1", "--fragmentation"}, "cache-stats: --fragmentation: unknown flag"},
      {{"serve", "--bogus"}, "serve: --bogus: unknown flag"},
      {{"serve", "--port", "70000"}, "serve: --port: "},
      {{"serve", "--threads", "many"}, "serve: --threads: "},
      {{"generate", "--prompt", "hi"}, "generate: --model-path: required"},
      {{"generate", "--model-path", dir, "--max-tokens", "0"}, "generate: --max-tokens: "},
      {{"generate", "--model-path", dir, "--bogus", "1"}, "generate: --bogus: unknown flag"},
      {{"frobnicate"}, "frobnicate: unknown command"},
      {{"--bogus"}, "--bogus: unknown flag"},
      {{}, "a command is required"},
  };
  for (const Case& c : cases) {
    const auto r = run_dsinfer(c.args);
    std::string what;
    for (const std::string& a : c.args) what += a + " ";
    EXPECT_EQ(r.exit_code, 2) << what << r.err;
    EXPECT_EQ(dsinfer_test::count_lines(r.err), 1) << what << r.err;
    EXPECT_EQ(r.err.rfind("dsinfer: error: ", 0), 0u) << what << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << what << "expected '" << c.expected << "' in: " << r.err;
    EXPECT_EQ(r.err.find("Run with --help"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << what << r.out;
  }
  for (const char* cmd : {"bench", "tune", "check-env", "cache-stats", "serve", "generate"}) {
    const auto r = run_dsinfer({cmd, "--help"});
    EXPECT_EQ(r.exit_code, 0) << cmd << r.err;
    EXPECT_TRUE(r.err.empty()) << cmd << r.err;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << cmd << r.out;
  }
  const auto v = run_dsinfer({"--version"});
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.out.find("dsinfer "), std::string::npos);
}

TEST(HarnessCli, CheckEnvOnTheEmbeddedModel) {
  REQUIRE_EMBEDDED_MODELS();
  auto r = run_dsinfer({"check-env", "--verbose", "--model-path", kEmbedded + "/target"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("architecture: Qwen3ForCausalLM (supported)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("drafter:"), std::string::npos);
  EXPECT_NE(r.out.find("chat template: Qwen3 ChatML"), std::string::npos);
  EXPECT_NE(r.out.find("Recommended: dsinfer serve --model-path"), std::string::npos);
  r = run_dsinfer({"check-env", "--json", "--model-path", kEmbedded + "/target"});
  ASSERT_EQ(r.exit_code, 0);
  const json j = json::parse(r.out);
  EXPECT_TRUE(j["can_run"].get<bool>());
  EXPECT_TRUE(j["model"]["drafter_compatible"].get<bool>());
  EXPECT_GT(j["model"]["kv_bytes_per_token"].get<uint64_t>(), 0u);
  // A drafter that does not match the target: still runnable (plain), the reason listed.
  r = run_dsinfer({"check-env", "--verbose", "--model-path", kEmbedded + "/target", "--draft-model-path",
                   kEmbedded + "/target"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("NOT compatible"), std::string::npos) << r.out;
}

TEST(HarnessCli, BenchCacheStatsAndTuneAgainstOurServer) {
  REQUIRE_EMBEDDED_MODELS();
  const std::string dir = dsinfer_test::make_temp_dir("harness_e2e");
  const std::string log = dir + "/requests.jsonl";
  std::string url;
  {
    Server srv({"--record-requests", log, "--max-running", "4"}, "bench");
    ASSERT_TRUE(srv.wait_ready()) << dsinfer_test::slurp(srv.log);
    url = srv.url();
    auto r = run_dsinfer({"bench", "--url", url, "--preset", "code", "--concurrency", "1,2", "--num-prompts", "3",
                          "--max-tokens", "8", "--out-dir", dir, "--no-progress"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const json rep = json::parse(dsinfer_test::slurp(dir + "/bench.json"));
    ASSERT_EQ(rep["levels"].size(), 2u);
    for (const json& l : rep["levels"]) {
      EXPECT_EQ(l["completed"], 3);
      EXPECT_EQ(l["failed"], 0);
      EXPECT_TRUE(l["tokens_from_usage"].get<bool>());
      EXPECT_GT(l["output_tokens"].get<double>(), 0);
      EXPECT_LE(l["output_tokens"].get<double>(), 3 * 8);
      ASSERT_TRUE(l["server"].is_object());  // our server exports the figures
      EXPECT_FALSE(l["server"]["tau"].is_null());
      EXPECT_GE(l["server"]["tau"].get<double>(), 1.0);
    }
    EXPECT_NE(dsinfer_test::slurp(dir + "/bench.html").find("<svg"), std::string::npos);
    EXPECT_NE(dsinfer_test::slurp(dir + "/bench.md").find("| c=2 | 3/3 | 0 |"), std::string::npos);

    // Open loop (Poisson arrivals, seeded) and a duration-bound level.
    r = run_dsinfer({"bench", "--url", url, "--preset", "chat", "--request-rate", "50", "--concurrency", "2",
                     "--num-prompts", "3", "--max-tokens", "4", "--out-dir", dir, "--name", "open", "--no-progress"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json open = json::parse(dsinfer_test::slurp(dir + "/open.json"));
    EXPECT_EQ(open["levels"][0]["label"], "rate=50/s");
    EXPECT_EQ(open["levels"][0]["completed"], 3);
    r = run_dsinfer({"bench", "--url", url, "--preset", "chat", "--concurrency", "1", "--duration", "0.3",
                     "--max-tokens", "4", "--out-dir", dir, "--name", "timed", "--no-progress"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GE(json::parse(dsinfer_test::slurp(dir + "/timed.json"))["levels"][0]["completed"].get<int>(), 1);

    // Tune against this running server: runtime settings only, through POST /api/v1/config/dflash.
    const auto before = dsinfer::harness::http_get(dsinfer::harness::parse_base_url(url), "/api/v1/config/dflash");
    ASSERT_EQ(before.status, 200);
    std::ofstream(dir + "/small.jsonl") << "{\"prompt\": \"int main(void) {\", \"max_tokens\": 4}\n"
                                        << "{\"prompt\": \"def f(x):\", \"max_tokens\": 4}\n";
    r = run_dsinfer({"tune", "--requests", dir + "/small.jsonl", "--url", url, "--budget", "0.5", "--trials", "2",
                     "--schedule-policies", "fixed,dspark", "--reuse-depths", "2", "--window-sizes", "256",
                     "--admission-policies", "hybrid", "--out-dir", dir + "/tune-url", "--no-progress"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const json tu = json::parse(dsinfer_test::slurp(dir + "/tune-url/tune.json"));
    EXPECT_EQ(tu["results"].size(), 6u);  // baseline, fixed, dspark, depth 2, window 256, hybrid
    int ok = 0;
    for (const json& c : tu["results"]) {
      // dspark is this server's own schedule: measured once, as the baseline.
      const std::string st = c["status"];
      EXPECT_TRUE(st == "ok" || st.rfind("same as baseline", 0) == 0) << c.dump();
      ok += st == "ok";
      EXPECT_EQ(c["serve_flags"].size() % 2, 0u);
    }
    EXPECT_GE(ok, 5);
    // The server's settings are back to what they were.
    const auto cfg = dsinfer::harness::http_get(dsinfer::harness::parse_base_url(url), "/api/v1/config/dflash");
    ASSERT_EQ(cfg.status, 200);
    EXPECT_EQ(json::parse(cfg.body), json::parse(before.body));

    r = run_dsinfer({"cache-stats", "--url", url});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("KV pool:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Fragmentation:"), std::string::npos);
    // The bench requests above left their prompts' full blocks in the prefix cache.
    EXPECT_NE(r.out.find("Largest cached prefixes:\n  1. "), std::string::npos) << r.out;

    // A dataset line the server refuses (prompt ids outside the vocabulary): counted as an
    // http_4xx failure, exit 1, reports still written.
    std::ofstream(dir + "/bad.jsonl") << "{\"prompt\": [999999]}\n";
    r = run_dsinfer({"bench", "--url", url, "--dataset", dir + "/bad.jsonl", "--num-prompts", "1", "--out-dir", dir,
                     "--name", "bad", "--no-progress"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("http_4xx"), std::string::npos) << r.err;
    EXPECT_EQ(json::parse(dsinfer_test::slurp(dir + "/bad.json"))["levels"][0]["errors"]["http_4xx"], 1);
  }  // server stopped (SIGTERM): the log is complete
  ASSERT_GE(dsinfer_test::count_lines(dsinfer_test::slurp(log)), 6);

  // Tune on the recorded log within a tiny budget, our own server, runtime settings only
  // grid plus one restart group; nothing may start after the budget.
  auto r = run_dsinfer({"tune", "--requests", log, "--budget", "0.75", "--trials", "1", "--max-requests", "3",
                        "--max-tokens", "8", "--objective", "throughput", "--reuse-depths", "2", "--thresholds", "0.5",
                        "--window-sizes", "128", "--admission-policies", "fcfs", "--shard-counts", "2",
                        "--serve-arg=--max-running=2", "--out-dir", dir + "/tune", "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json tj = json::parse(dsinfer_test::slurp(dir + "/tune/tune.json"));
  EXPECT_LE(tj["elapsed_s"].get<double>(), 0.75 * 60 + 30);  // the last trial may finish after the budget
  ASSERT_FALSE(tj["results"].empty());
  EXPECT_EQ(tj["results"][0]["status"], "ok");
  const std::string cmd = tj["recommended_command"];
  ASSERT_EQ(cmd.rfind("dsinfer serve ", 0), 0u) << cmd;
  EXPECT_NE(r.out.find("Recommended: " + cmd), std::string::npos);
  // The recommended line starts a server.
  std::vector<std::string> args;
  std::istringstream in(cmd.substr(std::string("dsinfer serve ").size()));
  for (std::string a; in >> a;) args.push_back(a);
  Server best(args, "tuned");
  EXPECT_TRUE(best.wait_ready()) << cmd << "\n" << dsinfer_test::slurp(best.log);
}

TEST(HarnessCli, CompareStartsOurServerPerMode) {
  REQUIRE_EMBEDDED_MODELS();
  const std::string dir = dsinfer_test::make_temp_dir("harness_compare");
  auto r = run_dsinfer({"bench", "--compare", "--modes", "plain,dflash+dspark", "--preset", "chat", "--concurrency", "2",
                        "--num-prompts", "2", "--max-tokens", "8", "--serve-arg=--max-running=2", "--out-dir", dir,
                        "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("P50 latency"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dflash+dspark vs plain"), std::string::npos) << r.out;
  const json j = json::parse(dsinfer_test::slurp(dir + "/compare.json"));
  ASSERT_EQ(j["modes"].size(), 2u);
  for (const json& m : j["modes"]) {
    ASSERT_EQ(m["levels"].size(), 1u);
    EXPECT_EQ(m["levels"][0]["completed"], 2);
    EXPECT_GT(m["levels"][0]["process_peak_rss_bytes"].get<double>(), 0);
  }
  // Plain decoding accepts no drafts; the DSpark mode reports its reuse rate.
  EXPECT_EQ(j["modes"][0]["levels"][0]["server"]["reuse_rate_window"], 0.0);
  EXPECT_TRUE(j["modes"][1]["levels"][0]["server"]["reuse_rate_window"].is_number());
}
