// dsinfer speculation floor: full-block calibration rounds, prompt file, split, fit and
// report for `dsinfer calibrate` (see calibration_runner.h for the data flow).
#include "spec/calibration_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"
#include "model/model.h"
#include "spec/drafter.h"
#include "spec/verify.h"

namespace dsinfer {

std::vector<std::vector<int32_t>> read_calibration_prompts(
    const std::string& path, int vocab, const std::function<std::vector<int32_t>(const std::string&)>& encode) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("--prompts " + path + ": cannot open");
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    const nlohmann::json j = parse_json(line, where);
    if (!j.is_object()) throw Error(where + ": each line must be a JSON object with \"prompt\" or \"prompt_ids\"");
    const bool has_text = j.contains("prompt"), has_ids = j.contains("prompt_ids");
    if (has_text == has_ids) throw Error(where + ": give exactly one of \"prompt\" or \"prompt_ids\"");
    std::vector<int32_t> ids;
    if (has_ids) {
      const auto& a = j["prompt_ids"];
      if (!a.is_array()) throw Error(where + ": field 'prompt_ids': must be an array of token ids");
      for (const auto& e : a) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab)
          throw Error(where + ": field 'prompt_ids': " + e.dump() + " is not a token id in [0, " + std::to_string(vocab) +
                      ")");
        ids.push_back(e.get<int32_t>());
      }
    } else {
      if (!j["prompt"].is_string()) throw Error(where + ": field 'prompt': must be a string");
      if (!encode) throw Error(where + ": field 'prompt': text prompts need the target's tokenizer.json (use \"prompt_ids\")");
      ids = encode(j["prompt"].get<std::string>());
    }
    if (ids.empty()) throw Error(where + ": the prompt has no tokens");
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) throw Error("--prompts " + path + ": no prompts");
  return prompts;
}

int collect_calibration_rounds(Model& target, const Drafter& drafter, const std::vector<int32_t>& prompt,
                               const CalibrationRunOptions& opts, int max_rounds, Rng& rng,
                               std::vector<CalibrationRound>& out) {
  const DrafterInfo& info = drafter.info();
  if (!info.confidence_head) throw Error("calibrate: drafter kind '" + info.kind + "' has no confidence head");
  if (prompt.empty()) throw Error("calibrate: empty prompt");
  const int gamma = opts.drafts < 0 ? info.max_draft_tokens : std::min(opts.drafts, info.max_draft_tokens);
  if (gamma < 1) throw Error("calibrate: the block holds no drafts");
  if (max_rounds <= 0 || opts.max_new_tokens <= 0) return 0;
  const int V = target.config().vocab_size;
  const int P = static_cast<int>(prompt.size());
  auto kv = target.make_kv_cache(1, P + opts.max_new_tokens + gamma + 2);
  auto is_stop = [&](int32_t t) { return std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end(); };

  // Prefill; the first token comes from the verification rule with no drafts.
  ForwardBatch batch;
  batch.capture_layers = info.target_layer_ids;
  batch.entries.push_back({0, prompt, {P - 1}});
  ForwardOutput fo;
  target.forward(*kv, batch, fo);
  int32_t anchor = verify_drafts(fo.logits.data(), V, {}, {}, opts.sampling, rng).next_token;
  auto seq = drafter.start();
  const bool feats = !info.target_layer_ids.empty();
  drafter.commit_context(*seq, prompt.data(), feats ? fo.captured.data() : nullptr, P);
  int generated = 1, rounds = 0;
  if (is_stop(anchor)) return 0;

  while (generated < opts.max_new_tokens && rounds < max_rounds) {
    const int start = kv->length(0);
    DraftProposal p = drafter.propose(*seq, anchor, gamma, opts.sampling, rng);
    const int n = static_cast<int>(p.tokens.size());
    if (n != gamma || p.confidence_logits.size() != p.tokens.size())
      throw Error("calibrate: drafter proposed " + std::to_string(n) + " drafts with " +
                  std::to_string(p.confidence_logits.size()) + " confidence logits, expected " + std::to_string(gamma));
    ForwardBatch vb;
    vb.capture_layers = info.target_layer_ids;
    ForwardEntry e{0, {anchor}, {}};
    e.tokens.insert(e.tokens.end(), p.tokens.begin(), p.tokens.end());
    for (int i = 0; i <= n; ++i) e.logit_rows.push_back(i);
    vb.entries.push_back(std::move(e));
    target.forward(*kv, vb, fo);
    const VerifyResult v = verify_drafts(fo.logits.data(), V, p.tokens, p.q, opts.sampling, rng);
    ++rounds;

    // A stop id among the accepted drafts ends the sequence there; like the reference
    // recorder, only the positions up to it are recorded.
    int stop_at = -1;
    for (int i = 0; i < v.accepted; ++i)
      if (is_stop(p.tokens[i])) {
        stop_at = i;
        break;
      }
    CalibrationRound r;
    if (stop_at >= 0) {
      r.logits.assign(p.confidence_logits.begin(), p.confidence_logits.begin() + stop_at + 1);
      r.accepted = stop_at + 1;
      out.push_back(std::move(r));
      break;
    }
    r.logits = p.confidence_logits;
    r.accepted = v.accepted;
    out.push_back(std::move(r));

    kv->truncate(0, start + v.accepted + 1);
    std::vector<int32_t> committed = {anchor};
    committed.insert(committed.end(), p.tokens.begin(), p.tokens.begin() + v.accepted);
    drafter.commit_context(*seq, committed.data(), feats ? fo.captured.data() : nullptr, v.accepted + 1);
    generated += v.accepted + 1;
    anchor = v.next_token;
    if (is_stop(anchor)) break;
  }
  return rounds;
}

