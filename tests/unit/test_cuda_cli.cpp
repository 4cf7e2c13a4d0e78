// CUDA backend, end to end through the binary: `--device cuda` is refused with one line
// when the binary has no CUDA backend or the machine no GPU (what CI sees), and runs
// generate / bench-model on the GPU when there is one; bench-engine's prompt_ids path for
// model directories without a tokenizer (random-weight checkpoints).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#ifdef DSINFER_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

using dsinfer_test::run_dsinfer;

namespace {
const std::string kTiny = std::string(DSINFER_TEST_DATA) + "/qwen3/tied_gqa2";

bool gpu_present() {
#ifdef DSINFER_HAS_CUDA
  return dsinfer::cuda_unavailable_reason().empty();
#else
  return false;
#endif
}
}  // namespace

TEST(CudaCli, DeviceCudaRefusedWithOneLineWithoutGpu) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present (see DeviceCudaRunsOnGpu)";
  for (const char* cmd : {"generate", "bench-model", "bench-engine", "serve"}) {
    std::vector<std::string> args = {cmd, "--model-path", kTiny, "--device", "cuda"};
    if (std::string(cmd) == "generate") args.insert(args.end(), {"--prompt-ids", "1,2,3", "--max-tokens", "2"});
    if (std::string(cmd) == "bench-engine") args.insert(args.end(), {"--prompts", "/nonexistent.jsonl", "--policies", "none"});
    if (std::string(cmd) == "serve") args.insert(args.end(), {"--spec", "none", "--port", "0"});  // refused before binding
    const auto r = run_dsinfer(args);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(CudaCli, DeviceCudaRunsOnGpu) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU (or built without DSINFER_CUDA)";
  const auto g = run_dsinfer({"generate", "--model-path", kTiny, "--device", "cuda", "--prompt-ids", "1,2,3",
                              "--max-tokens", "8", "--ignore-eos", "--json"});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto j = nlohmann::json::parse(g.out);
  EXPECT_EQ(j.at("ids").size(), 8u);
  const auto b = run_dsinfer({"bench-model", "--model-path", kTiny, "--device", "cuda", "--prompt-tokens", "8",
                              "--decode-tokens", "8", "--repeat", "1", "--json"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto bj = nlohmann::json::parse(b.out);
  EXPECT_GT(bj.at("decode_tokens_per_s").get<double>(), 0.0);
  EXPECT_NE(bj.at("device").get<std::string>().find("cuda"), std::string::npos);
}

// check-env names the CUDA backend's device as its runtime sees it (a CUDA build), or says
// why it is unavailable; a CPU-only build says "CPU only".
TEST(CudaCli, CheckEnvReportsTheCudaBackend) {
  const auto r = run_dsinfer({"check-env", "--json"});
  ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.err;
  const auto j = nlohmann::json::parse(r.out);
#ifdef DSINFER_HAS_CUDA
  EXPECT_TRUE(j.at("built_with_cuda").get<bool>());
  const std::string backend = j.at("cuda_backend").get<std::string>();
  if (gpu_present()) {
    EXPECT_NE(backend.find("sm_"), std::string::npos) << backend;
  } else {
    EXPECT_EQ(backend.rfind("unavailable: ", 0), 0u) << backend;
  }
  const auto t = run_dsinfer({"check-env"});
  EXPECT_NE(t.out.find("this build: with the CUDA backend (--device cuda): " + backend), std::string::npos) << t.out;
#else
  EXPECT_FALSE(j.at("built_with_cuda").get<bool>());
  EXPECT_EQ(j.at("cuda_backend").get<std::string>(), "");
#endif
}

// Target on the GPU (batch-invariant GEMM, CUDA graphs), drafter on the CPU: greedy
// speculation gives exactly the plain greedy ids, for every shipped drafter present (a
// device call may carry only some of them; none present: skipped), with either fixed-order
// GEMM (--cuda-gemm invariant: tensor cores; rows: the row kernel; each has its own
// rounding, so each is compared with its own plain run).
TEST(CudaCli, GreedySpeculationEqualsPlainGreedyOnGpu) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU (or built without DSINFER_CUDA)";
  const std::string root = std::string(DSINFER_SOURCE_DIR) + "/models/embedded/";
  int ran = 0;
  for (const char* gemm : {"invariant", "rows"}) {
    SCOPED_TRACE(gemm);
    const std::vector<std::string> base = {"generate", "--model-path", root + "target", "--device", "cuda",
                                           "--cuda-gemm", gemm, "--prompt",
                                           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                                           "--max-tokens", "64", "--ignore-eos", "--json"};
    const auto plain = run_dsinfer(base);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const auto want = nlohmann::json::parse(plain.out).at("ids");
    ASSERT_EQ(want.size(), 64u);
    for (const char* d : {"dflash-zlab", "dspark", "dflash"}) {
      if (!std::ifstream(root + d + "/config.json")) continue;
      std::vector<std::string> args = base;
      args.insert(args.end(), {"--draft-model-path", root + d});
      const auto r = run_dsinfer(args);
      ASSERT_EQ(r.exit_code, 0) << d << ": " << r.err;
      const auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j.at("ids"), want) << d;
      EXPECT_GT(j.at("spec").at("rounds").get<int>(), 0) << d;
      std::cout << "[cuda spec] " << gemm << ", " << d << ": tau " << j.at("spec").at("tau").get<double>()
                << ", ids equal to plain greedy\n";
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "no drafter under " << root;
}

// bench-engine on a model directory without tokenizer.json (make-random-model's, or a test
// checkpoint): prompt_ids prompts run, a text prompt is one line naming the file and line.
TEST(CudaCli, BenchEngineWithoutTokenizerTakesPromptIds) {
  const std::string dir = ::testing::TempDir() + "/dsinfer_bench_engine_prompts";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "/ids.jsonl") << "{\"prompt_ids\": [1, 2, 3, 4]}\n{\"prompt_ids\": [5, 6]}\n";
    std::ofstream(dir + "/text.jsonl") << "{\"prompt\": \"hello\"}\n";
  }
  const auto ok = run_dsinfer({"bench-engine", "--model-path", kTiny, "--prompts", dir + "/ids.jsonl", "--policies",
                               "none", "--concurrency", "2", "--max-tokens", "4", "--json"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j.at("device").get<std::string>(), "cpu");
  EXPECT_GT(j.at("cells").at(0).at("output_tokens").get<int>(), 0);
  const auto bad = run_dsinfer({"bench-engine", "--model-path", kTiny, "--prompts", dir + "/text.jsonl", "--policies",
                                "none", "--concurrency", "2", "--max-tokens", "4"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("text.jsonl:1"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("tokenizer.json"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

// bench-model --verify-blocks (any device; here the CPU): one entry per block size, in the
// order given, the first one the unit of cost_vs_first.
TEST(CudaCli, BenchModelVerifyBlocks) {
  const auto b = run_dsinfer({"bench-model", "--model-path", kTiny, "--prompt-tokens", "8", "--decode-tokens", "4",
                              "--repeat", "1", "--verify-blocks", "1,4,8", "--verify-reps", "3", "--json"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto v = nlohmann::json::parse(b.out).at("verify_blocks");
  ASSERT_EQ(v.size(), 3u);
  const std::vector<int> want = {1, 4, 8};
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i].at("block").get<int>(), want[i]);
    EXPECT_GT(v[i].at("ms_median").get<double>(), 0.0);
  }
  EXPECT_DOUBLE_EQ(v[0].at("cost_vs_first").get<double>(), 1.0);
  const auto bad = run_dsinfer({"bench-model", "--model-path", kTiny, "--verify-blocks", "0"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--verify-blocks"), std::string::npos) << bad.err;
}
