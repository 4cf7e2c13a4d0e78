// End-to-end tests of `dsinfer generate`: greedy continuations of the transformers
// goldens reproduced through the CLI (plain decoding, one token per step), JSON output
// shape, determinism of seeded sampling, and bad input (missing/corrupt files, unknown
// architecture, out-of-vocabulary ids, bad flags): exit code 1 with one error line naming
// the culprit, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

namespace fs = std::filesystem;
using dsinfer_test::run_dsinfer;
using json = nlohmann::json;

static const std::string kGoldenDir = std::string(DSINFER_TEST_DATA) + "/qwen3";

static std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(CliGenerate, GreedyMatchesTransformersGoldens) {
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
    if (!fs::exists(entry.path() / "golden.json")) continue;
    json g = json::parse(dsinfer_test::slurp((entry.path() / "golden.json").string()));
    for (size_t i = 0; i < g["prompts"].size(); ++i) {
      auto prompt = g["prompts"][i].get<std::vector<int>>();
      auto expect = g["greedy"][i].get<std::vector<int>>();
      auto r = run_dsinfer({"generate", "--model-path", entry.path().string(), "--prompt-ids", join_ids(prompt),
                            "--max-tokens", std::to_string(expect.size()), "--ignore-eos", "--json", "--threads", "2",
                            "--matmul-precision", "f32"});  // the goldens are F32 arithmetic
      ASSERT_EQ(r.exit_code, 0) << entry.path() << ": " << r.err;
      json out = json::parse(r.out);
      EXPECT_EQ(out["ids"].get<std::vector<int>>(), expect) << entry.path().filename() << " prompt " << i;
      EXPECT_EQ(out["finish_reason"], "length");
      EXPECT_EQ(out["usage"]["prompt_tokens"], prompt.size());
      EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << "stats line on stderr";
    }
    cases++;
  }
  EXPECT_GE(cases, 5);
}