void fit_calibration_report(CalibrationReport& rep, const StsOptions& sts) {
  const int g = rep.gamma;
  const std::vector<double> ones(g, 1.0);
  const std::vector<double> T = fit_sts(rep.fit_rounds, g, sts);
  rep.fit_before = position_metrics(rep.fit_rounds, ones, g);
  rep.fit_after = position_metrics(rep.fit_rounds, T, g);
  rep.heldout_before.clear();
  rep.heldout_after.clear();
  if (!rep.heldout_rounds.empty()) {
    rep.heldout_before = position_metrics(rep.heldout_rounds, ones, g);
    rep.heldout_after = position_metrics(rep.heldout_rounds, T, g);
  }
  Calibration& c = rep.calibration;
  c.temperatures = T;
  c.rounds = static_cast<int64_t>(rep.fit_rounds.size());
  const double nan = std::nan("");
  auto col = [&](const std::vector<PositionMetrics>& m, double PositionMetrics::*f) {
    std::vector<double> v;
    for (const auto& x : m) v.push_back(x.count > 0 ? x.*f : nan);
    return v;
  };
  c.ece_before = col(rep.fit_before, &PositionMetrics::ece);
  c.ece_after = col(rep.fit_after, &PositionMetrics::ece);
  c.auroc = col(rep.fit_after, &PositionMetrics::auroc);
  c.auroc_before = col(rep.fit_before, &PositionMetrics::auroc);
  c.heldout_rounds = static_cast<int64_t>(rep.heldout_rounds.size());
  if (c.heldout_rounds > 0) {
    c.heldout_ece_before = col(rep.heldout_before, &PositionMetrics::ece);
    c.heldout_ece_after = col(rep.heldout_after, &PositionMetrics::ece);
    c.heldout_auroc = col(rep.heldout_after, &PositionMetrics::auroc);
  }
}

CalibrationReport run_calibration(Model& target, const Drafter& drafter, const std::string& draft_dir,
                                  const std::vector<std::vector<int32_t>>& prompts, const CalibrationRunOptions& opts,
                                  const std::function<void(int, int, int)>& progress) {
  const DrafterInfo& info = drafter.info();
  if (!info.confidence_head)
    throw Error("calibrate: " + draft_dir + ": drafter kind '" + info.kind +
                "' has no confidence head (calibration needs a DSpark checkpoint with enable_confidence_head)");
  if (prompts.empty()) throw Error("calibrate: no prompts");
  if (opts.max_rounds < 1) throw Error("--max-rounds: must be >= 1");
  validate_sampling_params(opts.sampling);
  CalibrationReport rep;
  rep.gamma = opts.drafts < 0 ? info.max_draft_tokens : std::min(opts.drafts, info.max_draft_tokens);
  if (rep.gamma < 1) throw Error("--block-size: the block holds no drafts (calibration needs at least one)");
  const int np = static_cast<int>(prompts.size());
  const bool split = np >= 10;
  const int64_t share = (opts.max_rounds + np - 1) / np;
  Rng rng(opts.sampling.seed);
  int64_t total = 0;
  for (int i = 0; i < np && total < opts.max_rounds; ++i) {
    const bool held = split && i % 5 == 4;
    (held ? rep.heldout_prompts : rep.fit_prompts)++;
    const int cap = static_cast<int>(std::min<int64_t>(share, opts.max_rounds - total));
    const int got = collect_calibration_rounds(target, drafter, prompts[i], opts, cap, rng,
                                               held ? rep.heldout_rounds : rep.fit_rounds);
    total += got;
    if (progress) progress(i, np, got);
  }
  if (rep.fit_rounds.empty()) throw Error("calibrate: no rounds collected on the fit prompts (prompts end at once?)");
  Calibration& c = rep.calibration;
  c.block_size = opts.block_size > 0 ? opts.block_size : info.block_size;
  c.sampling_temperature = opts.sampling.temperature;
  c.drafter_fingerprint = drafter_fingerprint(draft_dir);
  fit_calibration_report(rep, opts.sts);
  return rep;
}

