// dsinfer CLI: options shared by several subcommands (see commands.h).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

void add_matmul_precision_option(CLI::App* sub, std::string* dest) {
  sub->add_option("--matmul-precision", *dest,
                  "Matmul arithmetic for BF16 weights: bf16 (activations rounded to BF16, fast), f32 (exact F32 "
                  "activations), auto (DSINFER_MATMUL if set, else bf16)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
}

void add_top_p_option(CLI::App* sub, float* dest, const std::string& help) {
  sub->add_option("--top-p", *dest, help)
      ->check(CLI::Validator(
          [](std::string& in) {
            float v = 0.0f;
            try {
              v = std::stof(in);
            } catch (...) {
              return std::string("must be a number in (0, 1]");
            }
            return v > 0.0f && v <= 1.0f ? std::string() : "must be in (0, 1], got " + in;
          },
          "(0, 1]"));
}

void add_draft_vocab_options(CLI::App* sub, int* size, std::string* file) {
  sub->add_option("--draft-vocab", *size,
                  "Draft from the N most frequent token ids only (lossless: the target verifies against its whole "
                  "vocabulary; the drafter's LM head and Markov head cost N/V). 0 = the whole vocabulary; default: "
                  "the ranking's default_size (draft_vocab.json in the drafter's or the target's directory), else all")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--draft-vocab-file", *file,
                  "Token frequency ranking for --draft-vocab (made by dsinfer draft-vocab; default: draft_vocab.json "
                  "in the drafter's directory, else in the target's)");
}

void apply_matmul_precision(const std::string& value) {
  if (value == "f32") {
    set_matmul_precision(MatmulPrecision::F32);
  } else if (value == "bf16") {
    set_matmul_precision(MatmulPrecision::Bf16Dot);
  } else if (value.empty() || value == "auto") {
    const char* env = std::getenv("DSINFER_MATMUL");
    if (!env || !*env) set_matmul_precision(MatmulPrecision::Bf16Dot);
    // else: matmul_precision() reads DSINFER_MATMUL (and rejects bad values) itself.
    (void)matmul_precision();
  } else {
    throw Error("--matmul-precision: '" + value + "' is not auto, f32 or bf16");
  }
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& model_dir, const Model& model) {
  const std::string path = (std::filesystem::path(model_dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(path)) return nullptr;
  auto tok = Tokenizer::load(model_dir);
  const int64_t model_vocab = model.config().vocab_size;
  if (tok->vocab_size() > model_vocab)
    throw Error(path + ": the tokenizer has " + std::to_string(tok->vocab_size()) + " token ids but the model's vocabulary " +
                "(config.json vocab_size) holds " + std::to_string(model_vocab) + "; the tokenizer belongs to another model");
  return tok;
}

}  // namespace dsinfer::cli
