// dsinfer CLI: `dsinfer generate`. Loads a model directory (and its tokenizer when present),
// builds the prompt (raw text, chat template, or explicit ids), sets up the drafter asked
// for by --spec (none = plain decoding, ngram = prompt lookup, dflash/dspark = a draft
// checkpoint from --draft-model-path), runs the engine's generation loop and streams text
// to stdout. Stats lines (speed; with a drafter also tau and acceptance per draft
// position) go to stderr; with --json a single JSON object (ids, text, finish_reason,
// usage, timings, spec) goes to stdout instead. --log-dflash-details writes one JSON line
// per speculative round.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/speculative.h"
#include "engine/sps_profile.h"
#include "model/deepseek_v4.h"
#include "model/model.h"
#include "spec/calibration.h"
#include "spec/drafter_loader.h"
#include "spec/ngram_drafter.h"
#include "spec/prefix_scheduler.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

struct GenerateArgs {
  std::string matmul_precision = "auto";
  std::string model_path;
  std::string prompt;
  bool prompt_set = false;
  std::string prompt_ids;
  std::string system;
  bool chat = false;
  bool no_think = false;
  int max_tokens = 128;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;
  bool ignore_eos = false;
  int threads = 0;
  bool json = false;
  // speculation
  std::string draft_model_path;
  std::string spec;             // "" (none, or the checkpoint's kind with --draft-model-path)
  int block_size = 0;           // 0: unset
  int max_reuse_depth = -1;     // -1: unset
  std::string details_path;
  int ngram_max = 0, ngram_min = 0;  // 0: unset (defaults 3 and 1)
  int window_size = -1;              // -1: unset; 0 = unlimited draft context
  int draft_vocab = -1;              // -1: the ranking's default (DrafterOptions::draft_vocab_size)
  std::string draft_vocab_file;
  float validation_threshold = -1;   // -1: unset
  std::string spec_schedule;         // "": the method's default (see resolve_schedule)
  std::string sps_table_path;        // --sps-table: a fixed SPS(B) table instead of profiling
  std::string spec_lookup;           // --spec-lookup on|off; "": on with a model drafter
  DeviceArgs dev;                    // --device cpu|cuda and the CUDA options
};

// What the speculation options point at; lives as long as the run.
struct SpecResources {
  std::optional<Calibration> calibration;
  std::optional<SpsTable> sps;
};

// --spec-schedule default: `dspark` for a DSpark drafter (unless a validation threshold was
// given: then `threshold`, the static policy), `fixed` otherwise.
std::string resolve_schedule(const GenerateArgs& a, const std::string& method, const Drafter* d) {
  if (!a.spec_schedule.empty()) return a.spec_schedule;
  if (a.validation_threshold >= 0) return "threshold";
  if (d && d->info().confidence_head && (method == "dspark" || method.empty())) return "dspark";
  return "fixed";
}

