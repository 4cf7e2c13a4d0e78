// dsinfer CLI: `dsinfer debug-dflash`. Loads a target and a DFlash/DSpark drafter, runs the
// FIRST greedy speculative round after a prompt and shows every number of it.
//
// Data flow: --prompt-ids → target Model::forward (capturing the drafter's
// target_layer_ids) → anchor = argmax of the last row → Drafter::commit_context(prompt)
// → BlockDrafter::propose_debug (full block, greedy; --block-size keeps the first
// drafts_for_block_size drafts, which is exactly what a smaller block proposes since the
// drafts are non-anticipating) → target forward over [anchor, drafts] → target greedy per
// row → accepted prefix. With --json: ONE JSON object on stdout with the fixed fields
//   anchor, draft_ids, draft_logprobs (log softmax at T = 1 of the final draft logits, after
//   any Markov head), confidence (sigmoid per position, null without a head), accepted
// plus extras: dialect ("zlab"/"deepspec"), kind, block_size, drafts, start, mask_token_id,
// target_layer_ids, target_greedy, next_token, confidence_logits, and calibrated_survival
// (+ calibration_temperatures) when DRAFT_DIR/calibration.json is present (or
// calibration_error when it is stale/malformed). Without --json a readable report of what
// was loaded and the round.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/dflash_backbone.h"
#include "spec/drafter_loader.h"

namespace dsinfer::cli {

namespace {

struct DebugArgs {
  std::string matmul_precision = "auto";
  std::string model_path, draft_model_path, prompt_ids;
  bool json = false;
  int block_size = 0;
  int threads = 0;
};

std::vector<int32_t> parse_prompt_ids(const std::string& s, int vocab) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos) throw Error("--prompt-ids: empty item in '" + s + "'");
    item = item.substr(a, b - a + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v >= vocab)
      throw Error("--prompt-ids: '" + item + "' is not a token id in [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw Error("--prompt-ids: no ids given");
  return ids;
}

// Resident set size of this process in MiB (0 when /proc is unavailable).
double rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}

uint64_t dir_weight_bytes(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
      n += e.file_size();
  }
  return n;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return "[" + s + "]";
}

