// End-to-end tests of `dsinfer calibrate` on the committed DSpark drafter goldens
// (tests/data/drafters/dspark_*, DSINFER_DRAFTER_GOLDENS=DIR overrides; skipped when absent).
//
// Data flow: the golden case's draft/ is copied to a scratch directory (so the default
// output DRAFT_DIR/calibration.json never touches tests/data) → a prompts file of
// {"prompt_ids": [...]} lines written here → the built binary → exit code, the printed
// table, and calibration.json read back through load_calibration (strict parse +
// fingerprint check). Also: --out, --block-size, sampling determinism, refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_helpers.h"
#include "core/mapped_file.h"
#include "spec/calibration.h"

using dsinfer_test::run_dsinfer;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::getenv("DSINFER_DRAFTER_GOLDENS") ? std::getenv("DSINFER_DRAFTER_GOLDENS")
                                                                 : std::string(DSINFER_TEST_DATA) + "/drafters";

struct Scratch {
  std::string dir, target, draft, prompts;
  explicit Scratch(const std::string& name, const std::string& tag, int n_prompts) {
    dir = dsinfer_test::make_temp_dir("calibrate_" + tag);
    target = kDir + "/" + name + "/target";
    draft = dir + "/draft";
    fs::copy(kDir + "/" + name + "/draft", draft, fs::copy_options::recursive);
    prompts = dir + "/prompts.jsonl";
    std::ofstream out(prompts);
    std::mt19937 g(17);
    for (int i = 0; i < n_prompts; ++i) {
      nlohmann::json ids = nlohmann::json::array();
      const int len = 6 + static_cast<int>(g() % 8);
      for (int k = 0; k < len; ++k) ids.push_back(3 + static_cast<int>(g() % 250));
      out << nlohmann::json{{"prompt_ids", ids}}.dump() << "\n";
    }
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  dsinfer_test::RunResult run(std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"calibrate",  "--model-path", target,      "--draft-model-path", draft,
                                     "--prompts",  prompts,        "--threads", "1",                  "--max-tokens",
                                     "48",         "--max-rounds", "120"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_dsinfer(args);
  }
};

bool have(const std::string& name) { return fs::exists(kDir + "/" + name + "/golden.json"); }

TEST(CliCalibrate, WritesCalibrationBesideTheDrafter) {
  if (!have("dspark_vanilla")) GTEST_SKIP() << "no golden case " << kDir << "/dspark_vanilla";
  Scratch s("dspark_vanilla", "beside", 12);
  auto r = s.run();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* t : {"STS calibration: gamma 6 drafts (block size 6), sampling temperature 0", "fit: ",
                        "from 10 prompts", "held-out: ", "from 2 prompts", "ECE_raw", "ECE_sts", "AUROC_sts", "wrote "})
    EXPECT_NE(r.out.find(t), std::string::npos) << "missing '" << t << "' in:\n" << r.out;
  auto c = dsinfer::load_calibration(s.draft);  // strict parse + fingerprint check
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->temperatures.size(), 6u);
  EXPECT_EQ(c->block_size, 6);
  EXPECT_EQ(c->sampling_temperature, 0.0);
  EXPECT_GT(c->rounds, 0);
  EXPECT_LE(c->rounds, 120);
  EXPECT_GT(c->heldout_rounds, 0);
  for (double t : c->temperatures) {
    EXPECT_GE(t, 0.25 - 1e-12);
    EXPECT_LE(t, 4.0 + 1e-12);
  }
  // Greedy calibration is deterministic: a second run writes the same file.
  const std::string first = dsinfer::read_text_file(dsinfer::calibration_path(s.draft));
  ASSERT_EQ(s.run().exit_code, 0);
  EXPECT_EQ(dsinfer::read_text_file(dsinfer::calibration_path(s.draft)), first);
}

TEST(CliCalibrate, OutBlockSizeAndSampling) {
  if (!have("dspark_rnn")) GTEST_SKIP() << "no golden case " << kDir << "/dspark_rnn";
  Scratch s("dspark_rnn", "out", 4);  // < 10 prompts: no held-out split
  const std::string out = s.dir + "/cal.json";
  auto r = s.run({"--out", out, "--block-size", "3", "--temperature", "1", "--seed", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("held-out"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dsinfer::calibration_path(s.draft)));
  const dsinfer::Calibration c = dsinfer::read_calibration(out);
  EXPECT_EQ(c.temperatures.size(), 3u);
  EXPECT_EQ(c.block_size, 3);
  EXPECT_EQ(c.sampling_temperature, 1.0);
  EXPECT_EQ(c.heldout_rounds, 0);
  EXPECT_EQ(c.drafter_fingerprint, dsinfer::drafter_fingerprint(s.draft));
  const std::string first = dsinfer::read_text_file(out);
  ASSERT_EQ(s.run({"--out", out, "--block-size", "3", "--temperature", "1", "--seed", "5"}).exit_code, 0);
  EXPECT_EQ(dsinfer::read_text_file(out), first);  // same seed, same rounds
}

TEST(CliCalibrate, Refusals) {
  if (!have("deepspec_dflash") || !have("dspark_vanilla")) GTEST_SKIP() << "no golden cases under " << kDir;
  {
    Scratch s("deepspec_dflash", "nohead", 2);
    auto r = s.run();
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("has no confidence head"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dsinfer::calibration_path(s.draft)));
  }
  Scratch s("dspark_vanilla", "bad", 2);
  { std::ofstream(s.prompts) << "{\"prompt_ids\": [5, 6]}\n{\"prompt\": \"hello\"}\n"; }
  auto r = s.run();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(s.prompts + ":2: field 'prompt': text prompts need the target's tokenizer.json"), std::string::npos)
      << r.err;
  { std::ofstream(s.prompts) << "{\"prompt_ids\": [5, 999]}\n"; }
  r = s.run();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(":1: field 'prompt_ids'"), std::string::npos) << r.err;
  r = s.run({"--block-size", "9"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--block-size"), std::string::npos) << r.err;
  r = run_dsinfer({"calibrate", "--model-path", s.target, "--draft-model-path", s.draft});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--prompts"), std::string::npos) << r.err;
}

}  // namespace
