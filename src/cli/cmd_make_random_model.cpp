// dsinfer CLI: `dsinfer make-random-model`. Writes a synthetic Qwen3 checkpoint with the
// shape of a published model (random N(0, 0.02) weights, unit norms) for benchmarks such
// as bench-model; the work is model/random_model.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "model/random_model.h"
#include "tokenizer/tokenizer.h"

#include <filesystem>

namespace dsinfer::cli {

Runner register_make_random_model(CLI::App& app) {
  struct Args {
    std::string like = "tiny", dtype = "bf16", out, tokenizer;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("make-random-model", "Write a random-weight Qwen3 checkpoint (for benchmarks)");
  sub->add_option("--like", a->like, "Shape preset: qwen3-0.6b | qwen3-1.7b | qwen3-4b | tiny")->capture_default_str();
  sub->add_option("--dtype", a->dtype, "Weight dtype: bf16 | f32")->capture_default_str();
  sub->add_option("--out", a->out, "Output directory")->required();
  sub->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  sub->add_option("--tokenizer", a->tokenizer,
                  "Directory with tokenizer.json (+ tokenizer_config.json): copied into --out; the "
                  "vocabulary size and end-of-sequence ids follow it");
  return [a] {
    DType dt;
    if (a->dtype == "bf16") dt = DType::BF16;
    else if (a->dtype == "f32") dt = DType::F32;
    else throw Error("--dtype '" + a->dtype + "': expected bf16 or f32");
    ModelConfig cfg = random_model_preset(a->like);
    if (!a->tokenizer.empty()) {
      auto tok = Tokenizer::load(a->tokenizer);
      cfg.vocab_size = tok->vocab_size();
      cfg.eos_token_ids.clear();
      cfg.bos_token_id = -1;
      for (const char* name : {"<|im_end|>", "<|endoftext|>"})
        if (auto id = tok->token_to_id(name)) cfg.eos_token_ids.push_back(*id);
      if (!tok->eos_token().empty())
        if (auto id = tok->token_to_id(tok->eos_token()))
          if (std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), *id) == cfg.eos_token_ids.end())
            cfg.eos_token_ids.push_back(*id);
    }
    write_random_model(cfg, dt, a->out, a->seed);
    if (!a->tokenizer.empty()) {
      namespace fs = std::filesystem;
      for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
        fs::path src = fs::path(a->tokenizer) / f, dst = fs::path(a->out) / f;
        if (fs::exists(src) && (!fs::exists(dst) || !fs::equivalent(src, dst)))
          fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
      }
    }
    std::printf("wrote %s (%s, %s)\n", a->out.c_str(), a->like.c_str(), a->dtype.c_str());
    return 0;
  };
}

}  // namespace dsinfer::cli
