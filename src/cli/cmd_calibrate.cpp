// dsinfer CLI: `dsinfer calibrate`. Fits Sequential Temperature Scaling for a DSpark
// drafter's confidence head (drafters_spec.md §2.9) and writes calibration.json.
//
// Data flow: --model-path target + --draft-model-path drafter (must have a confidence head)
// → --prompts JSON lines ({"prompt": text} via the target's tokenizer, or {"prompt_ids"})
// → spec/calibration_runner: full-block speculative rounds (greedy unless --temperature)
// collecting (confidence logits, accepted prefix) → fit on 80% of the prompts (all of them
// when fewer than 10), measure on the fit set and the held-out 20% → a per-position table
// (ECE / AUROC before and after) on stdout → DRAFT_DIR/calibration.json (or --out).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/calibration_runner.h"
#include "spec/drafter_loader.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

struct CalibrateArgs {
  std::string matmul_precision = "auto";
  std::string model_path, draft_model_path, prompts, out;
  int64_t max_rounds = 2000;
  int max_tokens = 256;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  int block_size = 0;
  int threads = 0;
  int draft_vocab = -1;  // DrafterOptions::draft_vocab_size
  std::string draft_vocab_file;
};

int run_calibrate(const CalibrateArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  apply_matmul_precision(a.matmul_precision);
  auto model = load_model(a.model_path);
  std::unique_ptr<Tokenizer> tok;
  tok = load_model_tokenizer(a.model_path, *model);
  // The drafter as generate/serve load it by default (a ranking's reduced draft vocabulary
  // included), so the calibration matches the drafts it will gate.
  DrafterOptions dopts;
  dopts.draft_vocab_size = a.draft_vocab;
  dopts.draft_vocab_file = a.draft_vocab_file;
  auto drafter = load_drafter(a.draft_model_path, *model, dopts);
  const DrafterInfo& info = drafter->info();
  if (!info.confidence_head)
    throw Error("--draft-model-path " + a.draft_model_path + ": drafter kind '" + info.kind +
                "' has no confidence head (calibration needs a DSpark checkpoint with enable_confidence_head)");

  CalibrationRunOptions o;
  o.sampling.temperature = a.temperature;
  o.sampling.top_p = a.top_p;
  o.sampling.top_k = a.top_k;
  o.sampling.seed = a.seed;
  o.max_new_tokens = a.max_tokens;
  o.max_rounds = a.max_rounds;
  if (a.block_size > 0) {
    o.drafts = drafts_for_block_size(info, a.block_size);
    o.block_size = a.block_size;
  }
  o.stop_ids = model->config().eos_token_ids;
  if (tok && !tok->eos_token().empty())
    if (auto id = tok->token_to_id(tok->eos_token())) o.stop_ids.push_back(*id);

  std::function<std::vector<int32_t>(const std::string&)> encode;
  if (tok) encode = [&tok](const std::string& s) { return tok->encode(s, /*parse_special=*/true); };
  const auto prompts = read_calibration_prompts(a.prompts, model->config().vocab_size, encode);

  const CalibrationReport rep = run_calibration(*model, *drafter, a.draft_model_path, prompts, o,
                                                [](int i, int n, int got) {
                                                  std::fprintf(stderr, "calibrate: prompt %d/%d: %d rounds\n", i + 1, n, got);
                                                });
  const std::string path = a.out.empty() ? calibration_path(a.draft_model_path) : a.out;
  write_calibration(path, rep.calibration);
  const std::string table = format_calibration_table(rep);
  std::fwrite(table.data(), 1, table.size(), stdout);
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

}  // namespace

Runner register_calibrate(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* sub = app.add_subcommand(
      "calibrate", "Fit Sequential Temperature Scaling for a DSpark confidence head; writes calibration.json");
  sub->add_option("--model-path", a->model_path, "Target model directory")->required();
  sub->add_option("--draft-model-path", a->draft_model_path, "DSpark draft checkpoint directory (with a confidence head)")
      ->required();
  add_draft_vocab_options(sub, &a->draft_vocab, &a->draft_vocab_file);
  sub->add_option("--prompts", a->prompts, "JSON lines: {\"prompt\": \"...\"} or {\"prompt_ids\": [...]}")->required();
  sub->add_option("--max-rounds", a->max_rounds, "Total speculative rounds over all prompts (equal share per prompt)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--max-tokens", a->max_tokens, "Generated tokens per prompt")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", a->temperature, "Deployment sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-p", a->top_p, "Nucleus sampling mass, (0, 1]")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--top-k", a->top_k, "Keep the k most likely tokens, 0 = off")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", a->seed, "Sampling seed");
  sub->add_option("--block-size", a->block_size, "Verify block size (<= the checkpoint's; default: the checkpoint's)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--out", a->out, "Output file (default: DRAFT_DIR/calibration.json)");
  sub->add_option("--threads", a->threads, "Worker threads (default: all hardware threads)")->check(CLI::Range(1, 1024));
  add_matmul_precision_option(sub, &a->matmul_precision);
  return [a] { return run_calibrate(*a); };
}

}  // namespace dsinfer::cli