// Builds the drafter --spec asks for; null for plain decoding. Fills opts' draft caps.
std::unique_ptr<Drafter> make_drafter(const GenerateArgs& a, const std::string& method, Model& target,
                                      SpecResources& res, SpecOptions& opts) {
  std::optional<Calibration>& calibration = res.calibration;
  const bool ngram_flags = a.ngram_max > 0 || a.ngram_min > 0;
  if (ngram_flags && method != "ngram") throw Error("--ngram-max/--ngram-min: only used with --spec ngram");
  if (method == "none") {
    if (!a.draft_model_path.empty())
      throw Error("--draft-model-path: needs --spec dflash or --spec dspark (got --spec none)");
    if (a.block_size > 0) throw Error("--block-size: needs --spec dflash, dspark or ngram");
    if (a.max_reuse_depth >= 0) throw Error("--dflash-max-reuse-depth: needs --spec dflash, dspark or ngram");
    if (a.window_size >= 0) throw Error("--dflash-window-size: needs --spec dflash or dspark");
    if (a.draft_vocab >= 0 || !a.draft_vocab_file.empty()) throw Error("--draft-vocab: needs --spec dflash or dspark");
    if (a.validation_threshold >= 0) throw Error("--dflash-validation-threshold: needs --spec dspark");
    if (!a.spec_schedule.empty() && a.spec_schedule != "fixed")
      throw Error("--spec-schedule " + a.spec_schedule + ": needs --spec dspark (plain decoding verifies nothing)");
    if (!a.sps_table_path.empty()) throw Error("--sps-table: needs --spec dspark");
    if (a.spec_lookup == "on") throw Error("--spec-lookup on: needs --spec dflash or dspark (a model drafter to assist)");
    return nullptr;
  }
  if (a.max_reuse_depth >= 0) opts.max_reuse_depth = a.max_reuse_depth;
  if (method == "ngram") {
    if (!a.draft_model_path.empty()) throw Error("--draft-model-path: not used by --spec ngram (it has no weights)");
    if (a.window_size >= 0) throw Error("--dflash-window-size: not used by --spec ngram (it has no draft context cache)");
    if (a.draft_vocab >= 0 || !a.draft_vocab_file.empty()) throw Error("--draft-vocab: not used by --spec ngram (it has no LM head)");
    if (a.validation_threshold >= 0) throw Error("--dflash-validation-threshold: not used by --spec ngram (no confidences)");
    if (!a.spec_schedule.empty() && a.spec_schedule != "fixed")
      throw Error("--spec-schedule " + a.spec_schedule + ": not used by --spec ngram (no confidences)");
    if (!a.sps_table_path.empty()) throw Error("--sps-table: not used by --spec ngram");
    if (a.spec_lookup == "on") throw Error("--spec-lookup on: needs --spec dflash or dspark (--spec ngram is a lookup)");
    NgramOptions no;
    if (a.ngram_max > 0) no.max_ngram = a.ngram_max;
    if (a.ngram_min > 0) no.min_ngram = a.ngram_min;
    if (a.ngram_min > 0 && a.ngram_max == 0 && no.min_ngram > no.max_ngram) no.max_ngram = no.min_ngram;
    if (no.min_ngram > no.max_ngram)
      throw Error("--ngram-min (" + std::to_string(no.min_ngram) + ") must not exceed --ngram-max (" +
                  std::to_string(no.max_ngram) + ")");
    if (a.block_size > 0) no.max_draft_tokens = a.block_size;
    return std::make_unique<NgramDrafter>(no);
  }
  // dflash / dspark (or a draft checkpoint without --spec: its own kind decides).
  const std::string shown = method.empty() ? std::string("--draft-model-path") : "--spec " + method;
  // A DeepSeek-V4 target carries its own DSpark drafter (mtp.*): --spec dspark alone uses it.
  std::string draft_dir = a.draft_model_path;
  if (draft_dir.empty() && method == "dspark" && deepseek_v4_config(target)) draft_dir = target.config().model_dir;
  if (draft_dir.empty()) throw Error(shown + ": needs --draft-model-path");
  if (!file_exists(draft_dir + "/config.json"))
    throw Error("--draft-model-path: " + draft_dir + "/config.json not found (expected a drafter checkpoint directory)");
  DrafterOptions dopts;
  if (a.window_size >= 0) dopts.window_size = a.window_size;  // else the drafter's recommended window
  dopts.draft_vocab_size = a.draft_vocab;
  dopts.draft_vocab_file = a.draft_vocab_file;
  std::unique_ptr<Drafter> d = load_drafter(draft_dir, target, dopts);
  if (!method.empty()) check_drafter_kind(method, d->info());
  if (a.block_size > 0) opts.max_draft_tokens = drafts_for_block_size(d->info(), a.block_size);
  opts.lookup_assist = a.spec_lookup != "off";
  const std::string schedule = resolve_schedule(a, method, d.get());
  if (schedule == "fixed") {
    if (a.validation_threshold > 0.0f)
      throw Error("--dflash-validation-threshold: not used by --spec-schedule fixed (it verifies the full block)");
    if (!a.sps_table_path.empty()) throw Error("--sps-table: only used by --spec-schedule dspark");
    return d;
  }
  if (!d->info().confidence_head)
    throw Error((a.validation_threshold > 0.0f ? std::string("--dflash-validation-threshold") : "--spec-schedule " + schedule) +
                ": the drafter in " + draft_dir +
                " has no confidence head (needs a DSpark checkpoint with enable_confidence_head)");
  if (schedule == "threshold" && a.validation_threshold < 0.0f)
    throw Error("--spec-schedule threshold: needs --dflash-validation-threshold T in [0, 1] (0 prunes nothing)");
  if (schedule == "threshold" && !a.sps_table_path.empty()) throw Error("--sps-table: only used by --spec-schedule dspark");
  if (a.validation_threshold > 0.0f) opts.validation_threshold = a.validation_threshold;  // dspark: a floor
  calibration = load_calibration(draft_dir);
  if (calibration) {
    opts.calibration = &*calibration;
  } else {
    std::fprintf(stderr, "warning: %s has no calibration.json: scheduling on raw confidences (run dsinfer calibrate)\n",
                 draft_dir.c_str());
  }
  if (schedule == "dspark") {
    // SPS(B) for B up to the largest verify (anchor + drafts), profiled for this target +
    // drafter on this machine at start-up and cached (sps_profile.h), or read from --sps-table.
    int n = opts.max_draft_tokens >= 0 ? std::min(opts.max_draft_tokens, d->info().max_draft_tokens)
                                       : d->info().max_draft_tokens;
    if (opts.max_reuse_depth >= 0) n = std::min(n, opts.max_reuse_depth);
    if (!a.sps_table_path.empty()) {
      res.sps = read_sps_table(a.sps_table_path);
    } else {
      SpsProfileOptions po;
      po.max_batch_tokens = std::max(n, 0) + 1;
      const std::string hash = sps_model_hash(a.model_path, draft_dir);
      // The device is part of the key: a table profiled with the target on the CPU says
      // nothing about the GPU (and the GEMM mode / graphs change the GPU's costs too).
      std::string machine = sps_machine_string(static_cast<int>(ThreadPool::global().size()), po);
      if (device_is_cuda(a.dev)) machine += " | device " + device_summary(a.dev);
      // A reduced draft vocabulary changes the drafter's cost, which the table includes.
      if (d->info().draft_vocab > 0) machine += " | draft vocab " + std::to_string(d->info().draft_vocab);
      bool profiled = false;
      res.sps = load_or_profile_sps(target, d.get(), hash, machine, default_sps_cache_path(hash), po, &profiled);
      if (profiled)
        std::fprintf(stderr, "spec-schedule dspark: profiled SPS(B) for B = 1..%d (cached for the next run)\n",
                     po.max_batch_tokens);
    }
    opts.sps = &*res.sps;
  }
  return d;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos) throw Error("--prompt-ids: empty item in '" + s + "'");
    item = item.substr(a, b - a + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) throw Error("--prompt-ids: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw Error("--prompt-ids: no ids given");
  return ids;
}

