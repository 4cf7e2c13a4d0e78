// End-to-end tests of `dsinfer tokenize`: runs the built binary on the committed tiny
// fixture (a directory holding only tokenizer files) and, when fetched, the real Qwen3
// tokenizer; checks the plain and --json outputs, --file input, and that errors are one
// "dsinfer: error: ..." line with exit code 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

using dsinfer_test::run_dsinfer;

namespace {
const std::string kData = DSINFER_TEST_DATA;
const std::string kTiny = kData + "/tokenizers/tiny_bytelevel";
}  // namespace

TEST(CliTokenize, PrintsIdsWithSpecialTokens) {
  auto r = run_dsinfer({"tokenize", "--model-path", kTiny, "--text", "<|im_start|>hello world"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "300 259 262 108 100\n");
  auto plain = run_dsinfer({"tokenize", "--model-path", kTiny, "--text", "<|im_start|>", "--no-parse-special"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("300"), std::string::npos);
}

TEST(CliTokenize, JsonOutput) {
  auto r = run_dsinfer({"tokenize", "--model-path", kTiny, "--text", "hello world", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({259, 262, 108, 100}));
  EXPECT_EQ(j["tokens"], nlohmann::json({"hello", "\xC4\xA0wor", "l", "d"}));
}

TEST(CliTokenize, FileInput) {
  std::string path = std::filesystem::temp_directory_path().string() + "/dsinfer_tok_in_" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary) << "hello\r\n";
  auto r = run_dsinfer({"tokenize", "--model-path", kTiny, "--file", path});
  std::filesystem::remove(path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "259 13 10\n");
}

TEST(CliTokenize, Errors) {
  auto bad = run_dsinfer({"tokenize", "--model-path", kTiny, "--text", "ab\xFF"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.err, "dsinfer: error: prompt: invalid UTF-8 at byte 2\n");
  auto missing = run_dsinfer({"tokenize", "--model-path", "/nonexistent", "--text", "x"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err.rfind("dsinfer: error: /nonexistent/tokenizer.json: not found", 0), 0u) << missing.err;
  auto none = run_dsinfer({"tokenize", "--model-path", kTiny});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("--text or --file"), std::string::npos);
  auto nofile = run_dsinfer({"tokenize", "--model-path", kTiny, "--file", "/nonexistent.txt"});
  EXPECT_EQ(nofile.exit_code, 1);
  EXPECT_NE(nofile.err.find("/nonexistent.txt"), std::string::npos);
}

TEST(CliTokenize, RealQwen3) {
  std::string dir = kData + "/external/qwen3";
  if (!std::filesystem::exists(dir + "/tokenizer.json"))
    GTEST_SKIP() << "tests/data/external/ absent: run tests/data/fetch_test_data.sh";
  // Expected ids from llama.cpp's ggml-vocab-qwen2 reference (" this is 🦙.cpp").
  auto r = run_dsinfer({"tokenize", "--model-path", dir, "--text", " this is \xF0\x9F\xA6\x99.cpp"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "419 374 11162 99 247 13 10821\n");
}
