// PLACEHOLDER during bring-up: replaced by the real subcommand.
#include <CLI/CLI.hpp>
#include "cli/commands.h"
#include "core/error.h"
namespace dsinfer::cli {
Runner register_bench_model(CLI::App& app) {
  app.add_subcommand("bench-model", "(not yet implemented)");
  return [] { throw Error("not yet implemented"); return 1; };
}
}  // namespace dsinfer::cli
