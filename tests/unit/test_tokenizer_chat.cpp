// Chat templates: family detection from tokenizer_config.json and the exact rendered
// strings of each native renderer (Qwen3 ChatML with/without thinking, DeepSeek-V3,
// DeepSeek-V3.2/V4), on fixtures and, when fetched, the real Qwen3 / DeepSeek-V3 configs.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;
using Msgs = std::vector<ChatMessage>;

namespace {
const std::string kData = DSINFER_TEST_DATA;
std::unique_ptr<Tokenizer> load(const std::string& rel) { return Tokenizer::load(kData + "/" + rel); }
const std::string BOS = "<｜begin▁of▁sentence｜>", EOS = "<｜end▁of▁sentence｜>";
}  // namespace

TEST(TokenizerChat, Qwen3ThinkingAndNot) {
  auto tok = load("tokenizers/tiny_bytelevel");
  ASSERT_EQ(detect_chat_family(*tok), ChatFamily::Qwen3ChatML);
  Msgs m{{"system", "S"}, {"user", "Hi"}};
  EXPECT_EQ(apply_chat_template(*tok, m),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ChatOptions no_think;
  no_think.enable_thinking = false;
  EXPECT_EQ(apply_chat_template(*tok, m, no_think),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
  ChatOptions no_gen;
  no_gen.add_generation_prompt = false;
  EXPECT_EQ(apply_chat_template(*tok, {{"user", "Hi"}}, no_gen), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(TokenizerChat, Qwen3HistoryThinkingAndTools) {
  auto tok = load("tokenizers/tiny_bytelevel");
  // Earlier assistant turns lose their reasoning; the turn after the last query keeps a
  // (possibly empty) think block; consecutive tool results share one user turn.
  Msgs m{{"user", "Q1"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"user", "Q2"},
         {"assistant", "A2"}, {"tool", "R1"}, {"tool", "R2"}};
  EXPECT_EQ(apply_chat_template(*tok, m),
            "<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\nA2<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
  Msgs last{{"user", "Q"}, {"assistant", "<think>\nwhy\n</think>\n\nA"}};
  ChatOptions no_gen;
  no_gen.add_generation_prompt = false;
  EXPECT_EQ(apply_chat_template(*tok, last, no_gen),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nA<|im_end|>\n");
  EXPECT_THROW(apply_chat_template(*tok, {{"robot", "x"}}), Error);
}

TEST(TokenizerChat, DeepSeekV3) {
  auto tok = load("tokenizers/tiny_deepseek_v3");
  ASSERT_EQ(detect_chat_family(*tok), ChatFamily::DeepSeekV3);
  Msgs m{{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "Q"}};
  EXPECT_EQ(apply_chat_template(*tok, m),
            BOS + "S<｜User｜>Hi<｜Assistant｜>Yo" + EOS + "<｜User｜>Q<｜Assistant｜>");
  Msgs t{{"user", "Q"}, {"tool", "R1"}, {"tool", "R2"}};
  EXPECT_EQ(apply_chat_template(*tok, t),
            BOS + "<｜User｜>Q<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>R1<｜tool▁output▁end｜>"
                  "\n<｜tool▁output▁begin｜>R2<｜tool▁output▁end｜><｜tool▁outputs▁end｜>");
}

TEST(TokenizerChat, DeepSeekV4) {
  auto tok = load("tokenizers/tiny_deepseek_v4");
  ASSERT_EQ(detect_chat_family(*tok), ChatFamily::DeepSeekV4);
  Msgs m{{"user", "hello"}, {"assistant", "Hello! I am DeepSeek."}, {"user", "1+1=?"}};
  EXPECT_EQ(apply_chat_template(*tok, m),
            BOS + "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek." + EOS +
                "<｜User｜>1+1=?<｜Assistant｜><think>");
  ChatOptions chat;
  chat.enable_thinking = false;
  EXPECT_EQ(apply_chat_template(*tok, m, chat),
            BOS + "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek." + EOS +
                "<｜User｜>1+1=?<｜Assistant｜></think>");
  Msgs s{{"system", "S"}, {"user", "Q"}, {"tool", "R"}};
  EXPECT_EQ(apply_chat_template(*tok, s, chat),
            BOS + "S<｜User｜>Q\n\n<tool_result>R</tool_result><｜Assistant｜></think>");
}

TEST(TokenizerChat, NoTemplateIsAnError) {
  auto tok = load("tokenizers/tiny_string_merges");
  EXPECT_EQ(detect_chat_family(*tok), ChatFamily::None);
  try {
    apply_chat_template(*tok, {{"user", "x"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field 'chat_template'"), std::string::npos);
  }
}

TEST(TokenizerChat, RealConfigsAreRecognised) {
  if (!std::filesystem::exists(kData + "/external/qwen3/tokenizer.json"))
    GTEST_SKIP() << "tests/data/external/ absent: run tests/data/fetch_test_data.sh";
  auto qwen = load("external/qwen3");
  EXPECT_EQ(detect_chat_family(*qwen), ChatFamily::Qwen3ChatML);
  EXPECT_EQ(qwen->eos_token(), "<|im_end|>");
  auto ds = load("external/deepseek_v3");
  EXPECT_EQ(detect_chat_family(*ds), ChatFamily::DeepSeekV3);
  EXPECT_EQ(ds->bos_token(), BOS);
  auto llama = load("external/llama3");
  EXPECT_EQ(detect_chat_family(*llama), ChatFamily::None);  // Llama-3 chat format not implemented
  // The rendered prompt tokenizes with role markers as single special ids.
  auto ids = qwen->encode(apply_chat_template(*qwen, {{"user", "Hi"}}));
  EXPECT_EQ(ids.front(), *qwen->token_to_id("<|im_start|>"));
}
