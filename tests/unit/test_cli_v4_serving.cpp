// DeepSeek-V4 targets through the batched engine's commands, end to end (DSINFER_BIN):
//   - `serve` on a tiny V4 checkpoint with its own DSpark stages (mtp.*; v4_dspark_test_util.h,
//     its vocabulary padded so that a real tokenizer fits) and `--spec dspark` without a
//     drafter path: concurrent greedy completions equal `generate --spec none`, the metrics
//     count verified (rejected) drafts, and the same with plain decoding;
//   - `bench-engine` on it without --draft-model-path runs none and dspark (the target's own
//     stages) and reports tokens;
//   - `check-env` finds the stages, sizes the state, and its recommended command serves;
//   - `bench --compare` runs plain, dflash and dflash+dspark on the checkpoint's own stages,
//     and every server drains at once (no finished request left registered as active);
//   - a tokenizer whose ids the model's vocabulary does not hold is refused at load, in one
//     line naming tokenizer.json, by serve, generate and bench-engine; serve, failing after
//     its listener started, exits every time (it used to hang in about a third of the runs).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_helpers.h"
#include "harness/http_client.h"
#include "server_test_util.h"
#include "v4_dspark_test_util.h"

using dsinfer_test::run_dsinfer;
using dsinfer_test::Server;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kTokenizer = std::string(DSINFER_TEST_DATA) + "/tokenizers/tiny_deepseek_v4";

// The V4 target + mtp.* stages with 320 ids and the tiny DeepSeek-V4 tokenizer (306 ids).
std::string v4_dir_with_tokenizer() {
  static const std::string dir = [] {
    const std::string d = dsinfer_test::make_temp_dir("v4_serving") + "/model";
    dsinfer::test::TinyDSparkSpec sp;
    sp.pad_vocab = 320;
    dsinfer::test::write_tiny_v4_dspark(sp, d);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(kTokenizer + "/" + f, d + "/" + f);
    return d;
  }();
  return dir;
}

std::string id_list(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(t);
  }
  return s;
}

// Greedy completions of token-id prompts, 6 at once; each one's text equals that of plain
// `generate` on the same ids (the reply carries text, not ids).
void expect_completions_equal_plain(const Server& srv, const std::string& dir) {
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {1, 5, 12, 20, 33, 47}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p) t = static_cast<int32_t>(3 + rng() % 90);
    prompts.push_back(p);
  }
  const int n = 24;
  std::vector<std::future<dsinfer::harness::HttpResponse>> replies;
  for (const auto& p : prompts) {
    const json body = {{"prompt", p}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}};
    replies.push_back(std::async(std::launch::async, [port = srv.port, b = body.dump()] {
      return dsinfer::harness::http_post_json({"127.0.0.1", port}, "/v1/completions", b);
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto r = replies[i].get();
    ASSERT_EQ(r.status, 200) << r.body << r.error;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["usage"]["completion_tokens"], n);
    auto gen = run_dsinfer({"generate", "--model-path", dir, "--prompt-ids", id_list(prompts[i]), "--max-tokens",
                            std::to_string(n), "--ignore-eos", "--spec", "none", "--json"});
    ASSERT_EQ(gen.exit_code, 0) << gen.err;
    const json g = json::parse(gen.out);
    EXPECT_EQ(j["choices"][0]["text"], g["text"]) << "prompt " << i;
    // The ids are the base vocabulary's (byte-level tokens, each its own text), so equal
    // texts mean equal ids.
    for (int32_t id : g["ids"].get<std::vector<int32_t>>()) EXPECT_LT(id, 97) << "prompt " << i;
  }
}

}  // namespace