int run_debug(const DebugArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  apply_matmul_precision(a.matmul_precision);
  auto model = load_model(a.model_path);
  const ModelConfig& tc = model->config();
  const DraftConfig dc = parse_draft_config(a.draft_model_path, tc);
  // The whole vocabulary: the dump is compared with the reference implementation's logits.
  DrafterOptions dopts;
  dopts.draft_vocab_size = 0;
  auto drafter = load_drafter(a.draft_model_path, *model, dopts);
  const auto* block = dynamic_cast<const BlockDrafter*>(drafter.get());
  if (!block) throw Error("--draft-model-path " + a.draft_model_path + ": not a DFlash/DSpark block drafter");
  const DrafterInfo& info = drafter->info();
  const int n_keep = a.block_size > 0 ? drafts_for_block_size(info, a.block_size) : info.max_draft_tokens;
  const std::vector<int32_t> prompt = parse_prompt_ids(a.prompt_ids, tc.vocab_size);
  const int P = static_cast<int>(prompt.size()), V = tc.vocab_size;

  // Calibration beside the drafter: absent, valid, or reported as an error (not fatal here).
  std::optional<Calibration> cal;
  std::string cal_error;
  try {
    cal = load_calibration(a.draft_model_path);
  } catch (const Error& e) {
    cal_error = e.what();
  }

  // Prefill and commit the prompt context.
  auto kv = model->make_kv_cache(1, P + info.max_draft_tokens + 2);
  ForwardBatch pb;
  pb.capture_layers = info.target_layer_ids;
  pb.entries.push_back({0, prompt, {P - 1}});
  ForwardOutput out;
  model->forward(*kv, pb, out);
  const int32_t anchor = argmax(out.logits.data(), V);
  auto seq = drafter->start();
  drafter->commit_context(*seq, prompt.data(), info.target_layer_ids.empty() ? nullptr : out.captured.data(), P);

  // Full greedy block, then keep the first n_keep drafts.
  DraftDebug dbg;
  Rng rng(0);
  DraftProposal p = block->propose_debug(*seq, anchor, SamplingParams{}, rng, dbg);
  const size_t n = std::min(p.tokens.size(), static_cast<size_t>(n_keep));
  p.tokens.resize(n);
  dbg.draft_logprobs.resize(n);
  if (!p.confidence.empty()) p.confidence.resize(n);
  if (!p.confidence_logits.empty()) p.confidence_logits.resize(n);

  // Verify [anchor, drafts] with the target, greedy.
  ForwardBatch vb;
  ForwardEntry e{0, {anchor}, {}};
  e.tokens.insert(e.tokens.end(), p.tokens.begin(), p.tokens.end());
  for (size_t r = 0; r <= n; ++r) e.logit_rows.push_back(static_cast<int>(r));
  vb.entries.push_back(e);
  model->forward(*kv, vb, out);
  std::vector<int32_t> tg;
  for (size_t r = 0; r <= n; ++r) tg.push_back(argmax(out.logits.data() + r * V, V));
  size_t acc = 0;
  while (acc < n && p.tokens[acc] == tg[acc]) ++acc;
  std::vector<float> survival;
  if (cal && !p.confidence_logits.empty()) survival = calibrated_survival(*cal, p.confidence_logits);

  const std::string dialect = dc.dialect == DraftDialect::ZLab ? "zlab" : "deepspec";
  if (a.json) {
    nlohmann::ordered_json j;
    j["anchor"] = anchor;
    j["draft_ids"] = p.tokens;
    j["draft_logprobs"] = dbg.draft_logprobs;
    j["confidence"] = info.confidence_head ? nlohmann::ordered_json(p.confidence) : nlohmann::ordered_json();
    j["accepted"] = acc;
    j["dialect"] = dialect;
    j["kind"] = info.kind;
    j["block_size"] = a.block_size > 0 ? a.block_size : info.block_size;
    j["drafts"] = n;
    j["start"] = P;
    j["mask_token_id"] = info.mask_token_id;
    j["target_layer_ids"] = info.target_layer_ids;
    j["shared_with_target"] = info.shared_with_target;
    j["target_greedy"] = tg;
    j["next_token"] = tg[acc];
    j["confidence_logits"] =
        info.confidence_head ? nlohmann::ordered_json(p.confidence_logits) : nlohmann::ordered_json();
    if (cal) {
      j["calibrated_survival"] = survival;
      j["calibration_temperatures"] = cal->temperatures;
    }
    if (!cal_error.empty()) j["calibration_error"] = cal_error;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }

  const ModelConfig& b = dc.base;
  std::printf("target: %s (%s, %d layers, hidden %d, vocab %d, %.2f MiB weights on disk)\n", a.model_path.c_str(),
              tc.architecture.c_str(), tc.num_hidden_layers, tc.hidden_size, tc.vocab_size,
              static_cast<double>(dir_weight_bytes(a.model_path)) / (1 << 20));
  std::printf("drafter: %s\n", a.draft_model_path.c_str());
  std::printf("  dialect %s, kind %s, block size %d (%d drafts/round; this run %zu), mask id %d\n", dialect.c_str(),
              info.kind.c_str(), info.block_size, info.max_draft_tokens, n, info.mask_token_id);
  std::printf("  backbone: %d layers, hidden %d, heads %d/%d x %d, intermediate %d; fc [%d, %zu x %d]\n",
              b.num_hidden_layers, b.hidden_size, b.num_attention_heads, b.num_key_value_heads, b.head_dim,
              b.intermediate_size, b.hidden_size, info.target_layer_ids.size(), b.hidden_size);
  std::printf("  target layer ids: %s\n", join(info.target_layer_ids).c_str());
  if (!info.shared_with_target.empty()) {
    std::string names;
    for (const std::string& n : info.shared_with_target) names += (names.empty() ? "" : ", ") + n;
    std::printf("  uses the target's own copy of: %s (bit-identical)\n", names.c_str());
  }
  std::printf("  markov head: %s", info.markov_head.empty() ? "none" : info.markov_head.c_str());
  if (!info.markov_head.empty()) std::printf(" (rank %d)", dc.markov_rank);
  std::printf("; confidence head: %s\n",
              !info.confidence_head ? "none"
              : (dc.confidence_with_markov == 0 || dc.markov_rank == 0) ? "yes (h only)"
                                                                        : "yes (with the Markov feature)");
  if (cal) {
    std::string t;
    for (size_t k = 0; k < cal->temperatures.size(); ++k) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.3f", k ? ", " : "", cal->temperatures[k]);
      t += buf;
    }
    std::printf("  calibration: %s (%s, %lld rounds, T = [%s])\n", calibration_path(a.draft_model_path).c_str(),
                cal->method.c_str(), static_cast<long long>(cal->rounds), t.c_str());
  } else if (!cal_error.empty()) {
    std::printf("  calibration: unusable: %s\n", cal_error.c_str());
  } else {
    std::printf("  calibration: none (run dsinfer calibrate)\n");
  }
  std::printf("  weights: %.2f MiB on disk; process RSS %.1f MiB\n",
              static_cast<double>(dir_weight_bytes(a.draft_model_path)) / (1 << 20), rss_mib());
  std::printf("round 0: prompt %d tokens, anchor %d at position %d\n", P, anchor, P);
  std::printf("  %3s %8s %10s %10s %10s %8s %s\n", "k", "draft", "logprob", "conf", "survival", "target", "");
  for (size_t k = 0; k < n; ++k) {
    char conf[32] = "-", surv[32] = "-";
    if (!p.confidence.empty()) std::snprintf(conf, sizeof conf, "%.4f", p.confidence[k]);
    if (!survival.empty()) std::snprintf(surv, sizeof surv, "%.4f", survival[k]);
    std::printf("  %3zu %8d %10.4f %10s %10s %8d %s\n", k + 1, p.tokens[k], dbg.draft_logprobs[k], conf, surv, tg[k],
                k < acc ? "accepted" : (k == acc ? "rejected" : ""));
  }
  std::printf("accepted %zu of %zu drafts; next token %d\n", acc, n, tg[acc]);
  return 0;
}

}  // namespace

Runner register_debug_dflash(CLI::App& app) {
  auto a = std::make_shared<DebugArgs>();
  auto* sub = app.add_subcommand("debug-dflash", "Show the first greedy DFlash/DSpark round after a prompt");
  sub->add_option("--model-path", a->model_path, "Target model directory")->required();
  sub->add_option("--draft-model-path", a->draft_model_path, "Draft checkpoint directory")->required();
  sub->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids")->required();
  sub->add_flag("--json", a->json, "Print one JSON object (anchor, draft_ids, draft_logprobs, confidence, accepted, ...)");
  sub->add_option("--block-size", a->block_size, "Verify block size (<= the checkpoint's)")->check(CLI::Range(1, 1024));
  sub->add_option("--threads", a->threads, "Worker threads (default: all hardware threads)")->check(CLI::Range(1, 1024));
  add_matmul_precision_option(sub, &a->matmul_precision);
  return [a] { return run_debug(*a); };
}

}  // namespace dsinfer::cli
