// Test helpers for end-to-end CLI tests: run the built `dsinfer` binary with arguments,
// capture stdout, stderr and the exit code (no shell involved, so arguments need no
// quoting), and make scratch directories.
#pragma once
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace dsinfer_test {

struct RunResult {
  int exit_code = -1;  // -1: did not exit normally (signal)
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline RunResult run_dsinfer(const std::vector<std::string>& args, const std::string& stdin_text = "") {
  static int counter = 0;
  std::string base = std::filesystem::temp_directory_path().string() + "/dsinfer_cli_" +
                     std::to_string(::getpid()) + "_" + std::to_string(counter++);
  std::string out_path = base + ".out", err_path = base + ".err", in_path = base + ".in";
  { std::ofstream(in_path) << stdin_text; }
  std::vector<std::string> argv_s = {DSINFER_BIN};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, in_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  RunResult r;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  }
  posix_spawn_file_actions_destroy(&fa);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  std::remove(in_path.c_str());
  return r;
}

inline std::string make_temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("dsinfer_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  if (!s.empty() && s.back() != '\n') n++;
  return n;
}

}  // namespace dsinfer_test