TEST(V4Serving, ServeWithTheTargetsOwnDSparkStagesEqualsPlainGenerate) {
  const std::string dir = v4_dir_with_tokenizer();
  for (const char* spec : {"dspark", "none"}) {
    SCOPED_TRACE(spec);
    // fixed: every round verifies the full block (the dspark scheduler would rightly stop
    // drafting for a model whose forward costs about what a drafter pass does).
    std::vector<std::string> args = {"--model-path", dir, "--spec", spec, "--max-running", "4", "--threads", "1"};
    if (std::string(spec) == "dspark") args.insert(args.end(), {"--spec-schedule", "fixed"});
    Server srv(args, std::string("v4_") + spec);
    ASSERT_TRUE(srv.wait_ready()) << dsinfer_test::slurp(srv.log);
    expect_completions_equal_plain(srv, dir);
    const auto m = dsinfer::harness::http_get({"127.0.0.1", srv.port}, "/metrics");
    ASSERT_EQ(m.status, 200);
    if (std::string(spec) == "dspark") {
      EXPECT_NE(dsinfer_test::slurp(srv.log).find("DSpark drafter (3 mtp stages"), std::string::npos) << dsinfer_test::slurp(srv.log);
      // Drafts were verified (the random stages' drafts are mostly rejected).
      const std::string key = "\ndflash_validation_failures_total ";
      const size_t p = m.body.find(key);
      ASSERT_NE(p, std::string::npos) << m.body;
      EXPECT_GT(std::atof(m.body.c_str() + p + key.size()), 0.0) << m.body.substr(p, 60);
    }
  }
}

