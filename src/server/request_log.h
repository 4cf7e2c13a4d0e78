// dsinfer server floor: --record-requests FILE — one JSON line per finished request, so a
// recorded workload can be replayed later (`dsinfer bench-engine --prompts FILE` reads the
// "prompt_ids" field today; the load generator and tuner read the rest).
//
// Line format: {"endpoint", "prompt_ids", "messages" | "prompt", "params": {max_tokens,
// temperature, top_p, top_k, stream, stop, seed?}, "arrival_unix_s", "ttft_s", "e2e_s",
// "prompt_tokens", "completion_tokens", "finish_reason"}. Times are seconds; ttft_s is
// null when no token was produced.
#pragma once
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace dsinfer::server {

class RequestLog {
 public:
  // Opens (appends to) path; throws Error naming --record-requests when it cannot.
  explicit RequestLog(const std::string& path);
  // Writes one line and flushes (thread-safe).
  void write(const nlohmann::json& record);

 private:
  std::mutex mu_;
  std::ofstream out_;
  std::string path_;
};

}  // namespace dsinfer::server
