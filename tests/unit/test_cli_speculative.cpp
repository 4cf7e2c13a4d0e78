// End-to-end tests of `dsinfer generate` with speculative decoding flags: --spec ngram
// reproduces --spec none (greedy) and reports tau / acceptance per position in --json and
// on stderr, --block-size and --dflash-max-reuse-depth cap the drafts, --log-dflash-details
// writes one parseable JSON line per round, and every bad combination of flags exits 1
// with one error line naming the flag. With the drafter fixtures of tests/data/drafters
// (tiny DFlash/DSpark checkpoints with their targets): --spec dflash/dspark greedy output
// equals plain greedy, sampled runs honour the budget, a kind mismatch and a block size
// above the checkpoint's are one-line errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_helpers.h"

using dsinfer_test::run_dsinfer;
using json = nlohmann::json;

namespace {
const std::string kModel = std::string(DSINFER_TEST_DATA) + "/qwen3/yarn_gqa3";
std::vector<std::string> base_args() {
  return {"generate", "--model-path", kModel, "--prompt-ids", "10,11,12,10,11,12", "--max-tokens", "48",
          "--ignore-eos", "--threads", "1"};
}
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
void expect_error(const std::vector<std::string>& args, const std::string& needle) {
  auto r = run_dsinfer(args);
  EXPECT_EQ(r.exit_code, 1) << needle << ": " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(dsinfer_test::count_lines(r.err), 1) << r.err;
}
}  // namespace

TEST(CliSpeculative, NgramMatchesPlainAndReportsStats) {
  auto none = run_dsinfer(with(base_args(), {"--spec", "none", "--json"}));
  ASSERT_EQ(none.exit_code, 0) << none.err;
  auto plain = json::parse(none.out);
  EXPECT_EQ(plain["spec"]["method"], "none");
  EXPECT_DOUBLE_EQ(plain["spec"]["tau"].get<double>(), 1.0);
  EXPECT_EQ(plain["spec"]["rounds"].get<size_t>() + 1, plain["ids"].size());
  auto default_run = run_dsinfer(with(base_args(), {"--json"}));
  EXPECT_EQ(json::parse(default_run.out)["ids"], plain["ids"]);

  auto ng = run_dsinfer(with(base_args(), {"--spec", "ngram", "--json"}));
  ASSERT_EQ(ng.exit_code, 0) << ng.err;
  auto j = json::parse(ng.out);
  EXPECT_EQ(j["ids"], plain["ids"]);
  EXPECT_EQ(j["spec"]["method"], "ngram");
  EXPECT_GT(j["spec"]["tau"].get<double>(), 1.0);
  EXPECT_LE(j["spec"]["acceptance"].size(), 8u);  // default: 8 drafts per round at most
  ASSERT_GE(j["spec"]["acceptance"].size(), 1u);
  EXPECT_EQ(j["spec"]["acceptance"][0]["position"], 1);
  EXPECT_TRUE(j["spec"].contains("tokens_per_second"));
  EXPECT_NE(ng.err.find("tau"), std::string::npos) << ng.err;
  EXPECT_NE(ng.err.find("accepted by draft position"), std::string::npos) << ng.err;

  // Text mode: the stats line on stderr as well.
  auto txt = run_dsinfer(with(base_args(), {"--spec", "ngram"}));
  ASSERT_EQ(txt.exit_code, 0) << txt.err;
  EXPECT_NE(txt.err.find("spec ngram:"), std::string::npos) << txt.err;
}

