// Unit tests of the tokenizer floor on hand-made fixtures (tests/data/tokenizers/, written
// by make_fixtures.py): BPE merge order, both merge encodings, ignore_merges, added tokens
// and their flags, NFC, pre-tokenizer behaviours, normalizers, decoders, decode, and the
// one-line errors that name file and field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/components.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace dsinfer;
using Ids = std::vector<int32_t>;

namespace {

const std::string kFixtures = std::string(DSINFER_TEST_DATA) + "/tokenizers";

std::unique_ptr<Tokenizer> fixture(const std::string& name) { return Tokenizer::load(kFixtures + "/" + name); }

Ids bytes_of(std::string_view s) {  // fixture vocab: id of a single byte == byte value
  Ids v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Writes a tokenizer.json built from the tiny fixture with `edit` applied; returns the dir.
std::string edited_fixture(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream f(kFixtures + "/tiny_bytelevel/tokenizer.json");
  nlohmann::json j = nlohmann::json::parse(f);
  edit(j);
  std::string dir = (fs::temp_directory_path() / ("dsinfer_tok_" + tag + "_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  return dir;
}

std::vector<std::string> pre(const char* json, std::string text) {
  auto p = make_pre_tokenizer(nlohmann::json::parse(json), {"t.json", "pre_tokenizer"});
  std::vector<std::string> v{std::move(text)};
  p->pre_tokenize(v);
  return v;
}

std::string norm(const char* json, const std::string& text) {
  return make_normalizer(nlohmann::json::parse(json), {"t.json", "normalizer"})->normalize(text);
}

}  // namespace

TEST(TokenizerBpe, MergesByRankThenLeftmost) {
  auto tok = fixture("tiny_bytelevel");
  // "hello" -> h e l l o: (h,e) rank 0, (l,l) rank 1, (he,ll) rank 2, (hell,o) rank 3 -> 259.
  // " world" -> Ġ w o r l d: (Ġ,w) rank 4 before (o,r) rank 5, then (Ġw,or) rank 6.
  EXPECT_EQ(tok->encode("hello world"), (Ids{259, 262, 'l', 'd'}));
  // "lll": the leftmost (l,l) merges first.
  EXPECT_EQ(tok->encode("lll"), (Ids{257, 'l'}));
  EXPECT_EQ(tok->encode(""), Ids{});
  EXPECT_EQ(tok->vocab_size(), 309);
}

TEST(TokenizerBpe, StringMergesAndIgnoreMerges) {
  auto tok = fixture("tiny_string_merges");
  // Same merges written as "a b"; ignore_merges takes whole-word vocab hits first, so
  // "Ġworld" (id 263, unreachable by merges) is used directly.
  EXPECT_EQ(tok->encode("hello world"), (Ids{259, 263}));
  EXPECT_EQ(tok->encode("lll"), (Ids{257, 'l'}));
  EXPECT_EQ(tok->eos_token(), "<|endoftext|>");
}

TEST(TokenizerBpe, ByteLevelMapsEveryByte) {
  auto tok = fixture("tiny_bytelevel");
  std::string s = "\t\x01 \xC3\xA9\xE4\xB8\xAD\xF0\x9F\xA6\x99";
  auto ids = tok->encode(s);
  EXPECT_EQ(ids, bytes_of(s));
  EXPECT_EQ(tok->decode(ids), s);
  EXPECT_EQ(tok->id_to_token(' '), "\xC4\xA0");  // Ġ
}

TEST(TokenizerBpe, SpecialTokensOnlyWithParseSpecial) {
  auto tok = fixture("tiny_bytelevel");
  EXPECT_EQ(tok->encode("a<|im_start|>b"), (Ids{'a', 300, 'b'}));
  auto plain = tok->encode("a<|im_start|>b", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 300), 0);
  EXPECT_EQ(tok->decode(plain), "a<|im_start|>b");
  // Non-special added tokens are always recognised (Hugging Face encode_special_tokens).
  auto think = tok->encode("x<think>y", false);
  EXPECT_EQ(think, (Ids{'x', 302, 'y'}));
  // Leftmost-longest: "<|endoftext|>" vs nothing shorter; adjacent tokens.
  EXPECT_EQ(tok->encode("<|im_end|><|endoftext|>"), (Ids{301, 306}));
  EXPECT_TRUE(tok->is_special(300));
  EXPECT_FALSE(tok->is_special(302));
  EXPECT_FALSE(tok->is_special('a'));
  EXPECT_EQ(tok->token_to_id("<think>"), 302);
  EXPECT_EQ(tok->token_to_id("hello"), 259);
  EXPECT_EQ(tok->token_to_id("nope"), std::nullopt);
}

TEST(TokenizerBpe, AddedTokenFlags) {
  auto tok = fixture("tiny_bytelevel");
  // lstrip swallows the whitespace before, rstrip the whitespace after.
  EXPECT_EQ(tok->encode("a  [LS]b"), (Ids{'a', 303, 'b'}));
  EXPECT_EQ(tok->encode("a[RS] \t b"), (Ids{'a', 304, 'b'}));
  // single_word: only when not glued to word characters.
  auto glued = tok->encode("x[SW]y");
  EXPECT_EQ(std::count(glued.begin(), glued.end(), 305), 0);
  EXPECT_EQ(tok->encode("[SW]"), (Ids{305}));
  auto spaced = tok->encode("x [SW] y");
  EXPECT_EQ(std::count(spaced.begin(), spaced.end(), 305), 1);
  // normalized=true: matched after NFC, so the decomposed spelling also hits it.
  EXPECT_EQ(tok->encode("caf\xC3\xA9"), (Ids{308}));
  EXPECT_EQ(tok->encode("cafe\xCC\x81"), (Ids{308}));
}

TEST(TokenizerBpe, NfcNormalizer) {
  auto tok = fixture("tiny_bytelevel");
  EXPECT_EQ(tok->encode("e\xCC\x81"), tok->encode("\xC3\xA9"));  // e + U+0301 -> é
  EXPECT_EQ(tok->encode("\xCC\x81"), bytes_of("\xCC\x81"));      // lone combining mark kept
}

TEST(TokenizerBpe, DecodeAndSkipSpecial) {
  auto tok = fixture("tiny_bytelevel");
  Ids ids{300, 259, 262, 'l', 'd', 301};
  EXPECT_EQ(tok->decode(ids), "<|im_start|>hello world<|im_end|>");
  EXPECT_EQ(tok->decode(ids, true), "hello world");
  EXPECT_EQ(tok->decode({302, 307}, true), "<think></think>");  // not special: kept
  // Ids with no token (past the vocabulary, in the gap before the added tokens, negative)
  // decode to nothing, as Hugging Face's decode skips them: a model whose vocabulary is
  // padded past its tokenizer's may generate them, and a stream must not fail on them.
  EXPECT_EQ(tok->decode({300, 290, 259, 100000, -1, 262, 'l', 'd', 301}), "<|im_start|>hello world<|im_end|>");
  EXPECT_EQ(tok->decode({100000}), "");
  // An explicit lookup of such an id still says which id it was.
  EXPECT_NE(error_of([&] { tok->id_to_token(100000); }).find("100000"), std::string::npos);
}

TEST(TokenizerBpe, InvalidUtf8NamesByteOffset) {
  auto tok = fixture("tiny_bytelevel");
  EXPECT_EQ(error_of([&] { tok->encode("ab\xFF" "c"); }), "prompt: invalid UTF-8 at byte 2");
  EXPECT_EQ(error_of([&] { tok->encode("\xE4\xB8"); }), "prompt: invalid UTF-8 at byte 0");
  EXPECT_EQ(error_of([&] { tok->encode("ok\xED\xA0\x80"); }), "prompt: invalid UTF-8 at byte 2");  // surrogate
  EXPECT_EQ(error_of([&] { tok->encode("\xC0\xAF"); }), "prompt: invalid UTF-8 at byte 0");        // overlong
}

TEST(TokenizerBpe, ErrorsNameFileAndField) {
  auto d1 = edited_fixture("unigram", [](nlohmann::json& j) { j["model"]["type"] = "Unigram"; });
  EXPECT_EQ(error_of([&] { Tokenizer::load(d1); }), d1 + "/tokenizer.json: field 'model.type': unsupported 'Unigram'");
  auto d2 = edited_fixture("bert", [](nlohmann::json& j) {
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "BertNormalizer"}}}}};
  });
  EXPECT_EQ(error_of([&] { Tokenizer::load(d2); }),
            d2 + "/tokenizer.json: field 'normalizer.normalizers[1].type': unsupported 'BertNormalizer'");
  auto d3 = edited_fixture("merge", [](nlohmann::json& j) { j["model"]["merges"][2] = "a b c"; });
  EXPECT_EQ(error_of([&] { Tokenizer::load(d3); }),
            d3 + "/tokenizer.json: field 'model.merges[2]': expected \"a b\" with exactly one space");
  auto d4 = edited_fixture("regex", [](nlohmann::json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  });
  EXPECT_NE(error_of([&] { Tokenizer::load(d4); })
                .find(d4 + "/tokenizer.json: field 'pre_tokenizer.pretokenizers[0].pattern.Regex': invalid regex"),
            std::string::npos);
  auto d5 = edited_fixture("behavior", [](nlohmann::json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  });
  EXPECT_EQ(error_of([&] { Tokenizer::load(d5); }),
            d5 + "/tokenizer.json: field 'pre_tokenizer.pretokenizers[0].behavior': unsupported 'Sideways'");
  auto d6 = edited_fixture("mergevocab", [](nlohmann::json& j) { j["model"]["merges"][0] = {"h", "zz"}; });
  EXPECT_NE(error_of([&] { Tokenizer::load(d6); }).find("field 'model.merges[0]': merge 'h' + 'zz'"), std::string::npos);
  // Invalid JSON and missing files: one line, naming the file.
  std::string d7 = d1 + "_badjson";
  fs::create_directories(d7);
  std::ofstream(d7 + "/tokenizer.json") << "{\"model\": [";
  std::string e7 = error_of([&] { Tokenizer::load(d7); });
  EXPECT_EQ(e7.rfind(d7 + "/tokenizer.json: invalid JSON", 0), 0u) << e7;
  EXPECT_EQ(e7.find('\n'), std::string::npos);
  EXPECT_EQ(error_of([&] { Tokenizer::load("/nonexistent_dir"); }).rfind("/nonexistent_dir/tokenizer.json: not found", 0), 0u);
  for (auto& d : {d1, d2, d3, d4, d5, d6, d7}) fs::remove_all(d);
}

