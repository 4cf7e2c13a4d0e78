// Test helper: a `dsinfer serve` child process (DSINFER_BIN) on a free loopback port, for
// the end-to-end tests of the harness commands and of serving. Its stdout and stderr go to
// a log file; wait_ready() reads the port from the "listening on" line and polls /health.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli_helpers.h"
#include "harness/http_client.h"

namespace dsinfer_test {

// A `dsinfer serve` child on a free port; SIGTERM on destruction.
struct Server {
  pid_t pid = -1;
  int port = 0;
  std::string log;
  explicit Server(std::vector<std::string> args, const std::string& name) {
    log = make_temp_dir("harness_srv_" + name) + "/serve.log";
    std::vector<std::string> argv_s = {DSINFER_BIN, "serve", "--port", "0"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  // Waits for the port line and /health 200; false when the server died or took > 180 s.
  bool wait_ready() {
    for (int i = 0; i < 1800 && pid > 0; ++i) {
      if (port == 0) {
        const std::string text = slurp(log);
        const std::string key = "listening on http://127.0.0.1:";
        const size_t p = text.find(key);
        if (p != std::string::npos) port = std::atoi(text.c_str() + p + key.size());
      }
      if (port && dsinfer::harness::http_get({"127.0.0.1", port}, "/health").status == 200) return true;
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  ~Server() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
};

}  // namespace dsinfer_test
