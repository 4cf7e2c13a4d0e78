// dsinfer CLI: each subcommand lives in its own cmd_*.cpp file and registers itself
// on the root CLI11 app here. A subcommand parses flags into a settings struct and calls
// one library function; it never holds engine logic of its own.
#pragma once
#include <functional>

namespace CLI {
class App;
}

namespace dsinfer::cli {

// Each register_* adds a subcommand and returns the function to run when it is chosen.
// The function returns the process exit code.
using Runner = std::function<int()>;
Runner register_generate(CLI::App& app);
Runner register_tokenize(CLI::App& app);
Runner register_bench_model(CLI::App& app);
Runner register_make_random_model(CLI::App& app);
Runner register_calibrate(CLI::App& app);
Runner register_debug_dflash(CLI::App& app);
Runner register_bench_engine(CLI::App& app);

}  // namespace dsinfer::cli
