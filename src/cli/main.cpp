// dsinfer: the single binary. Dispatches to the subcommands registered in commands.h.
// Any dsinfer::Error escaping a subcommand becomes one line on stderr and exit code 1.
#include <CLI/CLI.hpp>
#include <malloc.h>

#include <cstdio>
#include <exception>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
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
  add(dsinfer::cli::register_bench);
  add(dsinfer::cli::register_tune);
  add(dsinfer::cli::register_check_env);
  add(dsinfer::cli::register_cache_stats);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
