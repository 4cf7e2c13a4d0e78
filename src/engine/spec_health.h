// dsinfer engine: per-request speculation health — the self-healing fallback to plain
// decoding and the dynamic drafter window (--dspark-dsw-min-window / --dspark-dsw-max-window).
//
// Data flow: after every verified round of a request the engine calls observe() with the
// drafts it verified and how many were accepted; before drafting it asks drafting_allowed()
// and window(). Nothing here touches tokens, so it cannot affect what a request outputs
// (losslessness holds whatever it decides); it only decides whether a drafter pass is spent
// on the request and how much committed context the drafter attends to.
//
// Self-healing: a round "fails" when its acceptance (accepted / verified drafts) is below
// min_acceptance. After collapse_rounds consecutive failures the request falls back to plain
// decoding (counted in fallbacks(), reported once through the returned event so the engine
// can log it) for reprobe_steps steps, then drafts again; each further collapse doubles the
// pause up to max_reprobe_steps, and a healthy round resets it. The article's rule ("5
// consecutive rounds with validation failures over 5%") is this with the failure measured as
// the acceptance of the round: a round with any accepted draft is not a collapse.
//
// Dynamic window: an exponential moving average of round acceptance drives the window
// between min and max (both 0 = off: the drafter's configured window). Good acceptance
// shrinks the window (less drafter attention per round; recent context is what predicts the
// next tokens), poor acceptance grows it back towards max (more context to draft from).
#pragma once
#include <cstdint>

namespace dsinfer {

struct SpecHealthOptions {
  // Self-healing (collapse_rounds = 0: off).
  int collapse_rounds = 5;
  double min_acceptance = 0.05;
  int reprobe_steps = 32;
  int max_reprobe_steps = 512;
  // Dynamic window (0, 0: off). min_window <= max_window when on.
  int min_window = 0;
  int max_window = 0;
  double ema_alpha = 0.25;     // weight of the newest round in the acceptance average
  double shrink_above = 0.70;  // average acceptance above which the window halves
  double grow_below = 0.40;    // ... below which it doubles
};

// What observe() reports to the caller (for its log and metrics).
enum class HealthEvent { None, FellBack, Resumed };

class SpecHealth {
 public:
  explicit SpecHealth(const SpecHealthOptions& opts = {});

  // A verified round: `verified` drafts, `accepted` of them accepted (accepted <= verified).
  // Rounds with verified == 0 carry no evidence and are ignored.
  HealthEvent observe(int verified, int accepted);
  // Called once per engine step in which the request decodes; counts down a fallback.
  // Returns Resumed on the step drafting becomes allowed again.
  HealthEvent tick();

  bool drafting_allowed() const { return pause_left_ == 0; }
  int window() const { return window_; }  // 0 = the drafter's configured window
  uint64_t fallbacks() const { return fallbacks_; }
  double mean_acceptance() const { return ema_; }

 private:
  SpecHealthOptions o_;
  int failures_ = 0;      // consecutive failed rounds
  int pause_left_ = 0;    // steps of plain decoding left
  int next_pause_ = 0;    // pause length of the next collapse
  int window_ = 0;
  double ema_ = -1.0;     // < 0: no round yet
  uint64_t fallbacks_ = 0;
};

// One-line Error naming the option when the bounds are inconsistent.
void validate_spec_health_options(const SpecHealthOptions& o);

}  // namespace dsinfer