TEST(CliSpeculative, DraftCapsAndNgramOptions) {
  auto r = run_dsinfer(with(base_args(), {"--spec", "ngram", "--block-size", "3", "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto plain = json::parse(run_dsinfer(with(base_args(), {"--json"})).out);
  auto j = json::parse(r.out);
  EXPECT_EQ(j["ids"], plain["ids"]);
  EXPECT_LE(j["spec"]["acceptance"].size(), 3u);
  auto d = run_dsinfer(with(base_args(), {"--spec", "ngram", "--dflash-max-reuse-depth", "2", "--json"}));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_LE(json::parse(d.out)["spec"]["acceptance"].size(), 2u);
  EXPECT_EQ(json::parse(d.out)["ids"], plain["ids"]);
  auto z = run_dsinfer(with(base_args(), {"--spec", "ngram", "--dflash-max-reuse-depth", "0", "--json"}));
  ASSERT_EQ(z.exit_code, 0) << z.err;
  EXPECT_EQ(json::parse(z.out)["spec"]["acceptance"].size(), 0u);
  EXPECT_DOUBLE_EQ(json::parse(z.out)["spec"]["tau"].get<double>(), 1.0);
  auto n = run_dsinfer(with(base_args(), {"--spec", "ngram", "--ngram-max", "2", "--ngram-min", "2", "--json"}));
  ASSERT_EQ(n.exit_code, 0) << n.err;
  EXPECT_EQ(json::parse(n.out)["ids"], plain["ids"]);
  // Sampling through the CLI stays seeded and reproducible with a drafter.
  auto s1 = run_dsinfer(with(base_args(), {"--spec", "ngram", "--temperature", "0.8", "--seed", "4", "--json"}));
  auto s2 = run_dsinfer(with(base_args(), {"--spec", "ngram", "--temperature", "0.8", "--seed", "4", "--json"}));
  ASSERT_EQ(s1.exit_code, 0) << s1.err;
  EXPECT_EQ(json::parse(s1.out)["ids"], json::parse(s2.out)["ids"]);
  EXPECT_EQ(json::parse(s1.out)["ids"].size(), 48u);
}

TEST(CliSpeculative, DetailsLogHasOneJsonLinePerRound) {
  std::string dir = dsinfer_test::make_temp_dir("spec_log");
  std::string path = dir + "/rounds.jsonl";
  auto r = run_dsinfer(with(base_args(), {"--spec", "ngram", "--log-dflash-details", path, "--json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = json::parse(r.out);
  std::istringstream in(dsinfer_test::slurp(path));
  std::string line;
  size_t rounds = 0, committed = 0;
  while (std::getline(in, line)) {
    auto rec = json::parse(line);
    EXPECT_EQ(rec["round"], rounds);
    EXPECT_EQ(rec["verify_len"].get<size_t>(), rec["draft_ids"].size() + 1);
    EXPECT_TRUE(rec.contains("confidences") && rec.contains("accepted") && rec.contains("draft_ms") &&
                rec.contains("verify_ms"));
    committed += rec["committed"].get<size_t>();
    rounds++;
  }
  EXPECT_EQ(rounds, j["spec"]["rounds"].get<size_t>());
  EXPECT_EQ(committed + 1, j["ids"].size());
  std::filesystem::remove_all(dir);
}

TEST(CliSpeculative, DflashAndDsparkCheckpointsAreLossless) {
  const std::string root = std::string(DSINFER_TEST_DATA) + "/drafters";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << root << " not present";
  int cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string dir = entry.path().string();
    if (!std::filesystem::exists(dir + "/draft/config.json")) continue;
    json cfg = json::parse(dsinfer_test::slurp(dir + "/draft/config.json"));
    const bool zlab = cfg.contains("dflash_config");
    std::vector<std::string> args = {"generate", "--model-path", dir + "/target", "--prompt-ids", "5,6,7,8,5,6,7,8",
                                     "--max-tokens", "24", "--ignore-eos", "--threads", "1", "--json"};
    auto plain = run_dsinfer(args);
    ASSERT_EQ(plain.exit_code, 0) << dir << ": " << plain.err;
    // The kind comes from the checkpoint: try dflash; a DSpark checkpoint is refused with
    // a message naming --spec dspark.
    std::string method = "dflash", other = "dspark";
    auto spec = run_dsinfer(with(args, {"--spec", method, "--draft-model-path", dir + "/draft"}));
    if (spec.exit_code == 1 && spec.err.find("use --spec dspark") != std::string::npos) {
      std::swap(method, other);
      spec = run_dsinfer(with(args, {"--spec", method, "--draft-model-path", dir + "/draft"}));
    }
    ASSERT_EQ(spec.exit_code, 0) << dir << ": " << spec.err;
    auto j = json::parse(spec.out);
    EXPECT_EQ(j["ids"], json::parse(plain.out)["ids"]) << dir;
    EXPECT_EQ(j["spec"]["method"], method);
    EXPECT_GE(j["spec"]["tau"].get<double>(), 1.0);
    // The lookup assist on and off: only the proposals differ, never the output.
    for (const char* lk : {"on", "off"}) {
      auto l = run_dsinfer(with(args, {"--spec", method, "--draft-model-path", dir + "/draft", "--spec-lookup", lk}));
      ASSERT_EQ(l.exit_code, 0) << dir << " --spec-lookup " << lk << ": " << l.err;
      auto lj = json::parse(l.out);
      EXPECT_EQ(lj["ids"], json::parse(plain.out)["ids"]) << dir << " --spec-lookup " << lk;
      if (std::string(lk) == "off") {
        EXPECT_EQ(lj["spec"]["lookup_rounds"], 0) << dir;
      }
    }
    // Mismatched kind.
    expect_error(with(args, {"--spec", other, "--draft-model-path", dir + "/draft"}), "use --spec " + method);
    // Block size: above the checkpoint's is an error, below caps the drafts.
    const int bs = cfg.value("block_size", 0);
    ASSERT_GT(bs, 1) << dir;
    expect_error(with(args, {"--spec", method, "--draft-model-path", dir + "/draft", "--block-size", std::to_string(bs + 1)}),
                 "--block-size");
    auto small = run_dsinfer(with(args, {"--spec", method, "--draft-model-path", dir + "/draft", "--block-size", "2"}));
    ASSERT_EQ(small.exit_code, 0) << small.err;
    EXPECT_LE(json::parse(small.out)["spec"]["acceptance"].size(), zlab ? 1u : 2u);
    EXPECT_EQ(json::parse(small.out)["ids"], json::parse(plain.out)["ids"]);
    // A draft context window (even a tiny one) changes only acceptance, never the output.
    auto windowed = run_dsinfer(with(args, {"--spec", method, "--draft-model-path", dir + "/draft",
                                            "--dflash-window-size", "3"}));
    ASSERT_EQ(windowed.exit_code, 0) << windowed.err;
    EXPECT_EQ(json::parse(windowed.out)["ids"], json::parse(plain.out)["ids"]) << dir << " with --dflash-window-size 3";
    // Sampling: seeded, exact budget.
    auto sampled = run_dsinfer(with(args, {"--spec", method, "--draft-model-path", dir + "/draft", "--temperature", "1",
                                           "--seed", "3"}));
    ASSERT_EQ(sampled.exit_code, 0) << sampled.err;
    EXPECT_EQ(json::parse(sampled.out)["ids"].size(), 24u);
    // The lookup assist is on by default; a sampled run's choices never depend on measured
    // time, so the seed reproduces the output.
    auto again = run_dsinfer(with(args, {"--spec", method, "--draft-model-path", dir + "/draft", "--temperature", "1",
                                         "--seed", "3"}));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(json::parse(again.out)["ids"], json::parse(sampled.out)["ids"]) << dir;
    cases++;
  }
  EXPECT_GE(cases, 3);
}

TEST(CliSpeculative, DraftDirectoryAndWindowErrors) {
  expect_error(with(base_args(), {"--spec", "dspark", "--draft-model-path", "/nonexistent/draft"}), "--draft-model-path");
  expect_error(with(base_args(), {"--spec", "ngram", "--dflash-window-size", "16"}), "--dflash-window-size");
  expect_error(with(base_args(), {"--dflash-window-size", "16"}), "--dflash-window-size");
}

TEST(CliSpeculative, BadFlagCombinationsAreOneLineErrors) {
  auto b = base_args();
  expect_error(with(b, {"--spec", "dflash"}), "--spec dflash: needs --draft-model-path");
  expect_error(with(b, {"--spec", "dspark"}), "--spec dspark: needs --draft-model-path");
  expect_error(with(b, {"--spec", "dflash", "--draft-model-path", "/nonexistent/draft"}), "/nonexistent/draft");
  expect_error(with(b, {"--spec", "ngram", "--draft-model-path", kModel}), "--draft-model-path");
  expect_error(with(b, {"--spec", "none", "--draft-model-path", kModel}), "--draft-model-path");
  expect_error(with(b, {"--spec", "ngram", "--ngram-max", "2", "--ngram-min", "3"}), "--ngram-min");
  expect_error(with(b, {"--ngram-max", "2"}), "--spec ngram");
  expect_error(with(b, {"--block-size", "4"}), "--block-size");
  expect_error(with(b, {"--dflash-max-reuse-depth", "2"}), "--dflash-max-reuse-depth");
  expect_error(with(b, {"--spec", "ngram", "--spec-lookup", "on"}), "--spec-lookup");
  expect_error(with(b, {"--spec-lookup", "on"}), "--spec-lookup");
  expect_error(with(b, {"--spec", "ngram", "--log-dflash-details", "/nonexistent/dir/x.jsonl"}),
               "--log-dflash-details");
  // Flag syntax errors come from the parser (its own exit code), never a crash.
  for (auto extra : std::vector<std::vector<std::string>>{
           {"--spec", "medusa"}, {"--spec", "ngram", "--block-size", "0"}, {"--spec-lookup", "maybe"}}) {
    auto r = run_dsinfer(with(b, extra));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_GE(r.exit_code, 0) << "crashed";
  }
}

// --dflash-validation-threshold prunes the verified drafts by (calibrated) prefix survival:
// a higher threshold never verifies more drafts, the output never changes, and drafters
// without a confidence head refuse the flag. (The lookup assist is off: its rounds verify
// lookup drafts, which the drafter's confidences do not gate.)
TEST(CliSpeculative, ValidationThresholdPrunesWithoutChangingOutput) {
  const std::string dir = std::string(DSINFER_TEST_DATA) + "/drafters/dspark_vanilla";
  if (!std::filesystem::exists(dir + "/draft/config.json")) GTEST_SKIP() << dir << " absent";
  std::vector<std::string> args = {"generate", "--model-path", dir + "/target", "--draft-model-path", dir + "/draft",
                                   "--spec", "dspark", "--prompt-ids", "5,6,7,8,9,10", "--max-tokens", "40",
                                   "--ignore-eos", "--json", "--spec-lookup", "off"};
  json first;
  int64_t last_proposed = INT64_MAX;
  for (const char* t : {"0", "0.3", "0.6", "0.95"}) {
    auto r = run_dsinfer(with(args, {"--dflash-validation-threshold", t}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = json::parse(r.out);
    if (first.is_null()) first = j;
    EXPECT_EQ(j["ids"], first["ids"]) << "threshold " << t;
    int64_t proposed = 0;
    for (const auto& p : j["spec"]["acceptance"]) proposed += p["proposed"].get<int64_t>();
    EXPECT_LE(proposed, last_proposed) << "threshold " << t;
    last_proposed = proposed;
  }
  EXPECT_LT(last_proposed, 10) << "a 0.95 threshold should prune almost every draft of this random head";
  const std::string nohead = std::string(DSINFER_TEST_DATA) + "/drafters/deepspec_dflash";
  expect_error({"generate", "--model-path", nohead + "/target", "--draft-model-path", nohead + "/draft", "--spec",
                "dflash", "--prompt-ids", "5,6", "--dflash-validation-threshold", "0.5"},
               "confidence head");
  expect_error(with(base_args(), {"--spec", "ngram", "--dflash-validation-threshold", "0.5"}),
               "--dflash-validation-threshold");
}
