// dsinfer speculation floor: the data collection behind `dsinfer calibrate` — a small,
// self-contained full-block speculative round runner (independent of engine/, which it
// mirrors) plus the prompt-file reader, the fit/held-out split and the report table.
//
// Data flow per prompt:
//   prompt ids → Model::forward (capture the drafter's target_layer_ids) → first token by
//   the verification rule with no drafts (= plain sampling) = anchor; prompt + captured rows
//   → Drafter::commit_context
//   round: Drafter::propose(anchor, γ drafts — always the FULL block, no truncation)
//     → z_1..z_γ (confidence logits) → Model::forward([anchor, d_1..d_γ]) → verify_drafts
//     → accepted prefix acc → CalibrationRound{z, acc} (cut after an accepted stop id,
//     as the reference recorder does) → target KV truncated to start + acc + 1 →
//     commit_context(anchor + accepted drafts) → next token = next anchor.
//   until the per-prompt token / round budget or a stop id.
// run_calibration: prompts → rounds (prompt i is held out when there are >= 10 prompts and
// i % 5 == 4, i.e. 20%) → fit_sts on the fit rounds → metrics before/after on both sets →
// Calibration (calibration.json) + CalibrationReport (the printed table).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "spec/calibration.h"

namespace dsinfer {

class Drafter;
class Model;

// Reads a JSON-lines prompts file: one object per non-blank line with either
// "prompt": "text" (needs `encode`, else an error) or "prompt_ids": [ints]. Ids must be
// in [0, vocab). Errors name FILE:LINE and the field. At least one prompt.
std::vector<std::vector<int32_t>> read_calibration_prompts(
    const std::string& path, int vocab, const std::function<std::vector<int32_t>(const std::string&)>& encode);

struct CalibrationRunOptions {
  SamplingParams sampling;       // deployment sampling (greedy by default); seed = Rng seed
  int drafts = -1;               // drafts per round (γ); -1: the drafter's max_draft_tokens
  int block_size = 0;            // recorded in calibration.json (0: the drafter's)
  int max_new_tokens = 256;      // generated tokens per prompt (rounds stop once reached)
  int64_t max_rounds = 2000;     // total rounds over all prompts; each prompt gets an equal share
  std::vector<int32_t> stop_ids; // a committed stop id ends the prompt
  StsOptions sts;
};

// Runs full-block rounds for one prompt and appends them to `out`; returns the number of
// rounds run. Requires a drafter with a confidence head.
int collect_calibration_rounds(Model& target, const Drafter& drafter, const std::vector<int32_t>& prompt,
                               const CalibrationRunOptions& opts, int max_rounds, Rng& rng,
                               std::vector<CalibrationRound>& out);

struct CalibrationReport {
  Calibration calibration;
  int gamma = 0;
  int fit_prompts = 0, heldout_prompts = 0;
  std::vector<CalibrationRound> fit_rounds, heldout_rounds;
  std::vector<PositionMetrics> fit_before, fit_after, heldout_before, heldout_after;
};

// Collects rounds for every prompt, splits, fits STS and measures. draft_dir is only used
// for the fingerprint. `progress` (may be empty) is called after every prompt with
// (prompt index, prompts, rounds of that prompt).
CalibrationReport run_calibration(Model& target, const Drafter& drafter, const std::string& draft_dir,
                                  const std::vector<std::vector<int32_t>>& prompts, const CalibrationRunOptions& opts,
                                  const std::function<void(int, int, int)>& progress = {});

// Fit + metrics on already collected rounds (the part of run_calibration after collection).
void fit_calibration_report(CalibrationReport& rep, const StsOptions& sts);

// The per-position table `dsinfer calibrate` prints (fit set, and held-out when present).
std::string format_calibration_table(const CalibrationReport& rep);

}  // namespace dsinfer
