// Tests of the confidence-head calibration (src/spec/calibration.*, calibration_runner.*):
// ECE / exact AUROC / Brier against hand-computed cases and known distributions, Sequential
// Temperature Scaling recovering known temperatures from synthetic Bernoulli data, the
// calibration.json round trip and its strict validation, the drafter fingerprint, the
// static threshold rule (non-anticipation) and the prompts-file reader. With the committed
// drafter goldens present (tests/data/drafters/dspark_vanilla, or DSINFER_DRAFTER_GOLDENS),
// the round runner is replayed against the recorded greedy rounds.
//
// Data flow of the synthetic tests: seeded generator (own Box–Muller on mt19937 words, so
// streams are identical everywhere) → logits z and Bernoulli labels with a known true
// probability → the functions under test → compared with the known truth.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/model.h"
#include "model_test_util.h"
#include "spec/calibration.h"
#include "spec/calibration_runner.h"
#include "spec/drafter_loader.h"

using namespace dsinfer;
using dsinfer::test::TempDir;
using dsinfer::test::write_text;

namespace {

// Deterministic uniform / normal draws (std:: distributions differ between libraries).
struct Gen {
  std::mt19937_64 g;
  explicit Gen(uint64_t seed) : g(seed) {}
  double uniform() { return static_cast<double>(g() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    double u = uniform(), v = uniform();
    if (u < 1e-300) u = 1e-300;
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  bool bernoulli(double p) { return uniform() < p; }
};

double sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double brute_auroc(const std::vector<double>& p, const std::vector<uint8_t>& y) {
  double w = 0, n = 0;
  for (size_t i = 0; i < p.size(); ++i)
    for (size_t j = 0; j < p.size(); ++j)
      if (y[i] && !y[j]) {
        n += 1;
        w += p[i] > p[j] ? 1.0 : p[i] == p[j] ? 0.5 : 0.0;
      }
  return w / n;
}

TEST(SpecCalibration, EceHandComputed) {
  // Bin 2 (p = 0.1): mean label 0.5 → |0.1 − 0.5| · 2/4; bin 18 (p = 0.9): |0.9 − 1| · 2/4.
  EXPECT_NEAR(expected_calibration_error({0.1, 0.1, 0.9, 0.9}, {0, 1, 1, 1}), 0.2 + 0.05, 1e-12);
  // One bin mixing two predictions: bin 10 holds 0.51 and 0.54 (mean 0.525), labels 1, 0 → |0.525 − 0.5|.
  EXPECT_NEAR(expected_calibration_error({0.51, 0.54}, {1, 0}), 0.025, 1e-12);
  // Two bins: 0.52 → bin 10 (label 1), 0.58 → bin 11 (label 0): (|0.52 − 1| + |0.58 − 0|) / 2.
  EXPECT_NEAR(expected_calibration_error({0.52, 0.58}, {1, 0}), 0.53, 1e-12);
  // Clamping: p = 1 falls in bin 19 (not a 21st bin); p = 0 → 1e-8 in bin 0.
  EXPECT_NEAR(expected_calibration_error({1.0, 0.0}, {1, 0}), 0.5 * 1e-8 + 0.5 * 1e-8, 1e-15);
  EXPECT_EQ(expected_calibration_error({}, {}), 0.0);
  EXPECT_THROW(expected_calibration_error({0.5}, {}), Error);
}

TEST(SpecCalibration, PerfectlyCalibratedHasTinyEce) {
  Gen g(1);
  std::vector<double> p;
  std::vector<uint8_t> y;
  for (int i = 0; i < 200000; ++i) {
    p.push_back(g.uniform());
    y.push_back(g.bernoulli(p.back()));
  }
  EXPECT_LT(expected_calibration_error(p, y), 0.005);
  // Overconfident by construction: true probability p², predicted p → ECE ≈ E[p − p²] = 1/6.
  std::vector<uint8_t> y2;
  for (double x : p) y2.push_back(g.bernoulli(x * x));
  EXPECT_NEAR(expected_calibration_error(p, y2), 1.0 / 6.0, 0.01);
  const PositionMetrics m = compute_metrics(p, y);
  EXPECT_NEAR(m.mean_pred, 0.5, 0.005);
  EXPECT_NEAR(m.mean_label, 0.5, 0.005);
  EXPECT_NEAR(m.brier, 1.0 / 6.0, 0.005);  // E[p(1−p)] for a calibrated uniform p
  EXPECT_EQ(m.count, 200000);
}

TEST(SpecCalibration, AurocHandComputedAndTies) {
  EXPECT_NEAR(auroc_exact({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75, 1e-12);
  EXPECT_NEAR(auroc_exact({0.5, 0.5}, {1, 0}), 0.5, 1e-12);
  EXPECT_NEAR(auroc_exact({0.2, 0.5, 0.5, 0.9}, {0, 1, 0, 1}), 3.5 / 4.0, 1e-12);
  EXPECT_NEAR(auroc_exact({0.1, 0.2, 0.3, 0.7, 0.8}, {0, 0, 0, 1, 1}), 1.0, 1e-12);  // separable
  EXPECT_NEAR(auroc_exact({0.9, 0.8, 0.1}, {0, 0, 1}), 0.0, 1e-12);
  EXPECT_TRUE(std::isnan(auroc_exact({0.1, 0.2}, {1, 1})));
  EXPECT_TRUE(std::isnan(auroc_exact({}, {})));
}

TEST(SpecCalibration, AurocMatchesBruteForceAndIsMonotoneInvariant) {
  Gen g(2);
  std::vector<double> p, q;
  std::vector<uint8_t> y;
  for (int i = 0; i < 600; ++i) {
    const double x = std::round(g.uniform() * 40) / 40;  // many ties
    p.push_back(x);
    y.push_back(g.bernoulli(0.2 + 0.6 * x));
    q.push_back(sig(3.0 * std::log(std::max(x, 1e-6) / std::max(1 - x, 1e-6)) / 0.7) * 0.5);  // strictly monotone
  }
  const double a = auroc_exact(p, y);
  EXPECT_NEAR(a, brute_auroc(p, y), 1e-12);
  EXPECT_GT(a, 0.6);
  EXPECT_NEAR(auroc_exact(q, y), a, 1e-12);
}

TEST(SpecCalibration, CumulativeSurvivalAndCalibratedSurvival) {
  const std::vector<float> z = {1.0f, -0.5f, 2.0f};
  const auto a = cumulative_survival(z, {2.0});  // T_2, T_3 default to 1
  ASSERT_EQ(a.size(), 3u);
  EXPECT_NEAR(a[0], sig(0.5), 1e-12);
  EXPECT_NEAR(a[1], sig(0.5) * sig(-0.5), 1e-12);
  EXPECT_NEAR(a[2], sig(0.5) * sig(-0.5) * sig(2.0), 1e-12);
  Calibration c;
  c.temperatures = {2.0, 0.5, 1.0};
  const auto s = calibrated_survival(c, z);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_NEAR(s[0], sig(0.5), 1e-6);
  EXPECT_NEAR(s[1], sig(0.5) * sig(-1.0), 1e-6);
  EXPECT_NEAR(s[2], sig(0.5) * sig(-1.0) * sig(2.0), 1e-6);
  for (size_t k = 1; k < s.size(); ++k) EXPECT_LE(s[k], s[k - 1]);  // survival never increases
  EXPECT_TRUE(calibrated_survival(c, {}).empty());
  EXPECT_NEAR(sigmoid_d(-800.0), 0.0, 1e-300);
  EXPECT_NEAR(sigmoid_d(800.0), 1.0, 1e-15);
}

TEST(SpecCalibration, PositionMetricsUsesPrefixLabelsAndProposalLength) {
  // Round A proposed 3 and accepted 1; round B proposed 1 and accepted 1; round C proposed 2, accepted 2.
  std::vector<CalibrationRound> rounds = {{{0.f, 0.f, 0.f}, 1}, {{0.f}, 1}, {{0.f, 0.f}, 2}};
  const auto m = position_metrics(rounds, {}, 4);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].count, 3);
  EXPECT_EQ(m[1].count, 2);
  EXPECT_EQ(m[2].count, 1);
  EXPECT_EQ(m[3].count, 0);
  EXPECT_NEAR(m[0].mean_label, 1.0, 1e-12);
  EXPECT_NEAR(m[1].mean_label, 0.5, 1e-12);  // A: 0, C: 1
  EXPECT_NEAR(m[2].mean_label, 0.0, 1e-12);
  EXPECT_NEAR(m[1].mean_pred, 0.25, 1e-12);
  EXPECT_NEAR(m[2].mean_pred, 0.125, 1e-12);
  EXPECT_NEAR(m[1].ece, 0.25, 1e-12);  // one bin: |0.25 − 0.5|
  EXPECT_TRUE(std::isnan(m[3].auroc));
}

TEST(SpecCalibration, StsGrid) {
  const auto g = sts_grid();
  ASSERT_EQ(g.size(), 101u);
  EXPECT_NEAR(g.front(), 0.25, 1e-12);
  EXPECT_NEAR(g.back(), 4.0, 1e-12);
  EXPECT_EQ(g[50], 1.0);
  for (size_t i = 1; i < g.size(); ++i) EXPECT_NEAR(g[i] / g[i - 1], std::pow(16.0, 0.01), 1e-9);
}

// Rounds of `gamma` drafts: z_k ~ N(0, 3²); draft k survives (given the earlier ones did)
// with probability σ(z_k / T*_k).
std::vector<CalibrationRound> synthetic(const std::vector<double>& Tstar, int rounds, uint64_t seed) {
  Gen g(seed);
  std::vector<CalibrationRound> out;
  for (int r = 0; r < rounds; ++r) {
    CalibrationRound cr;
    bool alive = true;
    for (double T : Tstar) {
      const double z = 3.0 * g.normal();
      cr.logits.push_back(static_cast<float>(z));
      const bool ok = g.bernoulli(sig(static_cast<float>(z) / T));
      if (alive && ok) cr.accepted++;
      else alive = false;
    }
    out.push_back(cr);
  }
  return out;
}

TEST(SpecCalibration, StsRecoversKnownTemperature) {
  const double step = std::log(16.0) / 100.0;
  const auto rounds = synthetic({2.0}, 100000, 3);
  const auto T = fit_sts(rounds, 1);
  ASSERT_EQ(T.size(), 1u);
  EXPECT_LE(std::abs(std::log(T[0] / 2.0)), 2 * step) << "fitted T_1 = " << T[0];
  const auto before = position_metrics(rounds, {1.0}, 1), after = position_metrics(rounds, T, 1);
  EXPECT_GT(before[0].ece, 0.05);  // raw logits are overconfident (T* = 2)
  EXPECT_LT(after[0].ece, 0.01);
  EXPECT_NEAR(after[0].auroc, before[0].auroc, 1e-12);  // one position: pure monotone rescale
}

TEST(SpecCalibration, StsSequentialRecoversEachPosition) {
  const double step = std::log(16.0) / 100.0;
  const auto rounds = synthetic({2.0, 0.5, 1.0}, 150000, 4);
  const auto T = fit_sts(rounds, 3);
  ASSERT_EQ(T.size(), 3u);
  EXPECT_LE(std::abs(std::log(T[0] / 2.0)), 2 * step) << T[0];
  EXPECT_LE(std::abs(std::log(T[1] / 0.5)), 3 * step) << T[1];
  EXPECT_LE(std::abs(std::log(T[2] / 1.0)), 4 * step) << T[2];
  const auto after = position_metrics(rounds, T, 3);
  for (const auto& m : after) EXPECT_LT(m.ece, 0.01);
}

TEST(SpecCalibration, StsNoDataKeepsOneAndTiesPreferOne) {
  // Every z = 0: σ(0/T) = 0.5 for every T, so all grid points tie → T = 1. Position 3 has no data.
  std::vector<CalibrationRound> rounds;
  for (int i = 0; i < 50; ++i) rounds.push_back({{0.f, 0.f}, i % 3});
  const auto T = fit_sts(rounds, 3);
  EXPECT_EQ(T, (std::vector<double>{1.0, 1.0, 1.0}));
  EXPECT_EQ(fit_sts({}, 2), (std::vector<double>{1.0, 1.0}));
}

TEST(SpecCalibration, StaticThresholdLength) {
  const std::vector<float> s = {0.9f, 0.7f, 0.5f, 0.3f};
  EXPECT_EQ(static_threshold_length(s, 0.6f, -1), 2);
  EXPECT_EQ(static_threshold_length(s, 0.95f, -1), 0);
  EXPECT_EQ(static_threshold_length(s, 0.1f, -1), 4);
  EXPECT_EQ(static_threshold_length(s, 0.1f, 3), 3);
  EXPECT_EQ(static_threshold_length(s, 0.0f, -1), 4);
  EXPECT_EQ(static_threshold_length(s, -1.0f, 2), 2);
  EXPECT_EQ(static_threshold_length(s, 0.5f, -1), 3);  // 0.5 is not below 0.5
  EXPECT_EQ(static_threshold_length({0.9f, NAN, 0.9f}, 0.5f, -1), 1);
  EXPECT_EQ(static_threshold_length({}, 0.5f, 4), 0);
}

TEST(SpecCalibration, StaticThresholdIsNonAnticipating) {
  // Whether draft k is kept depends only on â_1..â_k: for random survival sequences,
  // (length > k) ⇔ all of survival[0..k] ≥ τ, and rewriting anything after the cut
  // (positions > length) never changes the length.
  Gen g(5);
  for (int it = 0; it < 2000; ++it) {
    const int n = 1 + static_cast<int>(g.uniform() * 8);
    std::vector<float> s;
    float a = 1.0f;
    for (int k = 0; k < n; ++k) s.push_back(a *= static_cast<float>(0.5 + 0.5 * g.uniform()));
    const float tau = static_cast<float>(g.uniform());
    const int len = static_threshold_length(s, tau, -1);
    for (int k = 0; k < n; ++k) {
      bool prefix_ok = true;
      for (int i = 0; i <= k; ++i) prefix_ok = prefix_ok && s[i] >= tau;
      EXPECT_EQ(len > k, prefix_ok);
    }
    std::vector<float> t = s;
    for (int k = len + 1; k < n; ++k) t[k] = static_cast<float>(g.uniform());
    EXPECT_EQ(static_threshold_length(t, tau, -1), len);
    // Truncating the input at any point past the cut gives the same answer too.
    for (int m = len + 1; m <= n; ++m)
      EXPECT_EQ(static_threshold_length(std::vector<float>(s.begin(), s.begin() + m), tau, -1), len);
  }
}

Calibration sample_calibration() {
  Calibration c;
  c.temperatures = {1.5, 0.75};
  c.block_size = 6;
  c.sampling_temperature = 0.0;
  c.rounds = 42;
  c.ece_before = {0.08, NAN};
  c.ece_after = {0.01, NAN};
  c.auroc = {0.85, NAN};
  c.auroc_before = {0.85, NAN};
  c.heldout_rounds = 7;
  c.heldout_ece_before = {0.1, 0.2};
  c.heldout_ece_after = {0.02, 0.03};
  c.heldout_auroc = {0.8, 0.9};
  c.drafter_fingerprint = "sha256:00";
  return c;
}

TEST(SpecCalibration, JsonRoundTrip) {
  const Calibration c = sample_calibration();
  const std::string text = calibration_to_json(c);
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["method"], "sts");
  EXPECT_TRUE(j["ece_before"][1].is_null());
  const Calibration d = parse_calibration(text, "x/calibration.json");
  EXPECT_EQ(d.temperatures, c.temperatures);
  EXPECT_EQ(d.block_size, 6);
  EXPECT_EQ(d.rounds, 42);
  EXPECT_EQ(d.heldout_rounds, 7);
  EXPECT_NEAR(d.ece_before[0], 0.08, 1e-15);
  EXPECT_TRUE(std::isnan(d.ece_after[1]));
  EXPECT_EQ(d.heldout_auroc, c.heldout_auroc);
  EXPECT_EQ(d.drafter_fingerprint, "sha256:00");
}

std::string parse_error(const nlohmann::json& j) {
  try {
    parse_calibration(j.dump(), "D/calibration.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpecCalibration, JsonStrictValidation) {
  const auto good = nlohmann::json::parse(calibration_to_json(sample_calibration()));
  auto with = [&](const std::string& k, const nlohmann::json& v) {
    auto j = good;
    j[k] = v;
    return parse_error(j);
  };
  auto without = [&](const std::string& k) {
    auto j = good;
    j.erase(k);
    return parse_error(j);
  };
  EXPECT_EQ(parse_error(good), "");
  for (const char* k : {"version", "method", "temperatures", "block_size", "sampling_temperature", "rounds", "ece_before",
                        "ece_after", "auroc", "drafter_fingerprint"}) {
    const std::string e = without(k);
    EXPECT_NE(e.find("D/calibration.json: field '" + std::string(k) + "': missing"), std::string::npos) << e;
  }
  EXPECT_NE(with("version", 2).find("field 'version'"), std::string::npos);
  EXPECT_NE(with("method", "platt").find("field 'method'"), std::string::npos);
  EXPECT_NE(with("temperatures", nlohmann::json::array()).find("field 'temperatures'"), std::string::npos);
  EXPECT_NE(with("temperatures", {1.0, -2.0}).find("field 'temperatures[1]'"), std::string::npos);
  EXPECT_NE(with("temperatures", {1.0, "x"}).find("field 'temperatures[1]'"), std::string::npos);
  EXPECT_NE(with("ece_after", {0.1}).find("field 'ece_after': has 1 entries, expected 2"), std::string::npos);
  EXPECT_NE(with("auroc", {0.1, 7}).find("field 'auroc[1]'"), std::string::npos);
  EXPECT_NE(with("block_size", 0).find("field 'block_size'"), std::string::npos);
  EXPECT_NE(with("block_size", 2.5).find("field 'block_size'"), std::string::npos);
  EXPECT_NE(with("sampling_temperature", -1).find("field 'sampling_temperature'"), std::string::npos);
  EXPECT_NE(with("drafter_fingerprint", "").find("field 'drafter_fingerprint'"), std::string::npos);
  EXPECT_NE(with("heldout_ece_after", {0.1}).find("field 'heldout_ece_after'"), std::string::npos);
  try {
    parse_calibration("{not json", "D/calibration.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("D/calibration.json: invalid JSON"), std::string::npos);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

TEST(SpecCalibration, FingerprintIsSha256OfConfigAndWeightSizes) {
  TempDir d;
  write_text(d.file("config.json"),
             "{\"architectures\": [\"Qwen3DSparkModel\"], \"comment\": \"a config longer than one sha-256 block of "
             "sixty-four bytes\"}");
  write_text(d.file("model.safetensors"), "abc");
  write_text(d.file("notes.txt"), "ignored");
  // Expected value computed independently (Python hashlib) from the documented input.
  EXPECT_EQ(drafter_fingerprint(d.path), "sha256:df2b7b73d2e31f5070c2f9dc973465e89ae2ac0670b5943d05d2a4137c90a963");
  write_text(d.file("model.safetensors"), "abcd");
  EXPECT_NE(drafter_fingerprint(d.path), "sha256:df2b7b73d2e31f5070c2f9dc973465e89ae2ac0670b5943d05d2a4137c90a963");
}

TEST(SpecCalibration, LoadCalibrationBesideDrafter) {
  TempDir d;
  write_text(d.file("config.json"), "{}");
  write_text(d.file("model.safetensors"), "xyz");
  EXPECT_FALSE(load_calibration(d.path).has_value());
  Calibration c = sample_calibration();
  c.drafter_fingerprint = drafter_fingerprint(d.path);
  write_calibration(calibration_path(d.path), c);
  auto got = load_calibration(d.path);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->temperatures, c.temperatures);
  write_text(d.file("config.json"), "{ }");  // checkpoint changed → stale calibration refused
  try {
    load_calibration(d.path);
    ADD_FAILURE() << "stale calibration accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calibration.json: field 'drafter_fingerprint'"), std::string::npos) << e.what();
  }
}

TEST(SpecCalibration, FitReportAndTable) {
  CalibrationReport rep;
  rep.gamma = 3;
  rep.fit_rounds = synthetic({2.0, 2.0, 2.0}, 4000, 6);
  rep.heldout_rounds = synthetic({2.0, 2.0, 2.0}, 1000, 7);
  rep.fit_prompts = 8;
  rep.heldout_prompts = 2;
  rep.calibration.block_size = 3;
  rep.calibration.drafter_fingerprint = "sha256:x";
  fit_calibration_report(rep, {});
  const Calibration& c = rep.calibration;
  ASSERT_EQ(c.temperatures.size(), 3u);
  EXPECT_EQ(c.rounds, 4000);
  EXPECT_EQ(c.heldout_rounds, 1000);
  EXPECT_LT(c.ece_after[0], c.ece_before[0]);
  EXPECT_LT(c.heldout_ece_after[0], c.heldout_ece_before[0]);
  const std::string t = format_calibration_table(rep);
  EXPECT_NE(t.find("fit: 4000 rounds from 8 prompts"), std::string::npos) << t;
  EXPECT_NE(t.find("held-out: 1000 rounds from 2 prompts"), std::string::npos) << t;
  EXPECT_NE(t.find("ECE_sts"), std::string::npos);
  // Round trip through the JSON form.
  const Calibration d = parse_calibration(calibration_to_json(c), "c.json");
  EXPECT_EQ(d.temperatures, c.temperatures);
}

TEST(SpecCalibration, PromptsFile) {
  TempDir d;
  write_text(d.file("p.jsonl"), "{\"prompt_ids\": [1, 2, 3]}\n\n{\"prompt\": \"ab\"}\n");
  auto enc = [](const std::string& s) {
    std::vector<int32_t> v;
    for (char c : s) v.push_back(static_cast<unsigned char>(c) % 50);
    return v;
  };
  const auto p = read_calibration_prompts(d.file("p.jsonl"), 50, enc);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p[1], enc("ab"));
  auto err = [&](const std::string& text, bool with_enc = true) -> std::string {
    write_text(d.file("q.jsonl"), text);
    try {
      read_calibration_prompts(d.file("q.jsonl"), 50, with_enc ? std::function<std::vector<int32_t>(const std::string&)>(enc)
                                                               : nullptr);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err("{\"prompt_ids\": [1]}\n{bad\n").find("q.jsonl:2: invalid JSON"), std::string::npos);
  EXPECT_NE(err("{\"prompt_ids\": [1, 50]}\n").find("q.jsonl:1: field 'prompt_ids'"), std::string::npos);
  EXPECT_NE(err("{\"prompt_ids\": []}\n").find("q.jsonl:1: the prompt has no tokens"), std::string::npos);
  EXPECT_NE(err("{\"x\": 1}\n").find("q.jsonl:1: give exactly one"), std::string::npos);
  EXPECT_NE(err("{\"prompt\": \"hi\"}\n", false).find("q.jsonl:1: field 'prompt': text prompts need"), std::string::npos);
  EXPECT_NE(err("\n\n").find("no prompts"), std::string::npos);
}

// ---- replay against the PyTorch drafter goldens (skipped when absent) ----------------------

const std::string kGoldens = std::getenv("DSINFER_DRAFTER_GOLDENS") ? std::getenv("DSINFER_DRAFTER_GOLDENS")
                                                                      : std::string(DSINFER_TEST_DATA) + "/drafters";

TEST(SpecCalibrationGolden, RunnerReplaysGreedyRounds) {
  for (const char* name : {"dspark_vanilla", "dspark_gated", "dspark_rnn"}) {
    const std::string dir = kGoldens + "/" + name;
    if (!std::filesystem::exists(dir + "/golden.json")) continue;
    SCOPED_TRACE(name);
    const auto g = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
    auto target = load_model(dir + "/target");
    auto drafter = load_drafter(dir + "/draft", *target, {});
    const auto prompt = g.at("prompt").get<std::vector<int32_t>>();
    const auto& R = g.at("rounds");
    CalibrationRunOptions o;
    o.max_new_tokens = 24;
    Rng rng(0);
    std::vector<CalibrationRound> rounds;
    const int n = collect_calibration_rounds(*target, *drafter, prompt, o, 1000, rng, rounds);
    ASSERT_EQ(n, static_cast<int>(rounds.size()));
    ASSERT_GE(n, 1);
    for (int i = 0; i < n && i < static_cast<int>(R.size()); ++i) {
      EXPECT_EQ(rounds[i].accepted, R[i].at("accepted").get<int>()) << "round " << i;
      const auto conf = R[i].at("confidence").get<std::vector<double>>();
      ASSERT_EQ(rounds[i].logits.size(), conf.size());
      for (size_t k = 0; k < conf.size(); ++k) EXPECT_NEAR(sig(rounds[i].logits[k]), conf[k], 1e-4) << "round " << i;
    }
    return;
  }
  GTEST_SKIP() << "no DSpark drafter golden under " << kGoldens << " (produced by the PyTorch reference; not present yet)";
}

TEST(SpecCalibrationGolden, RunnerRefusesDrafterWithoutConfidenceHead) {
  const std::string dir = kGoldens + "/deepspec_dflash";
  if (!std::filesystem::exists(dir + "/golden.json")) GTEST_SKIP() << "no golden case " << dir;
  auto target = load_model(dir + "/target");
  auto drafter = load_drafter(dir + "/draft", *target, {});
  try {
    run_calibration(*target, *drafter, dir + "/draft", {{1, 2, 3}}, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no confidence head"), std::string::npos) << e.what();
  }
}

}  // namespace
