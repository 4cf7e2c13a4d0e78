// dsinfer: the single binary. Dispatches to the subcommands registered in commands.h.
// Any dsinfer::Error escaping a subcommand becomes one line on stderr and exit code 1.
// A command line CLI11 rejects (unknown flag, bad or missing value, missing required flag)
// becomes one line too, "dsinfer: error: SUBCOMMAND: --FLAG: what is wrong (see ... --help)",
// and exit code 2; --help / --version print to stdout and exit 0.
#include <CLI/CLI.hpp>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <exception>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

namespace {

// CLI11's message for a rejected command line, as one line that starts with the flag when
// CLI11 names one ("--url is required" -> "--url: required"; "The following argument was
// not expected: --bogus" -> "--bogus: unknown flag").
std::string one_line_parse_error(const CLI::ParseError& e, bool at_root, int argc, char** argv) {
  std::string msg = e.what();
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  while (!msg.empty() && msg.back() == ' ') msg.pop_back();
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    // The unexpected words, in command-line order (CLI11 lists them in reverse).
    const size_t colon = msg.find(": ");
    std::istringstream words(colon == std::string::npos ? msg : msg.substr(colon + 2));
    std::vector<std::string> extras;
    for (std::string w; words >> w;) extras.push_back(w);
    const auto position = [&](const std::string& w) {
      for (int i = 1; i < argc; ++i)
        if (w == argv[i]) return i;
      return argc;
    };
    std::stable_sort(extras.begin(), extras.end(),
                     [&](const std::string& x, const std::string& y) { return position(x) < position(y); });
    std::string flags, others;
    int nflags = 0;
    for (const std::string& w : extras) {
      if (w.size() > 1 && w[0] == '-' && !std::isdigit(static_cast<unsigned char>(w[1])) && w[1] != '.') {
        flags += (nflags++ ? ", " : "") + w;  // an unknown flag; words after it are its value
      } else {
        others += (others.empty() ? "" : " ") + w;
      }
    }
    if (nflags) return flags + (nflags > 1 ? ": unknown flags" : ": unknown flag");
    if (at_root) return extras.empty() ? msg : extras[0] + ": unknown command";
    return others + (extras.size() > 1 ? ": unexpected arguments" : ": unexpected argument");
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    // "--concurrency: 1 required TEXT missing" (the flag given last, without its value).
    std::istringstream in(msg);
    std::string flag, n, req, type, missing, more;
    if (in >> flag >> n >> req >> type >> missing && !(in >> more) && flag.size() > 2 && flag[0] == '-' &&
        flag.back() == ':' && req == "required" && missing == "missing")
      return flag + " needs a value (" + type + ")";
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e)) {
    if (msg == "A subcommand is required") {
      // `dsinfer frobnicate`, `dsinfer --bogus`: CLI11 reports the missing command first.
      if (at_root && argc > 1) return std::string(argv[1]) + (argv[1][0] == '-' ? ": unknown flag" : ": unknown command");
      return "a command is required";
    }
    const std::string suffix = " is required";
    if (msg.size() > suffix.size() && msg.compare(msg.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        msg[0] == '-' && msg.find(' ') == msg.size() - suffix.size())
      return msg.substr(0, msg.size() - suffix.size()) + ": required";
  }
  return msg;
}

// Heap memory on transparent huge pages. In a VM a page fault costs microseconds, and the
// engine first-touches megabytes per request (prefill activations, captured drafter rows,
// KV growth): with 4 KB pages bench-engine at concurrency 64 ran 30 % slower and a 435-token
// prefill took 150 ms instead of 70 (AMD EPYC VM, 2026-12-02). glibc (>= 2.35) puts its heap
// on huge pages with the tunable glibc.malloc.hugetlb=1, read only at process start, so the
// process re-executes itself once with it (same pid, same arguments). Skipped when the user
// set that tunable, when THP is off, and with DSINFER_HEAP_THP=0 (e.g. under a debugger);
// any value but 0 or 1 is refused by name.
// Returns false (after printing the one-line error) for a DSINFER_HEAP_THP other than 0/1.
bool reexec_with_huge_page_heap(char** argv) {
  const char* opt = std::getenv("DSINFER_HEAP_THP");
  if (opt && std::strcmp(opt, "0") != 0 && std::strcmp(opt, "1") != 0) {
    std::fprintf(stderr, "dsinfer: error: DSINFER_HEAP_THP must be 0 or 1, not '%s'\n", opt);
    return false;
  }
  if (opt && std::strcmp(opt, "0") == 0) return true;
  if (std::getenv("DSINFER_HEAP_THP_DONE")) return true;  // this is the re-executed process
  const char* tun = std::getenv("GLIBC_TUNABLES");
  if (tun && std::strstr(tun, "glibc.malloc.hugetlb")) return true;
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  if (mode.empty() || mode.find("[never]") != std::string::npos) return true;
  const std::string value = tun && *tun ? std::string(tun) + ":glibc.malloc.hugetlb=1" : "glibc.malloc.hugetlb=1";
  setenv("GLIBC_TUNABLES", value.c_str(), 1);
  setenv("DSINFER_HEAP_THP_DONE", "1", 1);
  execv("/proc/self/exe", argv);
  unsetenv("DSINFER_HEAP_THP_DONE");  // exec failed: carry on with 4 KB pages
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!reexec_with_huge_page_heap(argv)) return 1;
  // Per-step buffers (logits of a verify block, draft logits, activations) are a few hundred
  // KB. glibc serves such blocks with fresh mmap()s by default, so every decode step paid
  // page faults + zeroing for them (~12% of a speculative round on the embedded models,
  // measured with perf). Keep them in the heap, and keep freed heap memory mapped.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  CLI::App app{"dsinfer: LLM inference with lossless DFlash/DSpark speculative decoding"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dsinfer 0.1.0");
  std::vector<std::pair<CLI::App*, dsinfer::cli::Runner>> runners;
  auto add = [&](dsinfer::cli::Runner (*reg)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    auto run = reg(app);
    auto subs = app.get_subcommands({});
    if (subs.size() > before) runners.emplace_back(subs.back(), std::move(run));
  };
  add(dsinfer::cli::register_generate);
  add(dsinfer::cli::register_tokenize);
  add(dsinfer::cli::register_bench_model);
  add(dsinfer::cli::register_make_random_model);
  add(dsinfer::cli::register_calibrate);
  add(dsinfer::cli::register_debug_dflash);
  add(dsinfer::cli::register_bench_engine);
  add(dsinfer::cli::register_serve);
  add(dsinfer::cli::register_draft_vocab);
  add(dsinfer::cli::register_bench);
  add(dsinfer::cli::register_tune);
  add(dsinfer::cli::register_check_env);
  add(dsinfer::cli::register_cache_stats);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --help-all, --version: printed on stdout, exit 0
  } catch (const CLI::ParseError& e) {
    // The subcommand is argv[1]: the root app has no options but --help and --version.
    std::string where;
    for (auto& [sub, run] : runners)
      if (argc > 1 && sub->get_name() == argv[1]) where = sub->get_name();
    const std::string line = one_line_parse_error(e, where.empty(), argc, argv);
    const std::string help = where.empty() ? "dsinfer --help" : "dsinfer " + where + " --help";
    std::fprintf(stderr, "dsinfer: error: %s%s (see %s)\n", where.empty() ? "" : (where + ": ").c_str(), line.c_str(),
                 help.c_str());
    return 2;
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const dsinfer::Error& e) {
    std::fprintf(stderr, "dsinfer: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsinfer: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
