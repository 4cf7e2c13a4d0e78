// dsinfer CLI: each subcommand lives in its own cmd_*.cpp file and registers itself
// on the root CLI11 app here. A subcommand parses flags into a settings struct and calls
// one library function; it never holds engine logic of its own.
#pragma once
#include <functional>
#include <memory>
#include <string>

namespace CLI {
class App;
}
namespace dsinfer {
class Model;
class Tokenizer;
}  // namespace dsinfer

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
Runner register_serve(CLI::App& app);
Runner register_draft_vocab(CLI::App& app);
// The harness (src/harness/): load generator, tuner, environment check, cache statistics.
Runner register_bench(CLI::App& app);
Runner register_tune(CLI::App& app);
Runner register_check_env(CLI::App& app);
Runner register_cache_stats(CLI::App& app);

}  // namespace dsinfer::cli

namespace dsinfer::cli {

// --matmul-precision auto|f32|bf16 (kernels/cpu/matmul.h). auto: DSINFER_MATMUL when set,
// else bf16 — activations rounded to BF16 for BF16 weights, native AVX512_BF16 dot products
// (exact emulation elsewhere), ~2.3x faster verify/prefill matmuls; f32 reproduces the
// transformers goldens to 1e-4. Same bits on every CPU for a given precision.
void add_matmul_precision_option(CLI::App* sub, std::string* dest);
// --top-p with its range (0, 1] (CLI11's Range admits 0, which the sampler refuses with a
// message naming the request field; this names the flag).
void add_top_p_option(CLI::App* sub, float* dest, const std::string& help);
void apply_matmul_precision(const std::string& value);

// --draft-vocab N and --draft-vocab-file PATH (spec/draft_vocab.h, DrafterOptions): the
// reduced draft vocabulary. *size stays -1 unless given (the ranking's default_size).
void add_draft_vocab_options(CLI::App* sub, int* size, std::string* file);

// The tokenizer at model_dir/tokenizer.json (nullptr when there is none), refused in one line
// when it can produce ids the model's vocabulary does not hold (a tokenizer copied from
// another model), so a mismatch is named at load and not as a request's out-of-range id.
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& model_dir, const Model& model);

}  // namespace dsinfer::cli
