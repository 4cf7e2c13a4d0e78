// Tests of engine/generator: the stop-string matcher (hold-back, earliest match, text cut
// before the stop string), and the whole text pipeline on a random-weight model carrying
// the repository's real 8k BPE tokenizer (models/demo-random): chat template + encode +
// generate + streaming detokenization, stop strings, streamed pieces equal to the final
// text, and invalid UTF-8 prompts rejected through the CLI.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model/model.h"
#include "model/random_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace dsinfer;
using json = nlohmann::json;

TEST(StopStrings, HoldsBackPossiblePrefixesAndCutsAtMatch) {
  StopStringMatcher m({"STOP", "\n\n"});
  EXPECT_EQ(m.feed("hello S"), "hello ");  // "S" may start "STOP"
  EXPECT_EQ(m.feed("T"), "");
  EXPECT_EQ(m.feed("x"), "STx");            // not a stop after all
  EXPECT_EQ(m.feed("ab\n"), "ab");
  EXPECT_EQ(m.feed("\nrest"), "");          // "\n\n" completes: cut before it
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.feed("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, EarliestStopWinsAndFlushReturnsTail) {
  StopStringMatcher m({"cd", "bcde"});
  EXPECT_EQ(m.feed("abcdef"), "a");  // "bcde" starts before "cd"
  StopStringMatcher n({"zz"});
  EXPECT_EQ(n.feed("abz"), "ab");
  EXPECT_EQ(n.flush(), "z");
  EXPECT_FALSE(n.stopped());
}

namespace {
// A random tiny Qwen3 with the repository's 8k tokenizer, written once per test binary.
const std::string& demo_model_dir() {
  static const std::string dir = [] {
    std::string d = dsinfer_test::make_temp_dir("engine_demo");
    auto r = dsinfer_test::run_dsinfer({"make-random-model", "--like", "tiny", "--dtype", "f32", "--seed", "3",
                                        "--tokenizer", std::string(DSINFER_SOURCE_DIR) + "/models/demo-random",
                                        "--out", d});
    if (r.exit_code != 0) throw std::runtime_error("make-random-model failed: " + r.err);
    return d;
  }();
  return dir;
}
}  // namespace

TEST(Generate, StreamedPiecesAreValidUtf8AndEqualFinalText) {
  auto model = load_model(demo_model_dir());
  auto tok = Tokenizer::load(demo_model_dir());
  EXPECT_EQ(model->config().vocab_size, tok->vocab_size());
  std::string prompt = apply_chat_template(*tok, {{"user", "Write a haiku about caches."}}, ChatOptions{});
  auto ids = tok->encode(prompt, true);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 11;
  StopConditions stop;
  stop.max_tokens = 64;
  std::string streamed;
  int pieces = 0;
  auto r = generate(*model, tok.get(), ids, sp, stop, [&](std::string_view s) {
    EXPECT_TRUE(utf8_valid(s));
    streamed += s;
    pieces++;
  });
  EXPECT_EQ(streamed, r.text);
  EXPECT_GT(pieces, 0);
  EXPECT_FALSE(r.ids.empty());
  EXPECT_EQ(r.prompt_tokens, static_cast<int>(ids.size()));
}

TEST(Generate, StopStringEndsGenerationAndIsExcluded) {
  auto model = load_model(demo_model_dir());
  auto tok = Tokenizer::load(demo_model_dir());
  auto ids = tok->encode("int main(void) {", false);
  SamplingParams sp;  // greedy
  StopConditions stop;
  stop.max_tokens = 40;
  auto full = generate(*model, tok.get(), ids, sp, stop);
  ASSERT_GE(full.text.size(), 4u);
  // Stop on a piece of the greedy text: output is the text before its first occurrence.
  std::string needle = full.text.substr(full.text.size() / 2, 2);
  stop.stop_strings = {needle};
  auto cut = generate(*model, tok.get(), ids, sp, stop);
  EXPECT_EQ(cut.finish_reason, "stop");
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(needle)));
  EXPECT_LT(cut.ids.size(), full.ids.size() + 1);
}

TEST(Generate, RejectsBadArguments) {
  auto model = load_model(demo_model_dir());
  SamplingParams sp;
  StopConditions stop;
  EXPECT_THROW(generate(*model, nullptr, {}, sp, stop), Error);
  EXPECT_THROW(generate(*model, nullptr, {1, 1 << 20}, sp, stop), Error);
  stop.max_tokens = 0;
  EXPECT_THROW(generate(*model, nullptr, {1}, sp, stop), Error);
  stop.max_tokens = 5;
  stop.stop_strings = {"x"};
  EXPECT_THROW(generate(*model, nullptr, {1}, sp, stop), Error);  // stop strings need a tokenizer
}

TEST(Generate, CliChatTextAndInvalidUtf8Prompt) {
  auto r = dsinfer_test::run_dsinfer({"generate", "--model-path", demo_model_dir(), "--chat", "--no-think", "--prompt",
                                      "Hello", "--max-tokens", "8", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = json::parse(r.out);
  EXPECT_EQ(j["ids"].size(), j["usage"]["completion_tokens"].get<size_t>());
  EXPECT_TRUE(j.contains("text"));
  // The chat prompt contains the ChatML markers as single special-token ids.
  auto prompt_ids = j["prompt_ids"].get<std::vector<int>>();
  auto tok = Tokenizer::load(demo_model_dir());
  EXPECT_EQ(prompt_ids.front(), *tok->token_to_id("<|im_start|>"));
  auto bad = dsinfer_test::run_dsinfer({"generate", "--model-path", demo_model_dir(), "--prompt", "ab\xff", "--max-tokens",
                                        "4"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("invalid UTF-8"), std::string::npos) << bad.err;
  EXPECT_EQ(dsinfer_test::count_lines(bad.err), 1);
}
