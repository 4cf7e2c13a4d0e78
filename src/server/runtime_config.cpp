// dsinfer server floor: validation of hot-reloaded speculation settings (see
// runtime_config.h). A setting the engine cannot apply at run time is refused with the
// reason, never accepted and ignored.
#include "server/runtime_config.h"

#include <cmath>

#include "server/openai_protocol.h"
#include "tokenizer/utf8.h"

namespace dsinfer::server {

using nlohmann::json;

namespace {
ApiError bad(const std::string& field, const std::string& msg) { return ApiError(400, field + ": " + msg, field); }
}  // namespace

VerifyPolicy parse_policy(const std::string& name) {
  if (name == "fixed") return VerifyPolicy::Fixed;
  if (name == "threshold") return VerifyPolicy::Threshold;
  if (name == "dspark") return VerifyPolicy::DSpark;
  if (name == "dspark-async") return VerifyPolicy::DSparkAsync;
  throw bad("schedule_policy", "must be fixed, threshold, dspark or dspark-async, got \"" + name + "\"");
}

std::string policy_name(VerifyPolicy p) {
  switch (p) {
    case VerifyPolicy::Fixed: return "fixed";
    case VerifyPolicy::Threshold: return "threshold";
    case VerifyPolicy::DSpark: return "dspark";
    case VerifyPolicy::DSparkAsync: return "dspark-async";
  }
  return "fixed";
}

json settings_json(const DflashSettings& s) {
  return {{"window_size", s.window_size},
          {"validation_threshold", s.validation_threshold},
          {"max_reuse_depth", s.max_reuse_depth},
          {"schedule_policy", s.schedule_policy},
          {"admission_policy", s.admission_policy},
          {"async_prefetch", s.async_prefetch}};
}

DflashSettings apply_settings_patch(const DflashSettings& current, std::string_view body_text, const SettingsCaps& caps) {
  const size_t bad_byte = utf8_invalid_offset(body_text);
  if (bad_byte != std::string_view::npos)
    throw ApiError(400, "request body: invalid UTF-8 at byte " + std::to_string(bad_byte));
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("request body: invalid JSON: ") + e.what());
  }
  if (!body.is_object() || body.empty()) throw ApiError(400, "request body: must be a non-empty JSON object of settings");
  DflashSettings s = current;
  for (const auto& [key, v] : body.items()) {
    if (key == "window_size") {
      if (!v.is_number_integer()) throw bad(key, "must be an integer");
      const int64_t w = v.get<int64_t>();
      if (!caps.window_supported) throw bad(key, "the drafter has no context window (or there is no drafter)");
      // The draft context cache keeps the rows of the window it was loaded with, so a
      // request's window can shrink at run time but not grow past it.
      if (caps.configured_window > 0 && (w < 1 || w > caps.configured_window))
        throw bad(key, "must be in [1, " + std::to_string(caps.configured_window) +
                           "] (the window loaded with --dflash-window-size; restart for a larger one), got " + v.dump());
      if (caps.configured_window == 0 && (w < 0 || w > (1 << 24)))
        throw bad(key, "must be in [0, 16777216] (0 = unlimited), got " + v.dump());
      s.window_size = static_cast<int>(w);
    } else if (key == "validation_threshold") {
      if (!v.is_number()) throw bad(key, "must be a number in [0, 1]");
      const double t = v.get<double>();
      if (!(t >= 0.0 && t <= 1.0)) throw bad(key, "must be in [0, 1], got " + v.dump());
      if (t > 0.0 && !caps.confidence_head)
        throw bad(key, "needs a drafter with a confidence head (this server has none)");
      s.validation_threshold = static_cast<float>(t);
    } else if (key == "max_reuse_depth") {
      if (!v.is_number_integer()) throw bad(key, "must be an integer");
      const int64_t d = v.get<int64_t>();
      if (!caps.has_drafter) throw bad(key, "this server runs plain decoding (no drafter)");
      if (d < 1 || d > caps.max_drafts)
        throw bad(key, "must be in [1, " + std::to_string(caps.max_drafts) + "] (the drafter's block), got " + v.dump());
      s.max_reuse_depth = static_cast<int>(d);
    } else if (key == "schedule_policy") {
      if (!v.is_string()) throw bad(key, "must be a string: fixed, threshold, dspark or dspark-async");
      const VerifyPolicy p = parse_policy(v.get<std::string>());
      if (p != VerifyPolicy::Fixed && !caps.confidence_head)
        throw bad(key, v.get<std::string>() + " needs a drafter with a confidence head (this server has none)");
      if (is_dspark_policy(p) && !caps.has_sps) throw bad(key, "dspark needs the SPS(B) profile (not loaded)");
      s.schedule_policy = policy_name(p);
    } else if (key == "admission_policy") {
      if (!v.is_string()) throw bad(key, "must be a string: fcfs, hit-rate, latency-aware or hybrid");
      const std::string name = v.get<std::string>();
      if (name != "fcfs" && name != "hit-rate" && name != "latency-aware" && name != "hybrid")
        throw bad(key, "must be fcfs, hit-rate, latency-aware or hybrid, got \"" + name + "\"");
      s.admission_policy = name;
    } else if (key == "async_prefetch") {
      if (!v.is_boolean()) throw bad(key, "must be a boolean");
      if (v.get<bool>() && !caps.has_drafter) throw bad(key, "this server runs plain decoding (no drafter to prefetch)");
      s.async_prefetch = v.get<bool>();
    } else {
      throw bad(key, "unknown setting (window_size, validation_threshold, max_reuse_depth, schedule_policy, "
                     "admission_policy, async_prefetch)");
    }
  }
  if (s.schedule_policy == "threshold" && s.validation_threshold <= 0.0f)
    throw bad("validation_threshold", "the threshold schedule policy needs a value > 0");
  return s;
}

EngineRuntimeConfig to_engine_config(const DflashSettings& s, const SettingsCaps& caps) {
  EngineRuntimeConfig c;
  c.policy = parse_policy(s.schedule_policy);
  c.validation_threshold = s.validation_threshold;
  c.max_reuse_depth = s.max_reuse_depth >= caps.max_drafts ? -1 : s.max_reuse_depth;
  c.window_size = s.window_size == caps.configured_window ? 0 : s.window_size;  // 0: the loaded window
  // Mapped here rather than by engine/scheduler's parser: this file also builds into the
  // request-parser fuzzer, which does not link the engine.
  c.scheduler_policy = s.admission_policy == "hit-rate"        ? SchedulerPolicy::HitRate
                       : s.admission_policy == "latency-aware" ? SchedulerPolicy::LatencyAware
                       : s.admission_policy == "hybrid"        ? SchedulerPolicy::Hybrid
                                                               : SchedulerPolicy::Fcfs;
  c.async_prefetch = s.async_prefetch && caps.has_drafter;
  return c;
}

}  // namespace dsinfer::server
