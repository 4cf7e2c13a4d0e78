// dsinfer server floor: `serve --log-dflash-details FILE` — one JSON line per speculative
// round of every request the batched engine verifies (EngineOptions::on_rounds), appended.
//
// Line format: generate --log-dflash-details's fields (spec_round_json: round, start, anchor,
// draft_ids, confidences, drafted, verify_len, accepted, next_token, committed, draft_ms,
// verify_ms) preceded by "request_id" (the response id the client sees, e.g. "chatcmpl-…";
// null for the start-up warm-up request), "engine_request_id", "step", "batch" (requests
// verified in that step) and followed by "drafted_ids" / "drafted_confidences" (every draft
// proposed, before the verify policy kept draft_ids) and "step_ms". draft_ms / verify_ms /
// step_ms are the step's, shared by its rounds (see EngineRound in engine/llm_engine.h).
#pragma once
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace dsinfer::server {

// One JSON object (no newline) for a round, in the format above.
std::string engine_round_json(const EngineRound& r);

class DflashDetailsLog {
 public:
  // Opens (appends to) path; throws Error naming --log-dflash-details when it cannot.
  explicit DflashDetailsLog(const std::string& path);
  // Writes one line per round and flushes once (thread-safe; called on the stepping thread,
  // so the JSON is formatted before the lock and the disk sees one write per step). A failed
  // write is reported once on stderr and never stops the server.
  void write_step(const std::vector<EngineRound>& rounds);

 private:
  std::mutex mu_;
  std::ofstream out_;
  std::string path_;
  bool warned_ = false;
};

}  // namespace dsinfer::server
