// The shipped default model (models/embedded/target, trained by tools/train/): it loads
// with its tokenizer, its held-out code prompts decode deterministically, and n-gram
// speculation reproduces plain greedy decoding exactly on them. (Drafter checks join
// when the trained DFlash/DSpark drafters ship: issue 4.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "spec/ngram_drafter.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;

TEST(EmbeddedModel, LoadsAndNgramSpeculationIsLosslessOnHeldOutCode) {
  const std::string dir = std::string(DSINFER_SOURCE_DIR) + "/models/embedded/target";
  if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " absent";
  auto model = load_model(dir);
  auto tok = Tokenizer::load(dir);
  EXPECT_EQ(model->config().vocab_size, tok->vocab_size());
  std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/models/eval/heldout_code.jsonl");
  ASSERT_TRUE(in) << "models/eval/heldout_code.jsonl missing";
  NgramDrafter ngram(NgramOptions{});
  SpecOptions so;
  so.drafter = &ngram;
  int prompts = 0;
  int64_t accepted = 0;
  for (std::string line; std::getline(in, line) && prompts < 6;) {
    auto ids = tok->encode(nlohmann::json::parse(line).at("prompt").get<std::string>(), false);
    if (ids.size() > 96) ids.resize(96);
    StopConditions stop;
    stop.max_tokens = 32;
    SamplingParams greedy;
    auto plain = generate(*model, tok.get(), ids, greedy, stop);
    auto spec = generate(*model, tok.get(), ids, greedy, stop, {}, so);
    EXPECT_EQ(spec.ids, plain.ids) << "prompt " << prompts;
    EXPECT_EQ(spec.text, plain.text);
    EXPECT_FALSE(plain.text.empty());
    for (auto a : spec.spec.accepted) accepted += a;
    prompts++;
  }
  EXPECT_EQ(prompts, 6);
  EXPECT_GT(accepted, 0) << "code continuations repeat identifiers: n-gram drafts should sometimes land";
}
