// Streaming detokenizer and UTF-8 helpers: code points split across tokens (emoji, CJK) are
// held back until complete, bytes that can never complete become U+FFFD, and the emitted
// pieces always concatenate to decode(all ids) for valid text.
#include <gtest/gtest.h>

#include <filesystem>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace dsinfer;

namespace {
const std::string kData = DSINFER_TEST_DATA;
std::unique_ptr<Tokenizer> tiny() { return Tokenizer::load(kData + "/tokenizers/tiny_bytelevel"); }
}  // namespace

TEST(TokenizerStream, HoldsBackSplitEmojiAndCjk) {
  auto tok = tiny();  // fixture: one token per byte for anything but the few merges
  StreamingDetokenizer st(*tok);
  const std::string llama = "\xF0\x9F\xA6\x99", zhong = "\xE4\xB8\xAD";
  for (int k = 0; k < 3; ++k) EXPECT_EQ(st.push(static_cast<uint8_t>(llama[k])), "");
  EXPECT_EQ(st.push(static_cast<uint8_t>(llama[3])), llama);
  EXPECT_EQ(st.push(static_cast<uint8_t>(zhong[0])), "");
  EXPECT_EQ(st.push(static_cast<uint8_t>(zhong[1])), "");
  EXPECT_EQ(st.push(static_cast<uint8_t>(zhong[2])), zhong);
  EXPECT_EQ(st.push(259), "hello");
  EXPECT_EQ(st.flush(), "");
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementChar) {
  auto tok = tiny();
  StreamingDetokenizer st(*tok);
  EXPECT_EQ(st.push(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(st.push(0xE4), "");
  EXPECT_EQ(st.push(0xB8), "");
  EXPECT_EQ(st.push('a'), "\xEF\xBF\xBD" "a");  // E4 B8 can no longer complete
  EXPECT_EQ(st.push(0xF0), "");
  EXPECT_EQ(st.flush(), "\xEF\xBF\xBD");  // incomplete tail at the end
  EXPECT_EQ(st.flush(), "");
}

TEST(TokenizerStream, SkipSpecial) {
  auto tok = tiny();
  StreamingDetokenizer keep(*tok), skip(*tok, true);
  EXPECT_EQ(keep.push(300), "<|im_start|>");
  EXPECT_EQ(skip.push(300), "");
  EXPECT_EQ(skip.push(302), "<think>");  // not special
}

TEST(TokenizerStream, RealTokenizerConcatenationEqualsDecode) {
  std::string dir = kData + "/external/qwen3";
  if (!std::filesystem::exists(dir + "/tokenizer.json"))
    GTEST_SKIP() << "tests/data/external/ absent: run tests/data/fetch_test_data.sh";
  auto tok = Tokenizer::load(dir);
  std::string text = "Emoji 👨‍👩‍👧‍👦🦙🇯🇵 and 中文字符测试, 日本語のテキスト, 한국어, ไทย, नमस्ते. Done!";
  auto ids = tok->encode(text);
  StreamingDetokenizer st(*tok);
  std::string acc;
  int held = 0;
  for (int32_t id : ids) {
    std::string piece = st.push(id);
    EXPECT_TRUE(utf8_valid(piece));
    if (piece.empty()) ++held;
    acc += piece;
  }
  acc += st.flush();
  EXPECT_EQ(acc, text);
  EXPECT_GT(held, 0);  // some code points really were split across tokens
}

TEST(TokenizerUtf8, Helpers) {
  EXPECT_EQ(utf8_invalid_offset("abc"), std::string_view::npos);
  EXPECT_EQ(utf8_invalid_offset("a\xF4\x90\x80\x80"), 1u);  // > U+10FFFF
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_sanitize("a\xE4\xB8" "b\xFF"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(utf8_sanitize("\xF0\x9F\xA6\x99"), "\xF0\x9F\xA6\x99");
  std::string s;
  utf8_append(s, 0x1F999);
  EXPECT_EQ(s, "\xF0\x9F\xA6\x99");
  size_t i = 0;
  EXPECT_EQ(utf8_next(s, i), 0x1F999u);
  EXPECT_EQ(i, 4u);
}
