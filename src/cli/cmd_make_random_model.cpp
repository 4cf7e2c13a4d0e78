// dsinfer CLI: `dsinfer make-random-model`. Writes a synthetic Qwen3 checkpoint with the
// shape of a published model (random N(0, 0.02) weights, unit norms) for benchmarks such
// as bench-model; the work is model/random_model.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "model/random_model.h"

namespace dsinfer::cli {

Runner register_make_random_model(CLI::App& app) {
  struct Args {
    std::string like = "tiny", dtype = "bf16", out;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("make-random-model", "Write a random-weight Qwen3 checkpoint (for benchmarks)");
  sub->add_option("--like", a->like, "Shape preset: qwen3-0.6b | qwen3-4b | tiny")->capture_default_str();
  sub->add_option("--dtype", a->dtype, "Weight dtype: bf16 | f32")->capture_default_str();
  sub->add_option("--out", a->out, "Output directory")->required();
  sub->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  return [a] {
    DType dt;
    if (a->dtype == "bf16") dt = DType::BF16;
    else if (a->dtype == "f32") dt = DType::F32;
    else throw Error("--dtype '" + a->dtype + "': expected bf16 or f32");
    write_random_model(random_model_preset(a->like), dt, a->out, a->seed);
    std::printf("wrote %s (%s, %s)\n", a->out.c_str(), a->like.c_str(), a->dtype.c_str());
    return 0;
  };
}

}  // namespace dsinfer::cli
