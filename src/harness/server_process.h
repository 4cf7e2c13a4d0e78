// dsinfer harness: our own `dsinfer serve` as a child process, for `bench --compare` and
// `tune --model-path` (each server mode or restart-only setting needs a fresh server).
//
// Data flow: serve arguments --posix_spawn(this very binary, "serve --host 127.0.0.1
// --port 0 ...")--> child with stdout+stderr in a log file --> the log's "listening on
// http://127.0.0.1:PORT" line gives the port (no free-port race) --> GET /health until 200
// --> the caller benchmarks it, reads its peak RSS and CPU time from /proc/PID --> stop():
// SIGTERM (the server drains), SIGKILL only if it has not exited after the grace period.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "harness/http_client.h"

namespace dsinfer::harness {

// The path of the running binary (/proc/self/exe resolved).
std::string self_exe();

class ManagedServer {
 public:
  // Throws Error (with the last line of the server's log) when the server exits before it
  // is ready or is not ready within ready_timeout_s.
  ManagedServer(const std::vector<std::string>& serve_args, const std::string& log_path, double ready_timeout_s,
                const std::string& api_key = "");
  ~ManagedServer();
  ManagedServer(const ManagedServer&) = delete;
  ManagedServer& operator=(const ManagedServer&) = delete;

  BaseUrl url() const { return url_; }
  pid_t pid() const { return pid_; }
  // The command line it was started with (for reports).
  std::string command_line() const;
  // VmHWM (peak resident set) in bytes; NaN when the process is gone.
  double peak_rss_bytes() const;
  // User + system CPU seconds so far; NaN when the process is gone.
  double cpu_seconds() const;
  // SIGTERM, wait up to grace_s, then SIGKILL. Returns the exit code (-1: killed by a signal).
  int stop(double grace_s = 30);

 private:
  std::vector<std::string> argv_;
  std::string log_path_;
  pid_t pid_ = -1;
  BaseUrl url_;
};

// The last non-empty line of a file ("" when unreadable).
std::string last_line_of(const std::string& path);

}  // namespace dsinfer::harness
