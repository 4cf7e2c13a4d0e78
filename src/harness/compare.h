// dsinfer harness: `bench --compare` — the article's table, made by starting our own server
// once per mode (plain, DFlash, DFlash + DSpark) and running the same workload against each.
//
// Data flow: CompareOptions --modes_for--> one `dsinfer serve` argument list per mode -->
// for each mode: ManagedServer (fresh process, own port) --run_bench--> levels, each with
// the process's peak RSS and CPU utilisation --stop (SIGTERM)--> CompareReport. A mode whose
// server cannot start (e.g. no drafter with a confidence head for DSpark) is reported with
// its error and no levels; the others still run.
#pragma once
#include <string>
#include <vector>

#include "harness/bench_runner.h"
#include "harness/report.h"

namespace dsinfer::harness {

struct ServeMode {
  std::string name;               // "plain", "dflash", "dflash+dspark"
  std::vector<std::string> args;  // after "serve --host 127.0.0.1 --port 0"
};

struct CompareOptions {
  BenchOptions bench;             // url is filled per mode
  std::string model_path;         // "": the embedded set
  std::string draft_model_path;   // DSpark drafter ("": embedded dspark)
  std::string dflash_model_path;  // DFlash drafter ("": embedded dflash, else draft_model_path with the fixed schedule)
  std::vector<std::string> modes = {"plain", "dflash", "dflash+dspark"};
  std::vector<std::string> serve_args;  // appended to every mode (e.g. --threads 2)
  std::string out_dir;            // server logs go here
  double ready_timeout_s = 600;
};

// $DSINFER_EMBEDDED_DIR, else <binary>/../models/embedded, else ./models/embedded ("" when
// none has target/config.json).
std::string find_embedded_models_dir();

// The serve arguments of each requested mode. Throws Error naming --modes for an unknown
// mode, --model-path when no model can be found.
std::vector<ServeMode> modes_for(const CompareOptions& o);

// Runs every mode; `errors` receives "mode: message" for modes that could not run.
CompareReport run_compare(const CompareOptions& o, std::vector<std::string>& errors);

}  // namespace dsinfer::harness
