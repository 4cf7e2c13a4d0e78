// CUDA backend, end to end through the binary: `--device cuda` is refused with one line
// when the binary has no CUDA backend or the machine no GPU (what CI sees), and runs
// generate / bench-model on the GPU when there is one.
#include <gtest/gtest.h>

#include <algorithm>
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
  for (const char* cmd : {"generate", "bench-model"}) {
    std::vector<std::string> args = {cmd, "--model-path", kTiny, "--device", "cuda"};
    if (std::string(cmd) == "generate") args.insert(args.end(), {"--prompt-ids", "1,2,3", "--max-tokens", "2"});
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