TEST(CliGenerate, SeededSamplingIsReproducibleAndStopIdStops) {
  std::string dir = kGoldenDir + "/tied_gqa2";
  std::vector<std::string> args = {"generate", "--model-path", dir, "--prompt-ids", "5,6,7", "--max-tokens", "20",
                                   "--temperature", "0.8", "--top-p", "0.9", "--top-k", "50", "--seed", "7",
                                   "--ignore-eos", "--json"};
  auto a = run_dsinfer(args), b = run_dsinfer(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(json::parse(a.out)["ids"], json::parse(b.out)["ids"]);
  auto ids = json::parse(a.out)["ids"].get<std::vector<int>>();
  ASSERT_EQ(ids.size(), 20u);
  // Stopping on the 3rd sampled id: output ends there with finish_reason "stop".
  auto args2 = args;
  args2.push_back("--stop-id");
  args2.push_back(std::to_string(ids[2]));
  auto c = run_dsinfer(args2);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  auto ids2 = json::parse(c.out)["ids"].get<std::vector<int>>();
  ASSERT_FALSE(ids2.empty());
  EXPECT_EQ(ids2.back(), ids[2]);
  EXPECT_LE(ids2.size(), 3u);
  EXPECT_EQ(json::parse(c.out)["finish_reason"], "stop");
}

// Copies a golden model directory so a test can damage it.
static std::string copy_model(const std::string& name) {
  std::string dst = dsinfer_test::make_temp_dir(name);
  fs::copy(kGoldenDir + "/tied_gqa2", dst, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return dst;
}

static void expect_clean_error(const dsinfer_test::RunResult& r, const std::string& must_contain) {
  EXPECT_EQ(r.exit_code, 1) << "stderr: " << r.err;
  EXPECT_EQ(dsinfer_test::count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << "expected '" << must_contain << "' in: " << r.err;
}

TEST(CliGenerate, BadInputGivesOneLineErrors) {
  // Missing directory / config.
  expect_clean_error(run_dsinfer({"generate", "--model-path", "/nonexistent/model", "--prompt-ids", "1"}), "config.json");
  // Out-of-vocabulary prompt id.
  expect_clean_error(run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1,99999"}),
                     "99999");
  // Garbage in --prompt-ids.
  expect_clean_error(run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1,x"}),
                     "--prompt-ids");
  // Tensor parallelism is a GPU feature (one GPU per rank): refused on the CPU by name.
  expect_clean_error(run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1",
                                  "--tensor-parallel", "2"}),
                     "--device cuda");
  // --prompt without a tokenizer in the directory.
  expect_clean_error(run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt", "hi"}),
                     "tokenizer.json");
  {
    std::string d = copy_model("truncated");
    fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") / 2);
    expect_clean_error(run_dsinfer({"generate", "--model-path", d, "--prompt-ids", "1"}), "model.safetensors");
  }
  {
    std::string d = copy_model("corrupt_header");
    std::fstream f(d + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("#####", 5);
    f.close();
    expect_clean_error(run_dsinfer({"generate", "--model-path", d, "--prompt-ids", "1"}), "model.safetensors");
  }
  {
    std::string d = copy_model("bad_header_len");
    std::fstream f(d + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    const unsigned char huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00};
    f.write(reinterpret_cast<const char*>(huge), 8);
    f.close();
    expect_clean_error(run_dsinfer({"generate", "--model-path", d, "--prompt-ids", "1"}), "model.safetensors");
  }
  {
    std::string d = copy_model("unknown_arch");
    json c = json::parse(dsinfer_test::slurp(d + "/config.json"));
    c["architectures"] = {"MysteryForCausalLM"};
    c["model_type"] = "mystery";
    std::ofstream(d + "/config.json") << c.dump();
    expect_clean_error(run_dsinfer({"generate", "--model-path", d, "--prompt-ids", "1"}), "MysteryForCausalLM");
  }
  {
    std::string d = copy_model("missing_field");
    json c = json::parse(dsinfer_test::slurp(d + "/config.json"));
    c.erase("hidden_size");
    std::ofstream(d + "/config.json") << c.dump();
    expect_clean_error(run_dsinfer({"generate", "--model-path", d, "--prompt-ids", "1"}), "hidden_size");
  }
  {
    std::string d = copy_model("wrong_shape");
    json c = json::parse(dsinfer_test::slurp(d + "/config.json"));
    c["intermediate_size"] = c["intermediate_size"].get<int>() + 8;
    std::ofstream(d + "/config.json") << c.dump();
    expect_clean_error(run_dsinfer({"generate", "--model-path", d, "--prompt-ids", "1"}), "mlp");
  }
  {
    std::string d = copy_model("bad_json");
    std::ofstream(d + "/config.json") << "{\"vocab_size\": ";
    expect_clean_error(run_dsinfer({"generate", "--model-path", d, "--prompt-ids", "1"}), "config.json");
  }
}

TEST(CliGenerate, BadFlagsExitNonZero) {
  auto r = run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1", "--temperature", "-1"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;
  r = run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1", "--max-tokens", "0"});
  EXPECT_NE(r.exit_code, 0);
  r = run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--prompt"), std::string::npos) << r.err;
  // Chat-only flags without --chat are refused, not ignored.
  r = run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1", "--system", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--system"), std::string::npos) << r.err;
  r = run_dsinfer({"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1", "--no-think"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--no-think"), std::string::npos) << r.err;
}

// DSINFER_HEAP_THP (main.cpp: the huge-page heap re-exec) takes 0 or 1; anything else is one
// line naming it and exit 1, before any command runs. Both accepted values still run.
TEST(CliGenerate, HeapThpKnobTakesOnlyZeroOrOne) {
  const std::vector<std::string> args = {"generate", "--model-path", kGoldenDir + "/tied_gqa2", "--prompt-ids", "1,2",
                                         "--max-tokens", "2"};
  setenv("DSINFER_HEAP_THP", "yes", 1);
  const auto bad = run_dsinfer(args);
  unsetenv("DSINFER_HEAP_THP");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.err, "dsinfer: error: DSINFER_HEAP_THP must be 0 or 1, not 'yes'\n");
  for (const char* v : {"0", "1"}) {
    setenv("DSINFER_HEAP_THP", v, 1);
    const auto ok = run_dsinfer(args);
    unsetenv("DSINFER_HEAP_THP");
    EXPECT_EQ(ok.exit_code, 0) << v << ": " << ok.err;
  }
}
