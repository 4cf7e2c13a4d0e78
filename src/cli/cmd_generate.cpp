// PLACEHOLDER during bring-up: replaced by the real subcommand.
#include <CLI/CLI.hpp>
#include "cli/commands.h"
#include "core/error.h"
namespace dsinfer::cli {
Runner register_generate(CLI::App& app) {
  app.add_subcommand("generate", "(not yet implemented)");
  return [] { throw Error("not yet implemented"); return 1; };
}
}  // namespace dsinfer::cli