TEST(V4Serving, BenchEngineUsesTheTargetsOwnStagesWithoutADraftPath) {
  const std::string dir = v4_dir_with_tokenizer();
  const std::string prompts = dsinfer_test::make_temp_dir("v4_bench") + "/prompts.jsonl";
  std::ofstream(prompts) << "{\"prompt_ids\": [5, 9, 14, 20, 33, 41, 8, 9, 10]}\n{\"prompt\": \"hello world\"}\n";
  auto r = run_dsinfer({"bench-engine", "--model-path", dir, "--prompts", prompts, "--concurrency", "1,4", "--policies",
                        "none,dspark", "--max-tokens", "16", "--json", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["cells"].size(), 4u);
  for (const json& c : j["cells"]) {
    EXPECT_EQ(c["output_tokens"].get<int>(), c["requests"].get<int>() * 16) << c.dump();
    EXPECT_EQ(c["cache_hit_ratio"].get<double>(), 0.0);
  }
}

TEST(V4Serving, CheckEnvFindsTheStagesAndItsRecommendedCommandServes) {
  const std::string dir = v4_dir_with_tokenizer();
  auto r = run_dsinfer({"check-env", "--model-path", dir, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  const json& m = j["model"];
  EXPECT_TRUE(m["drafter_compatible"].get<bool>()) << m.dump();
  EXPECT_NE(m["drafter_kind"].get<std::string>().find("DeepSeek-V4 mtp.*"), std::string::npos) << m.dump();
  EXPECT_TRUE(m["confidence_head"].get<bool>());
  EXPECT_GT(m["kv_bytes_per_token"].get<uint64_t>(), 0u);
  EXPECT_GT(m["state_bytes_per_sequence"].get<uint64_t>(), 0u);
  EXPECT_GT(m["full_length_sequences"].get<int>(), 0);
  // The recommended command line starts a healthy server.
  const std::string cmd = j["recommended_command"].get<std::string>();
  ASSERT_EQ(cmd.rfind("dsinfer serve ", 0), 0u) << cmd;
  EXPECT_NE(cmd.find("--enable-dspark"), std::string::npos) << cmd;
  std::vector<std::string> args;
  std::istringstream words(cmd.substr(std::string("dsinfer serve ").size()));
  for (std::string w; words >> w;) args.push_back(w);
  // Its sizes are for serving: --max-running 64 sizes the start-up profiles (verify steps up
  // to 512 tokens, drafter passes of up to 64 requests) and --cache-prealloc-ratio 0.7
  // commits 70 % of the free memory to the pool at start-up (over 10 s on this machine);
  // smaller values keep the test short, every other flag is the command's.
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--max-running") args[i + 1] = "4";
    if (args[i] == "--cache-prealloc-ratio") args[i + 1] = "0.01";
  }
  Server srv(args, "v4_recommended");
  ASSERT_TRUE(srv.wait_ready()) << dsinfer_test::slurp(srv.log);
}

TEST(V4Serving, BenchCompareStartsEveryModeOnTheTargetsOwnStages) {
  // bench --compare starts our server per mode; on a V4 checkpoint the DSpark modes take
  // its own stages (no --draft-model-path), and every request of every mode completes.
  const std::string dir = v4_dir_with_tokenizer();
  const std::string out = dsinfer_test::make_temp_dir("v4_compare");
  std::ofstream(out + "/short.jsonl") << "{\"prompt\": \"ab cd\"}\n{\"prompt\": [5, 9, 14, 20]}\n";
  auto r = run_dsinfer({"bench", "--compare", "--model-path", dir, "--modes", "plain,dflash,dflash+dspark", "--dataset",
                        out + "/short.jsonl", "--concurrency", "1", "--num-prompts", "12", "--max-tokens", "8",
                        "--out-dir", out, "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rep = json::parse(dsinfer_test::slurp(out + "/compare.json"));
  const json& modes = rep["meta"]["modes"];
  EXPECT_NE(modes["dflash+dspark"]["command"].get<std::string>().find("--draft-model-path " + dir), std::string::npos)
      << modes.dump();
  ASSERT_EQ(rep["modes"].size(), 3u);
  for (const json& m : rep["modes"]) {
    EXPECT_EQ(m["levels"][0]["completed"], 12) << m.dump().substr(0, 400);
    EXPECT_EQ(m["levels"][0]["failed"], 0);
  }
  // Every server stopped at once: no request was left registered as active. (A request the
  // engine finished before its handler had registered it stayed in the server's table, and
  // the drain then waited out its 30 s timeout: most runs of this test, before the fix.)
  for (const char* log : {"server-plain.log", "server-dflash.log", "server-dflash_dspark.log"}) {
    const std::string text = dsinfer_test::slurp(out + "/" + log);
    EXPECT_NE(text.find("serve: stopped"), std::string::npos) << log << ": " << text;
    EXPECT_EQ(text.find("drain timeout ("), std::string::npos) << log << ": " << text;
  }
}

TEST(V4Serving, ATokenizerOfAnotherModelIsRefusedAtLoad) {
  // The committed V4 target has 97 ids; the tiny DeepSeek-V4 tokenizer has 306.
  const std::string dir = dsinfer_test::make_temp_dir("v4_badtok") + "/model";
  fs::create_directories(dir);
  const std::string src = std::string(DSINFER_TEST_DATA) + "/deepseek_v4/mixed4_f32";
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(src + "/" + f, dir + "/" + f);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(kTokenizer + "/" + f, dir + "/" + f);
  const std::string prompts = dir + "/p.jsonl";
  std::ofstream(prompts) << "{\"prompt_ids\": [5, 9]}\n";
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"serve", "--model-path", dir, "--port", "0"},
           {"generate", "--model-path", dir, "--prompt-ids", "5,9", "--max-tokens", "2"},
           {"bench-engine", "--model-path", dir, "--prompts", prompts, "--concurrency", "1", "--policies", "none"}}) {
    // serve fails after its listener has started: 8 runs, each must exit (cpp-httplib's
    // stop() before the listen thread marked itself running used to leave about a third
    // of them blocked in accept() for ever).
    auto r = run_dsinfer(args);
    for (int i = 0; i < 7 && args[0] == "serve"; ++i) ASSERT_NE(run_dsinfer(args).exit_code, 0);
    EXPECT_NE(r.exit_code, 0) << args[0];
    EXPECT_NE(r.err.find("tokenizer.json: the tokenizer has 306 token ids but the model's vocabulary"), std::string::npos)
        << args[0] << ": " << r.err;
  }
}
