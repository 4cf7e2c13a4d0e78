// End-to-end tests of `dsinfer debug-dflash` against the committed drafter goldens
// (tests/data/drafters/<case>/, PyTorch reference; DSINFER_DRAFTER_GOLDENS=DIR overrides).
//
// Data flow: golden.json "prompt" → `dsinfer debug-dflash --json --prompt-ids ...` (the
// built binary) → the one JSON object on stdout → compared with golden "rounds"[0]:
// anchor, draft_ids, accepted exactly; draft_logprobs and confidence within
// 1e-4·max(1, |ref|); confidence null exactly when the golden has none. Also --block-size,
// the readable report, calibration.json beside the drafter (calibrated_survival), and
// refusals. Absent cases are skipped with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "core/mapped_file.h"
#include "spec/calibration.h"

using dsinfer_test::run_dsinfer;
using json = nlohmann::json;

namespace {

const std::string kDir = std::getenv("DSINFER_DRAFTER_GOLDENS") ? std::getenv("DSINFER_DRAFTER_GOLDENS")
                                                                 : std::string(DSINFER_TEST_DATA) + "/drafters";
const std::vector<std::string> kCases = {"zlab_dflash",    "zlab_dflash_default_layers", "deepspec_dflash",
                                         "dspark_vanilla", "dspark_gated",               "dspark_rnn"};

bool have(const std::string& name) { return std::filesystem::exists(kDir + "/" + name + "/golden.json"); }
json golden(const std::string& name) { return json::parse(dsinfer::read_text_file(kDir + "/" + name + "/golden.json")); }

std::string ids_arg(const json& prompt) {
  std::string s;
  for (const auto& v : prompt) {
    if (!s.empty()) s += ',';
    s += std::to_string(v.get<int>());
  }
  return s;
}

dsinfer_test::RunResult debug(const std::string& target, const std::string& draft, const std::string& ids,
                              std::vector<std::string> extra = {"--json"}) {
  std::vector<std::string> args = {"debug-dflash", "--model-path", target, "--draft-model-path", draft, "--prompt-ids", ids,
                                   "--threads", "1", "--matmul-precision", "f32"};  // goldens: F32 reference arithmetic
  args.insert(args.end(), extra.begin(), extra.end());
  return run_dsinfer(args);
}

void expect_close(const json& got, const json& ref, const std::string& what) {
  ASSERT_TRUE(got.is_array()) << what;
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double a = got[i].get<double>(), b = ref[i].get<double>();
    EXPECT_LE(std::abs(a - b), 1e-4 * std::max(1.0, std::abs(b))) << what << "[" << i << "]: " << a << " vs " << b;
  }
}

class DebugDflashGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(DebugDflashGolden, FirstRoundMatchesGolden) {
  const std::string name = GetParam();
  if (!have(name)) GTEST_SKIP() << "no golden case " << kDir << "/" << name << " (produced by the PyTorch reference)";
  const json g = golden(name);
  const json& R = g.at("rounds").at(0);
  const std::string d = kDir + "/" + name;
  auto r = debug(d + "/target", d + "/draft", ids_arg(g.at("prompt")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(dsinfer_test::count_lines(r.out), 1) << "exactly one JSON object expected:\n" << r.out;
  const json j = json::parse(r.out);
  for (const char* f : {"anchor", "draft_ids", "draft_logprobs", "confidence", "accepted"})
    ASSERT_TRUE(j.contains(f)) << "field " << f << " missing: " << r.out;
  EXPECT_EQ(j["anchor"], R.at("anchor"));
  EXPECT_EQ(j["draft_ids"], R.at("draft_ids"));
  EXPECT_EQ(j["accepted"], R.at("accepted"));
  expect_close(j["draft_logprobs"], R.at("draft_logprobs"), "draft_logprobs");
  if (R.at("confidence").is_null()) {
    EXPECT_TRUE(j["confidence"].is_null());
  } else {
    expect_close(j["confidence"], R.at("confidence"), "confidence");
  }
  EXPECT_EQ(j["dialect"], g.at("dialect"));
  EXPECT_EQ(j["block_size"], g.at("block_size"));
  EXPECT_EQ(j["mask_token_id"], g.at("mask_token_id"));
  EXPECT_EQ(j["target_layer_ids"], g.at("target_layer_ids"));
  const auto tg = j["target_greedy"].get<std::vector<int>>(), ref_tg = R.at("target_greedy").get<std::vector<int>>();
  ASSERT_LE(ref_tg.size(), tg.size());
  EXPECT_EQ(std::vector<int>(tg.begin(), tg.begin() + ref_tg.size()), ref_tg);
  EXPECT_FALSE(j.contains("calibrated_survival"));
}

INSTANTIATE_TEST_SUITE_P(Cases, DebugDflashGolden, ::testing::ValuesIn(kCases));

TEST(DebugDflash, BlockSizeKeepsTheFirstDrafts) {
  if (!have("dspark_vanilla")) GTEST_SKIP() << "no golden case dspark_vanilla";
  const json g = golden("dspark_vanilla");
  const json& R = g.at("rounds").at(0);
  const std::string d = kDir + "/dspark_vanilla";
  auto r = debug(d + "/target", d + "/draft", ids_arg(g.at("prompt")), {"--json", "--block-size", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  const auto ids = R.at("draft_ids").get<std::vector<int>>();
  EXPECT_EQ(j["draft_ids"].get<std::vector<int>>(), std::vector<int>(ids.begin(), ids.begin() + 3));  // DeepSpec: N drafts
  EXPECT_EQ(j["confidence"].size(), 3u);
  EXPECT_EQ(j["accepted"].get<int>(), std::min(3, R.at("accepted").get<int>()));
  EXPECT_EQ(j["block_size"], 3);
  auto bad = debug(d + "/target", d + "/draft", ids_arg(g.at("prompt")), {"--json", "--block-size", "7"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--block-size"), std::string::npos) << bad.err;
}

TEST(DebugDflash, ReadableReport) {
  if (!have("dspark_vanilla")) GTEST_SKIP() << "no golden case dspark_vanilla";
  const json g = golden("dspark_vanilla");
  const std::string d = kDir + "/dspark_vanilla";
  auto r = debug(d + "/target", d + "/draft", ids_arg(g.at("prompt")), {});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"dialect deepspec, kind dspark, block size 6", "target layer ids: [0, 2]", "mask id 255",
                        "markov head: vanilla (rank 16)", "confidence head: yes (with the Markov feature)",
                        "calibration: none", "process RSS", "round 0: prompt", "accepted "})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in:\n" << r.out;
}

TEST(DebugDflash, CalibratedSurvivalWhenCalibrationPresent) {
  if (!have("dspark_vanilla")) GTEST_SKIP() << "no golden case dspark_vanilla";
  namespace fs = std::filesystem;
  const json g = golden("dspark_vanilla");
  const std::string d = kDir + "/dspark_vanilla";
  const std::string tmp = dsinfer_test::make_temp_dir("debug_dflash_cal");
  fs::copy(d + "/draft", tmp + "/draft", fs::copy_options::recursive);
  dsinfer::Calibration c;
  c.temperatures = {2.0, 0.5, 1.0, 1.0, 1.0, 1.0};
  c.block_size = 6;
  c.ece_before = c.ece_after = c.auroc = std::vector<double>(6, 0.5);
  c.drafter_fingerprint = dsinfer::drafter_fingerprint(tmp + "/draft");
  dsinfer::write_calibration(tmp + "/draft/calibration.json", c);
  auto r = debug(d + "/target", tmp + "/draft", ids_arg(g.at("prompt")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_TRUE(j.contains("calibrated_survival")) << r.out;
  const auto z = j["confidence_logits"].get<std::vector<double>>();
  const auto s = j["calibrated_survival"].get<std::vector<double>>();
  ASSERT_EQ(s.size(), z.size());
  double a = 1.0;
  for (size_t k = 0; k < z.size(); ++k) {
    a *= 1.0 / (1.0 + std::exp(-z[k] / c.temperatures[k]));
    EXPECT_NEAR(s[k], a, 1e-5);
  }
  auto txt = debug(d + "/target", tmp + "/draft", ids_arg(g.at("prompt")), {});
  EXPECT_NE(txt.out.find("calibration: " + tmp + "/draft/calibration.json (sts"), std::string::npos) << txt.out;
  // A stale calibration (the checkpoint changed) is reported, not used.
  {
    json cfg = json::parse(dsinfer::read_text_file(tmp + "/draft/config.json"));
    cfg["note"] = "edited";
    std::ofstream(tmp + "/draft/config.json") << cfg.dump(2);
  }
  r = debug(d + "/target", tmp + "/draft", ids_arg(g.at("prompt")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(r.out);
  EXPECT_FALSE(j.contains("calibrated_survival"));
  EXPECT_NE(j.value("calibration_error", "").find("drafter_fingerprint"), std::string::npos) << r.out;
  fs::remove_all(tmp);
}

TEST(DebugDflash, Refusals) {
  if (!have("dspark_vanilla")) GTEST_SKIP() << "no golden case dspark_vanilla";
  const std::string d = kDir + "/dspark_vanilla";
  auto r = debug(d + "/target", d + "/draft", "1,2,256");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--prompt-ids: '256' is not a token id in [0, 256)"), std::string::npos) << r.err;
  r = debug(d + "/target", d + "/draft", "1,,2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--prompt-ids"), std::string::npos) << r.err;
  r = run_dsinfer({"debug-dflash", "--model-path", d + "/target", "--draft-model-path", d + "/draft"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--prompt-ids"), std::string::npos) << r.err;
}

}  // namespace
