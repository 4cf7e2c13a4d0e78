// dsinfer server floor: the JSON-lines request recorder (see request_log.h).
#include "server/request_log.h"

#include <cstdio>

#include "core/error.h"

namespace dsinfer::server {

RequestLog::RequestLog(const std::string& path) : out_(path, std::ios::out | std::ios::app), path_(path) {
  if (!out_) throw Error("--record-requests: cannot open '" + path + "' for appending");
}

void RequestLog::write(const nlohmann::json& record) {
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard<std::mutex> lock(mu_);
  out_ << line << '\n';
  out_.flush();
  if (!out_) {
    // A full disk must not take the server down; say it once.
    static bool warned = false;
    if (!warned) std::fprintf(stderr, "serve: warning: --record-requests: write to '%s' failed\n", path_.c_str());
    warned = true;
    out_.clear();
  }
}

}  // namespace dsinfer::server