TEST(TokenizerComponents, SplitBehaviors) {
  const std::string s = "the-final--countdown";
  auto split = [&](const char* beh, bool invert = false) {
    std::string j = std::string(R"({"type":"Split","pattern":{"String":"-"},"behavior":")") + beh +
                    R"(","invert":)" + (invert ? "true" : "false") + "}";
    return pre(j.c_str(), s);
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(split("Removed", true), (V{"-", "-", "-"}));
  // Regex pattern with Unicode classes (UCP): letters of any script, digits one by one.
  EXPECT_EQ(pre(R"({"type":"Split","pattern":{"Regex":"\\p{N}"},"behavior":"Isolated","invert":false})", "ab12日本"),
            (V{"ab", "1", "2", "日本"}));
  EXPECT_EQ(pre(R"({"type":"Digits","individual_digits":false})", "a123b4"), (V{"a", "123", "b", "4"}));
}

TEST(TokenizerComponents, ByteLevelPreTokenizer) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pre(R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":false})", "hello"), (V{"\xC4\xA0hello"}));
  EXPECT_EQ(pre(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})", "Hello world's  x"),
            (V{"Hello", "\xC4\xA0world", "'s", "\xC4\xA0", "\xC4\xA0x"}));
  EXPECT_EQ(pre(R"({"type":"Sequence","pretokenizers":[]})", "a b"), (V{"a b"}));
}

