// dsinfer engine: per-request speculation health (see spec_health.h).
#include "engine/spec_health.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace dsinfer {

void validate_spec_health_options(const SpecHealthOptions& o) {
  if (o.collapse_rounds < 0) throw Error("--dspark-self-heal-rounds: must be >= 0, got " + std::to_string(o.collapse_rounds));
  if (!(o.min_acceptance >= 0.0 && o.min_acceptance <= 1.0))
    throw Error("self-healing min acceptance: must be in [0, 1], got " + std::to_string(o.min_acceptance));
  if (o.reprobe_steps < 1 || o.max_reprobe_steps < o.reprobe_steps)
    throw Error("self-healing re-probe steps: need 1 <= reprobe_steps <= max_reprobe_steps");
  if (o.min_window < 0 || o.max_window < 0)
    throw Error("--dspark-dsw-min-window / --dspark-dsw-max-window: must be >= 0");
  if ((o.min_window == 0) != (o.max_window == 0))
    throw Error("--dspark-dsw-min-window / --dspark-dsw-max-window: give both or neither");
  if (o.min_window > o.max_window)
    throw Error("--dspark-dsw-min-window (" + std::to_string(o.min_window) + ") is above --dspark-dsw-max-window (" +
                std::to_string(o.max_window) + ")");
  if (!(o.ema_alpha > 0.0 && o.ema_alpha <= 1.0)) throw Error("dynamic window: ema_alpha must be in (0, 1]");
  if (!(o.grow_below <= o.shrink_above)) throw Error("dynamic window: grow_below must be <= shrink_above");
}

SpecHealth::SpecHealth(const SpecHealthOptions& opts) : o_(opts) {
  validate_spec_health_options(o_);
  next_pause_ = o_.reprobe_steps;
  window_ = o_.max_window;  // start with the most context, shrink when it is not needed
}

HealthEvent SpecHealth::observe(int verified, int accepted) {
  if (verified <= 0) return HealthEvent::None;
  accepted = std::clamp(accepted, 0, verified);
  const double rate = static_cast<double>(accepted) / verified;
  ema_ = ema_ < 0 ? rate : (1.0 - o_.ema_alpha) * ema_ + o_.ema_alpha * rate;
  if (o_.max_window > 0) {
    if (ema_ > o_.shrink_above) window_ = std::max(o_.min_window, window_ / 2);
    else if (ema_ < o_.grow_below) window_ = std::min(o_.max_window, std::max(1, window_) * 2);
  }
  if (o_.collapse_rounds == 0) return HealthEvent::None;
  if (rate >= o_.min_acceptance && accepted > 0) {
    failures_ = 0;
    next_pause_ = o_.reprobe_steps;  // healthy again: the next collapse starts the back-off anew
    return HealthEvent::None;
  }
  if (++failures_ < o_.collapse_rounds) return HealthEvent::None;
  failures_ = 0;
  pause_left_ = next_pause_;
  next_pause_ = std::min(o_.max_reprobe_steps, next_pause_ * 2);
  ++fallbacks_;
  return HealthEvent::FellBack;
}

HealthEvent SpecHealth::tick() {
  if (pause_left_ == 0) return HealthEvent::None;
  return --pause_left_ == 0 ? HealthEvent::Resumed : HealthEvent::None;
}

}  // namespace dsinfer