int run_generate(const GenerateArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  apply_matmul_precision(a.matmul_precision);
  if (a.prompt_set == !a.prompt_ids.empty()) throw Error("generate: give exactly one of --prompt or --prompt-ids");
  if (a.chat && !a.prompt_set) throw Error("--chat: needs --prompt");
  if (!a.chat && !a.system.empty()) throw Error("--system: only used with --chat");
  if (!a.chat && a.no_think) throw Error("--no-think: only used with --chat");

  auto model = load_model_on_device(a.model_path, a.dev);
  const ModelConfig& cfg = model->config();
  std::unique_ptr<Tokenizer> tok;
  tok = load_model_tokenizer(a.model_path, *model);

  std::vector<int32_t> prompt;
  if (a.prompt_set) {
    if (!tok) throw Error(a.model_path + "/tokenizer.json: not found (needed for --prompt; use --prompt-ids)");
    std::string text = a.prompt;
    if (a.chat) {
      std::vector<ChatMessage> msgs;
      if (!a.system.empty()) msgs.push_back({"system", a.system});
      msgs.push_back({"user", a.prompt});
      ChatOptions opts;
      opts.enable_thinking = !a.no_think;
      text = apply_chat_template(*tok, msgs, opts);
    }
    prompt = tok->encode(text, /*parse_special=*/a.chat);
    if (prompt.empty()) throw Error("--prompt: encodes to zero tokens");
  } else {
    prompt = parse_ids(a.prompt_ids);
  }

  SamplingParams sp;
  sp.temperature = a.temperature;
  sp.top_p = a.top_p;
  sp.top_k = a.top_k;
  sp.seed = a.seed;
  StopConditions stop;
  stop.max_tokens = a.max_tokens;
  stop.stop_strings = a.stop;
  stop.stop_ids = a.stop_ids;
  if (!a.ignore_eos) {
    for (int32_t id : cfg.eos_token_ids) stop.stop_ids.push_back(id);
    if (tok && !tok->eos_token().empty())
      if (auto id = tok->token_to_id(tok->eos_token())) stop.stop_ids.push_back(*id);
  }

  std::string method = a.spec;
  if (method.empty() && a.draft_model_path.empty()) method = "none";
  SpecOptions spec_opts;
  SpecResources resources;  // read by spec_opts.calibration / .sps during the run
  std::unique_ptr<Drafter> drafter = make_drafter(a, method, *model, resources, spec_opts);
  spec_opts.drafter = drafter.get();
  if (method.empty() && drafter) method = drafter->info().kind;
  std::ofstream details;
  if (!a.details_path.empty()) {
    details.open(a.details_path, std::ios::out | std::ios::trunc);
    if (!details) throw Error("--log-dflash-details: cannot open '" + a.details_path + "' for writing");
    spec_opts.on_round = [&details](const SpecRound& r) { details << spec_round_json(r) << '\n'; };
  }

  TextCallback on_text;
  if (!a.json)
    on_text = [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    };
  GenerationResult r = generate(*model, tok.get(), prompt, sp, stop, on_text, spec_opts);
  if (details.is_open()) {
    details.flush();
    if (!details) throw Error("--log-dflash-details: write to '" + a.details_path + "' failed");
  }

  const double prefill_tps = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0.0;
  const size_t decoded = r.ids.size() > 1 ? r.ids.size() - 1 : 0;
  const double decode_tps = r.decode_seconds > 0 && decoded ? decoded / r.decode_seconds : 0.0;
  if (a.json) {
    nlohmann::json j;
    j["ids"] = r.ids;
    j["text"] = r.text;
    j["finish_reason"] = r.finish_reason;
    j["prompt_ids"] = prompt;
    j["usage"] = {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.ids.size()}};
    j["timings"] = {{"prefill_seconds", r.prefill_seconds}, {"decode_seconds", r.decode_seconds},
                    {"prompt_tokens_per_second", prefill_tps}, {"generated_tokens_per_second", decode_tps}};
    nlohmann::json acc = nlohmann::json::array();
    for (size_t k = 0; k < r.spec.proposed.size(); ++k)
      acc.push_back({{"position", k + 1},
                     {"proposed", r.spec.proposed[k]},
                     {"accepted", r.spec.accepted[k]},
                     {"rate", static_cast<double>(r.spec.accepted[k]) / static_cast<double>(r.spec.proposed[k])}});
    j["spec"] = {{"method", method},
                 {"rounds", r.spec.rounds},
                 {"tau", r.spec.tau()},
                 {"acceptance", acc},
                 {"draft_ms", r.spec.draft_ms},
                 {"verify_ms", r.spec.verify_ms},
                 {"lookup_rounds", r.spec.lookup_rounds},
                 {"draft_vocab", drafter ? drafter->info().draft_vocab : 0},
                 {"tokens_per_second", decode_tps}};
    std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", s.c_str());
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);  // the stats line on stderr must come after the text
  std::fprintf(stderr, "prompt: %d tokens, %.1f tokens/s | generated: %zu tokens, %.2f tokens/s | finish: %s | threads: %d\n",
               r.prompt_tokens, prefill_tps, r.ids.size(), decode_tps, r.finish_reason.c_str(),
               ThreadPool::global().size());
  if (drafter) {
    std::string acc;
    for (size_t k = 0; k < r.spec.proposed.size(); ++k) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%zu: %lld/%lld (%.2f)", k ? ", " : "", k + 1,
                    static_cast<long long>(r.spec.accepted[k]), static_cast<long long>(r.spec.proposed[k]),
                    static_cast<double>(r.spec.accepted[k]) / static_cast<double>(r.spec.proposed[k]));
      acc += buf;
    }
    std::string shown = method;
    if (drafter->info().draft_vocab > 0) shown += " (draft vocab " + std::to_string(drafter->info().draft_vocab) + ")";
    std::fprintf(stderr, "spec %s: %d rounds (%d lookup), tau %.3f tokens/round | accepted by draft position: %s | draft %.1f ms, verify %.1f ms | %.2f tokens/s\n",
                 shown.c_str(), r.spec.rounds, r.spec.lookup_rounds, r.spec.tau(), acc.empty() ? "no drafts" : acc.c_str(),
                 r.spec.draft_ms, r.spec.verify_ms, decode_tps);
  }
  return 0;
}

}  // namespace

