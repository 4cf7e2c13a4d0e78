// dsinfer CLI: `dsinfer check-env [--verbose] [--model-path DIR] [--json]` — the machine and
// (optionally) a model directory, an availability score and a recommended `dsinfer serve`
// line (harness/env_check.h). Exit 0 when it can run, 1 when it cannot (or on bad input).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "harness/env_check.h"
#ifdef DSINFER_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace dsinfer::cli {

namespace {

struct CheckEnvArgs {
  std::string model_path, draft_model_path;
  bool verbose = false, json = false;
  double prealloc_ratio = 0.7;
};

int run_check_env(const CheckEnvArgs& a) {
  using namespace harness;
#ifdef DSINFER_HAS_CUDA
  const bool cuda = true;
#else
  const bool cuda = false;
#endif
  if (!a.draft_model_path.empty() && a.model_path.empty()) throw Error("--draft-model-path: needs --model-path");
  SystemInfo sys = probe_system(cuda);
#ifdef DSINFER_HAS_CUDA
  // The backend's own view of the device (the CUDA runtime, not nvidia-smi).
  const std::string why = cuda_unavailable_reason();
  sys.cuda_backend = why.empty() ? cuda_device_description() : "unavailable: " + why;
#endif
  ModelCheck m;
  const bool with_model = !a.model_path.empty();
  if (with_model) m = check_model(a.model_path, a.draft_model_path, sys, a.prealloc_ratio);
  const Assessment as = assess(sys, with_model ? &m : nullptr, a.prealloc_ratio);
  if (a.json) std::printf("%s\n", report_json(sys, with_model ? &m : nullptr, as).dump(2).c_str());
  else std::printf("%s", format_report(sys, with_model ? &m : nullptr, as, a.verbose).c_str());
  if (!as.can_run) {
    std::string first;
    for (const std::string& r : as.reasons)
      if (r.compare(0, 6, "fatal:") == 0) {
        first = r.substr(7);
        break;
      }
    std::fprintf(stderr, "dsinfer: error: check-env: cannot run: %s\n", first.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

Runner register_check_env(CLI::App& app) {
  auto a = std::make_shared<CheckEnvArgs>();
  CLI::App* sub = app.add_subcommand("check-env", "CPU/ISA, memory, GPUs and a model directory: can it run, and how");
  sub->add_option("--model-path", a->model_path, "Model directory to check");
  sub->add_option("--draft-model-path", a->draft_model_path, "Drafter directory (default: found next to the model)");
  sub->add_option("--cache-prealloc-ratio", a->prealloc_ratio, "Share of the memory after the weights for the KV pool")
      ->check(CLI::Range(0.01, 1.0));
  sub->add_flag("--verbose", a->verbose, "List every reason behind the score");
  sub->add_flag("--json", a->json, "Print one JSON object");
  return [a] { return run_check_env(*a); };
}

}  // namespace dsinfer::cli