namespace {

std::string fmt(double v, int prec = 4) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// Count-weighted mean of a metric over positions (NaN entries skipped).
double weighted(const std::vector<PositionMetrics>& m, double PositionMetrics::*f) {
  double s = 0.0, n = 0.0;
  for (const auto& x : m)
    if (x.count > 0 && std::isfinite(x.*f)) {
      s += x.*f * static_cast<double>(x.count);
      n += static_cast<double>(x.count);
    }
  return n > 0 ? s / n : std::nan("");
}

void table(std::string& out, const std::vector<PositionMetrics>& before, const std::vector<PositionMetrics>& after,
           const std::vector<double>* T) {
  char line[256];
  std::snprintf(line, sizeof line, "  %4s %7s %7s %8s %9s %9s %8s %8s %9s %9s\n", "k", "n", "accept", "T_k", "pred_raw",
                "pred_sts", "ECE_raw", "ECE_sts", "AUROC_raw", "AUROC_sts");
  out += line;
  for (size_t k = 0; k < before.size(); ++k) {
    const auto &b = before[k], &a = after[k];
    std::snprintf(line, sizeof line, "  %4zu %7lld %7s %8s %9s %9s %8s %8s %9s %9s\n", k + 1,
                  static_cast<long long>(b.count), fmt(b.mean_label).c_str(), T ? fmt((*T)[k], 3).c_str() : "",
                  fmt(b.mean_pred).c_str(), fmt(a.mean_pred).c_str(), fmt(b.ece).c_str(), fmt(a.ece).c_str(),
                  fmt(b.auroc).c_str(), fmt(a.auroc).c_str());
    out += line;
  }
  int64_t n = 0;
  for (const auto& b : before) n += b.count;
  std::snprintf(line, sizeof line, "  %4s %7lld %7s %8s %9s %9s %8s %8s %9s %9s\n", "all", static_cast<long long>(n),
                fmt(weighted(before, &PositionMetrics::mean_label)).c_str(), "",
                fmt(weighted(before, &PositionMetrics::mean_pred)).c_str(),
                fmt(weighted(after, &PositionMetrics::mean_pred)).c_str(),
                fmt(weighted(before, &PositionMetrics::ece)).c_str(), fmt(weighted(after, &PositionMetrics::ece)).c_str(),
                fmt(weighted(before, &PositionMetrics::auroc)).c_str(),
                fmt(weighted(after, &PositionMetrics::auroc)).c_str());
  out += line;
}

}  // namespace

std::string format_calibration_table(const CalibrationReport& rep) {
  const Calibration& c = rep.calibration;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "STS calibration: gamma %d drafts (block size %d), sampling temperature %g\n"
                "fit: %zu rounds from %d prompts\n",
                rep.gamma, c.block_size, c.sampling_temperature, rep.fit_rounds.size(), rep.fit_prompts);
  out += line;
  table(out, rep.fit_before, rep.fit_after, &c.temperatures);
  if (!rep.heldout_rounds.empty()) {
    std::snprintf(line, sizeof line, "held-out: %zu rounds from %d prompts (same temperatures)\n",
                  rep.heldout_rounds.size(), rep.heldout_prompts);
    out += line;
    table(out, rep.heldout_before, rep.heldout_after, nullptr);
  }
  out +=
      "(accept = fraction of rounds with drafts 1..k all accepted; pred = mean prefix survival a_k; ECE: 20 bins; "
      "'all' = count-weighted mean over positions)\n";
  return out;
}

}  // namespace dsinfer
