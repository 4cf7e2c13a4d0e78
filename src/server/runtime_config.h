// dsinfer server floor: GET / POST /api/v1/config/dflash — the speculation settings a
// running server can change without a restart.
//
// Data flow: POST body --apply_settings_patch--> a validated copy of the current settings
// (any invalid or unsupported field: ApiError 400 naming it, and nothing changes) -->
// the server hands the engine part to LLMEngine::set_runtime_config (applied at the next
// step) and logs the change; GET returns settings_json of what is in force.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "engine/llm_engine.h"

namespace dsinfer::server {

struct DflashSettings {
  int window_size = 0;                 // drafter context window (0 = unlimited)
  float validation_threshold = 0.0f;   // 0 = off
  int max_reuse_depth = 0;             // drafts verified per round, <= the drafter's block
  std::string schedule_policy = "fixed";  // fixed | threshold | dspark
  std::string admission_policy = "fcfs";  // fcfs | hit-rate | latency-aware | hybrid (engine/scheduler.h)
  bool async_prefetch = false;         // drafting overlaps verification (EngineOptions::async_prefetch)
};

// What this server's engine can do (limits of a patch).
struct SettingsCaps {
  bool has_drafter = false;
  bool confidence_head = false;  // threshold / dspark need it
  bool has_sps = false;          // dspark needs the profiled SPS(B) curve
  int max_drafts = 0;            // the drafter's block (max_reuse_depth upper bound)
  bool window_supported = false; // the drafter has a context window (DFlash / DSpark)
  int configured_window = 0;     // --dflash-window-size at load (0 = unlimited): the upper bound
};

nlohmann::json settings_json(const DflashSettings& s);

// Applies a JSON object of changes to `current`; throws ApiError 400 (field named) on a
// malformed body, an unknown field, a wrong type, an out-of-range value, or a setting this
// engine cannot honour. Returns the settings to put in force.
DflashSettings apply_settings_patch(const DflashSettings& current, std::string_view body, const SettingsCaps& caps);

VerifyPolicy parse_policy(const std::string& name);
std::string policy_name(VerifyPolicy p);
// The engine part of the settings.
EngineRuntimeConfig to_engine_config(const DflashSettings& s, const SettingsCaps& caps);

}  // namespace dsinfer::server
