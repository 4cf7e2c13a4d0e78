// dsinfer server floor: the --log-dflash-details round writer (see dflash_log.h).
#include "server/dflash_log.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/speculative.h"

namespace dsinfer::server {

std::string engine_round_json(const EngineRound& r) {
  using nlohmann::json;
  // The round's own fields come from spec_round_json (generate's format, same names); the
  // serve fields go before and after it in the same object.
  json head;
  head["request_id"] = r.log_id.empty() ? json(nullptr) : json(r.log_id);
  head["engine_request_id"] = r.request_id;
  head["step"] = r.step;
  head["batch"] = r.batch;
  json tail;
  tail["drafted_ids"] = r.drafted_ids;
  json conf = json::array();
  for (float c : r.drafted_confidences) conf.push_back(std::isfinite(c) ? json(c) : json());
  tail["drafted_confidences"] = std::move(conf);
  tail["step_ms"] = r.step_ms;
  const std::string h = head.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string m = spec_round_json(r.round);
  const std::string t = tail.dump();
  // "{h...}" + "{m...}" + "{t...}" -> "{h..., m..., t...}" (none of the three is empty).
  return h.substr(0, h.size() - 1) + "," + m.substr(1, m.size() - 2) + "," + t.substr(1);
}

DflashDetailsLog::DflashDetailsLog(const std::string& path) : out_(path, std::ios::out | std::ios::app), path_(path) {
  if (!out_) throw Error("--log-dflash-details: cannot open '" + path + "' for appending");
}

void DflashDetailsLog::write_step(const std::vector<EngineRound>& rounds) {
  std::string text;
  for (const EngineRound& r : rounds) {
    text += engine_round_json(r);
    text += '\n';
  }
  std::lock_guard<std::mutex> lock(mu_);
  out_ << text;
  out_.flush();
  if (!out_) {
    if (!warned_) std::fprintf(stderr, "serve: warning: --log-dflash-details: write to '%s' failed\n", path_.c_str());
    warned_ = true;
    out_.clear();
  }
}

}  // namespace dsinfer::server