Runner register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  sub->add_option("--model-path", a->model_path, "Hugging Face model directory")->required();
  auto* p = sub->add_option("--prompt", a->prompt, "Prompt text");
  sub->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids");
  sub->add_flag("--chat", a->chat, "Wrap --prompt as a user message with the model's chat template");
  sub->add_option("--system", a->system, "System message (with --chat)");
  sub->add_flag("--no-think", a->no_think, "With --chat on Qwen3: disable thinking (empty <think> block)");
  sub->add_option("--max-tokens", a->max_tokens, "Maximum generated tokens")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", a->temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  add_top_p_option(sub, &a->top_p, "Nucleus sampling mass, (0, 1]");
  sub->add_option("--top-k", a->top_k, "Keep the k most likely tokens, 0 = off")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", a->seed, "Sampling seed");
  sub->add_option("--stop", a->stop, "Stop string (repeatable); not included in the output");
  sub->add_option("--stop-id", a->stop_ids, "Stop token id (repeatable), in addition to the model's eos ids");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the model's end-of-sequence ids");
  sub->add_option("--threads", a->threads, "Worker threads (default: all hardware threads)")->check(CLI::Range(1, 1024));
  add_matmul_precision_option(sub, &a->matmul_precision);
  add_device_options(sub, &a->dev);
  sub->add_flag("--json", a->json, "Print one JSON object with ids, text, timings and speculation stats");
  sub->add_option("--draft-model-path", a->draft_model_path, "Draft checkpoint directory (DFlash / DSpark)");
  sub->add_option("--spec", a->spec, "Speculative decoding method (none = plain decoding)")
      ->check(CLI::IsMember({"dflash", "dspark", "ngram", "none"}));
  sub->add_option("--block-size", a->block_size,
                  "dflash/dspark: verify block size (<= the checkpoint's); ngram: max drafts per round (default 8)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--dflash-max-reuse-depth", a->max_reuse_depth, "Cap on drafts verified per round")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--dflash-window-size", a->window_size,
                  "Drafter context window: committed positions of target context the drafter attends to "
                  "(0 = all; default: the drafter's config field dsinfer_context_window, its training "
                  "context, else all)")
      ->check(CLI::Range(0, 1 << 24));
  add_draft_vocab_options(sub, &a->draft_vocab, &a->draft_vocab_file);
  sub->add_option("--dflash-validation-threshold", a->validation_threshold,
                  "Verify only drafts whose calibrated prefix survival probability stays >= this (0 = off)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--spec-schedule", a->spec_schedule,
                  "How many drafts each round verifies: fixed (all), threshold (--dflash-validation-threshold), "
                  "dspark (prefix scheduler on calibrated confidences and the profiled SPS(B) curve; default for DSpark)")
      ->check(CLI::IsMember({"fixed", "threshold", "dspark"}));
  sub->add_option("--sps-table", a->sps_table_path,
                  "dspark schedule: read SPS(B) from this JSON table instead of profiling at start-up");
  sub->add_option("--spec-lookup", a->spec_lookup,
                  "dflash/dspark: let a suffix lookup in the prompt and output stand in for the drafter in rounds "
                  "where it is expected to yield more tokens per millisecond (default on; lossless)")
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--log-dflash-details", a->details_path, "Write one JSON line per speculative round to FILE");
  sub->add_option("--ngram-max", a->ngram_max, "ngram: longest suffix looked up (default 3)")->check(CLI::Range(1, 64));
  sub->add_option("--ngram-min", a->ngram_min, "ngram: shortest suffix looked up (default 1)")->check(CLI::Range(1, 64));
  return [a, p] {
    a->prompt_set = p->count() > 0;
    return run_generate(*a);
  };
}

}  // namespace dsinfer::cli
