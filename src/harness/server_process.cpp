// dsinfer harness: spawning, watching and stopping our own server (see server_process.h).
#include "harness/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/mapped_file.h"
#include "harness/load_client.h"

extern char** environ;

namespace dsinfer::harness {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot resolve /proc/self/exe (needed to start our own server)");
  return std::string(buf, static_cast<size_t>(n));
}

std::string last_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

ManagedServer::ManagedServer(const std::vector<std::string>& serve_args, const std::string& log_path,
                             double ready_timeout_s, const std::string& api_key)
    : log_path_(log_path) {
  argv_ = {self_exe(), "serve", "--host", "127.0.0.1", "--port", "0"};
  argv_.insert(argv_.end(), serve_args.begin(), serve_args.end());
  if (!api_key.empty()) argv_.insert(argv_.end(), {"--api-key", api_key});
  std::vector<char*> argv;
  for (std::string& s : argv_) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // The child must not inherit a blocked SIGTERM/SIGINT mask or ignored signals.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const int rc = posix_spawn(&pid_, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    pid_ = -1;
    throw Error("cannot start '" + argv_[0] + " serve' (posix_spawn error " + std::to_string(rc) + ")");
  }
  const double deadline = now_s() + ready_timeout_s;
  const auto exited = [&]() {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    return false;
  };
  const auto fail = [&](const std::string& why) {
    const std::string last = last_line_of(log_path_);
    stop(5);
    return Error("our server (" + command_line() + ") " + why + (last.empty() ? "" : ": " + last) + " (log: " + log_path_ + ")");
  };
  // 1. The port, from the log line the server prints once it is bound.
  int port = 0;
  while (port == 0) {
    std::ifstream in(log_path_);
    std::string line;
    while (std::getline(in, line)) {
      const std::string key = "listening on http://127.0.0.1:";
      const size_t p = line.find(key);
      if (p != std::string::npos) port = std::atoi(line.c_str() + p + key.size());
    }
    if (port) break;
    if (exited()) throw fail("exited before listening");
    if (now_s() > deadline) throw fail("did not start listening within " + std::to_string(static_cast<int>(ready_timeout_s)) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  url_.host = "127.0.0.1";
  url_.port = port;
  // 2. Ready: /health 200 (model loaded, SPS profiled, warmed up).
  HttpOptions ho;
  ho.connect_timeout_s = 2;
  ho.read_timeout_s = 5;
  while (true) {
    if (http_get(url_, "/health", ho).status == 200) break;
    if (exited()) throw fail("exited while loading");
    if (now_s() > deadline) throw fail("was not ready within " + std::to_string(static_cast<int>(ready_timeout_s)) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

ManagedServer::~ManagedServer() {
  if (pid_ > 0) stop(30);
}

std::string ManagedServer::command_line() const {
  std::string s = "dsinfer";
  for (size_t i = 1; i < argv_.size(); ++i) s += " " + argv_[i];
  return s;
}

double ManagedServer::peak_rss_bytes() const {
  if (pid_ <= 0) return kNaN;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, 6, "VmHWM:") == 0) return std::atof(line.c_str() + 6) * 1024.0;
  return kNaN;
}

double ManagedServer::cpu_seconds() const {
  if (pid_ <= 0) return kNaN;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t rp = s.rfind(')');  // the command name may hold spaces
  if (rp == std::string::npos) return kNaN;
  std::istringstream f(s.substr(rp + 2));
  std::string tok;
  double utime = 0, stime = 0;
  for (int field = 3; f >> tok; ++field) {  // field 3 is the state
    if (field == 14) utime = std::atof(tok.c_str());
    if (field == 15) {
      stime = std::atof(tok.c_str());
      break;
    }
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int ManagedServer::stop(double grace_s) {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  const double deadline = now_s() + grace_s;
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || r < 0) break;
    if (now_s() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace dsinfer::harness