TEST(TokenizerComponents, Normalizers) {
  EXPECT_EQ(norm(R"({"type":"NFKC"})", "\xEF\xAC\x81"), "fi");  // ligature ﬁ
  EXPECT_EQ(norm(R"({"type":"NFD"})", "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(norm(R"({"type":"Lowercase"})", "HeLLo \xC3\x89"), "hello \xC3\xA9");
  EXPECT_EQ(norm(R"({"type":"Replace","pattern":{"String":" "},"content":"\u2581"})", "a b"), "a\xE2\x96\x81" "b");
  EXPECT_EQ(norm(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "})", "a \t\n b"), "a b");
  EXPECT_EQ(norm(R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"_"},{"type":"Strip","strip_left":false,"strip_right":true}]})", "x  "), "_x");
  EXPECT_EQ(norm(R"({"type":"Sequence","normalizers":[]})", "same"), "same");
}

TEST(TokenizerComponents, Decoders) {
  auto dec = [](const char* json, std::vector<std::string> toks) {
    make_decoder(nlohmann::json::parse(json), {"t.json", "decoder"})->decode_chain(toks);
    std::string s;
    for (auto& t : toks) s += t;
    return s;
  };
  // ByteLevel: stand-ins map back to bytes; a token with chars outside the alphabet is raw.
  EXPECT_EQ(dec(R"({"type":"ByteLevel"})", {"\xC4\xA0hi", "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"}), " hi<｜User｜>");
  EXPECT_EQ(dec(R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})",
                {"\xE2\x96\x81hi", "<0xE4>", "<0xB8>", "<0xAD>"}),
            "hi\xE4\xB8\xAD");
}
