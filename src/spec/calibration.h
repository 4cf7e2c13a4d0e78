// dsinfer speculation floor: calibration of the DSpark confidence head (drafters_spec.md
// §2.5, §2.8, §2.9; DSpark paper §3.2.1 "Sequential Temperature Scaling").
//
// Data flow:
//   full-block speculative rounds (spec/calibration_runner.h) → one CalibrationRound per
//   round: the raw confidence logits z_1..z_n of the proposed drafts and the number of
//   drafts the target accepted (label_k = 1 iff drafts 1..k were all accepted)
//   → fit_sts: for k = 1..γ in order, T_1..T_{k−1} fixed, pick T_k on a log-spaced grid
//     minimising the 20-bin ECE of â_k = ∏_{i≤k} σ(z_i/T_i) over the rounds with n ≥ k
//   → position_metrics (ECE, exact AUROC, Brier, means) before/after
//   → Calibration → DRAFT_DIR/calibration.json (write_calibration)
//   → at serving time: load_calibration(DRAFT_DIR) → calibrated_survival(cal, z) = â_1..â_n
//     → static_threshold_length(â, τ, cap) = drafts to verify (the engine's
//     --dflash-validation-threshold) and, later, the DSpark prefix scheduler.
// Everything here is pure computation on small vectors (no model, no threads).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsinfer {

// One verified full-block round: logits z_1..z_n (n = drafts proposed, index k−1 holds
// z_k) and the accepted draft prefix length (0..n). label_k = (accepted >= k).
struct CalibrationRound {
  std::vector<float> logits;
  int accepted = 0;
};

// Metrics of one draft position over the rounds that proposed it.
struct PositionMetrics {
  int64_t count = 0;         // rounds with n >= k
  double ece = 0.0;          // 20 equal-width bins on the clamped prediction
  double auroc = 0.0;        // exact (ties ½); NaN when only one class occurs (or count 0)
  double brier = 0.0;        // mean (p − y)²
  double mean_pred = 0.0;    // mean â_k
  double mean_label = 0.0;   // empirical prefix acceptance rate
};

// Prediction clamp and bin count of the reference recorder (§2.8).
constexpr double kCalibrationClamp = 1e-8;
constexpr int kEceBins = 20;

// 20-bin equal-width ECE: p clamped to [1e-8, 1−1e-8], bin = min(floor(p·20), 19),
// ECE = Σ_b (n_b/N)·|mean_pred_b − mean_label_b|. 0 for empty input.
double expected_calibration_error(const std::vector<double>& pred, const std::vector<uint8_t>& label);
// Exact ROC AUC: P(pred of a random positive > pred of a random negative), ties count ½.
// NaN when there are no positives or no negatives.
double auroc_exact(const std::vector<double>& pred, const std::vector<uint8_t>& label);
// All metrics of one set of (prediction, label) pairs (prediction clamped as for ECE).
PositionMetrics compute_metrics(const std::vector<double>& pred, const std::vector<uint8_t>& label);

// Numerically stable logistic function in double.
double sigmoid_d(double z);

// â_k = ∏_{i≤k} σ(z_i/T_i) for k = 1..z.size() (not clamped). Positions beyond
// temperatures.size() use T = 1.
std::vector<double> cumulative_survival(const std::vector<float>& z, const std::vector<double>& temperatures);

// Per position k = 1..gamma: metrics of â_k (with `temperatures`) against label_k over the
// rounds with n >= k.
std::vector<PositionMetrics> position_metrics(const std::vector<CalibrationRound>& rounds,
                                              const std::vector<double>& temperatures, int gamma);

// STS grid. Our choice (the paper leaves it open, §2.9 AMBIGUOUS): `points` values
// log-spaced over [t_min, t_max]; with the defaults (0.25, 4, 101) T = 1 is exactly the
// middle point and neighbours differ by a factor 16^(1/100) ≈ 1.028.
struct StsOptions {
  double t_min = 0.25, t_max = 4.0;
  int points = 101;
};
std::vector<double> sts_grid(const StsOptions& opts = {});

// Sequential Temperature Scaling: T_1..T_gamma. Ties (ECE within 1e-12) go to the T with
// the smallest |log T| (closest to 1); positions without data keep T = 1.
std::vector<double> fit_sts(const std::vector<CalibrationRound>& rounds, int gamma, const StsOptions& opts = {});

// The calibration.json record (version 1).
struct Calibration {
  int version = 1;
  std::string method = "sts";
  std::vector<double> temperatures;  // T_1..T_γ
  int block_size = 0;                // verify block size the rounds used (CLI --block-size)
  double sampling_temperature = 0.0; // generation temperature of the rounds (0 = greedy)
  int64_t rounds = 0;                // rounds the fit used
  // Per position (length γ, NaN = no data, written as null): 20-bin ECE of â_k with
  // T = 1 and with the fitted temperatures, and the exact AUROC of the calibrated â_k, all
  // on the fit rounds. auroc_before (extra field) is the AUROC with T = 1.
  std::vector<double> ece_before, ece_after, auroc, auroc_before;
  // Held-out split (extra fields, written only when heldout_rounds > 0).
  int64_t heldout_rounds = 0;
  std::vector<double> heldout_ece_before, heldout_ece_after, heldout_auroc;
  // drafter_fingerprint(draft_dir) of the checkpoint that produced the rounds.
  std::string drafter_fingerprint;
};

// "sha256:<hex>" of DIR/config.json's bytes followed by the name and byte size of every
// *.safetensors / *.safetensors.index.json file in DIR (sorted by name). Cheap (no weight
// bytes are read) and changes when the config or any weight file's size changes.
std::string drafter_fingerprint(const std::string& draft_dir);

// JSON text of a calibration (NaN → null), pretty-printed with a trailing newline.
std::string calibration_to_json(const Calibration& c);
// Parses and validates calibration JSON; `file` names the source in errors
// ("FILE: field 'temperatures': ..."). Throws Error.
Calibration parse_calibration(const std::string& text, const std::string& file);
// Writes calibration_to_json to `path`; throws Error naming the path.
void write_calibration(const std::string& path, const Calibration& c);
// Reads and validates `path` (no fingerprint check). Throws Error.
Calibration read_calibration(const std::string& path);
// DRAFT_DIR/calibration.json: nullopt when the file does not exist; throws Error (one
// line naming the file and field) when it is malformed or its drafter_fingerprint does not
// match the checkpoint in DRAFT_DIR.
std::optional<Calibration> load_calibration(const std::string& draft_dir);
std::string calibration_path(const std::string& draft_dir);

// Calibrated prefix survival â_k = ∏_{i≤k} σ(z_i/T_i), k = 1..confidence_logits.size();
// positions beyond the calibrated γ use T = 1.
std::vector<float> calibrated_survival(const Calibration& cal, const std::vector<float>& confidence_logits);

// Drafts to verify under a static threshold τ on the survival probabilities: the index of
// the first k (0-based) with survival[k] < τ (NaN counts as below), or all of them; at
// most `cap` (cap < 0: no cap). τ <= 0 keeps everything. Non-anticipating: whether draft
// k is kept depends only on survival[0..k].
int static_threshold_length(const std::vector<float>& survival, float threshold, int cap);

}  // namespace dsinfer
