// Conformance of dsinfer's tokenizer with the Hugging Face reference, on real tokenizer.json
// files (fetched into tests/data/external/ by tests/data/fetch_test_data.sh):
//  - llama.cpp's ggml-vocab-<name>.gguf.inp/.out pairs: inputs separated by
//    "\n__ggml_vocab_test__\n", expected ids (made with transformers' AutoTokenizer,
//    add_special_tokens=False) one line per input. qwen2 -> our Qwen3 tokenizer.json (same
//    BPE vocab, merges and regex; Qwen3 only adds added tokens), llama-bpe -> Llama-3.
//    deepseek-llm / deepseek-coder need vocabularies we do not have (DeepSeek-V3 changed the
//    vocab and regex), so they are not used.
//  - tests/data/tokenizer_goldens/<name>.jsonl.gz ({"text","ids"} per line) made by
//    tools/reference/tokenizer_goldens.py with `tokenizers`.
// Every id must match, for every text. Code points whose Unicode class changed after
// Unicode 14 (PCRE2 10.42's tables) are classified as the reference does through the
// regex rewrite of src/tokenizer/regex_unicode.cpp. Tests skip with a message when data is
// absent.
#include <gtest/gtest.h>
#include <zlib.h>

#include <sstream>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using dsinfer::Tokenizer;

namespace {

// Goldens are committed gzip-compressed (about 4x smaller); read them whole with zlib.
std::string gunzip_file(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (!gz) return {};
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(gz, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(gz);
  return out;
}


const std::string kData = DSINFER_TEST_DATA;
const std::string kExternal = kData + "/external";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(v[i]);
  }
  return s;
}

// Shared, loaded once per process: loading a 10 MB tokenizer.json takes a moment.
const Tokenizer* tokenizer_for(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  std::string dir = kExternal + "/" + name;
  if (!fs::exists(dir + "/tokenizer.json")) return nullptr;
  auto& slot = cache[name];
  slot = Tokenizer::load(dir);
  return slot.get();
}

void run_llama_cpp_pairs(const std::string& tok_name, const std::string& vocab) {
  const Tokenizer* tok = tokenizer_for(tok_name);
  std::string base = kExternal + "/llama.cpp/ggml-vocab-" + vocab + ".gguf";
  if (!tok || !fs::exists(base + ".inp"))
    GTEST_SKIP() << "tests/data/external/ absent: run tests/data/fetch_test_data.sh";
  std::string inp = slurp(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    size_t e = inp.find(sep, pos);
    if (e == std::string::npos) break;
    texts.push_back(inp.substr(pos, e - pos));
    pos = e + sep.size();
  }
  std::ifstream out(base + ".out");
  std::vector<std::vector<int32_t>> expected;
  for (std::string line; std::getline(out, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    expected.push_back(ids);
  }
  ASSERT_EQ(texts.size(), expected.size()) << base;
  size_t n_ids = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto got = tok->encode(texts[i], true);
    EXPECT_EQ(show(got), show(expected[i])) << vocab << " input #" << i << ": '" << texts[i] << "'";
    n_ids += expected[i].size();
  }
  std::printf("[ conformance ] %s vs llama.cpp %s: %zu strings, %zu ids\n", tok_name.c_str(), vocab.c_str(),
              texts.size(), n_ids);
}

void run_goldens(const std::string& name) {
  std::string path = kData + "/tokenizer_goldens/" + name + ".jsonl.gz";
  const Tokenizer* tok = tokenizer_for(name);
  if (!tok) GTEST_SKIP() << "tests/data/external/" << name << " absent: run tests/data/fetch_test_data.sh";
  if (!fs::exists(path))
    GTEST_SKIP() << path << " not generated yet (tools/reference/tokenizer_goldens.py)";
  std::istringstream f(gunzip_file(path));
  size_t lines = 0, n_ids = 0, failures = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    ++lines;
    auto j = nlohmann::json::parse(line);
    std::string text = j.at("text").get<std::string>();
    std::vector<int32_t> expected = j.at("ids").get<std::vector<int32_t>>();
    n_ids += expected.size();
    auto got = tok->encode(text, true);
    if (got != expected && ++failures <= 10) {
      size_t k = 0;
      while (k < got.size() && k < expected.size() && got[k] == expected[k]) ++k;
      ADD_FAILURE() << name << " line " << lines << " (" << j.value("source", "") << "): first mismatch at id #" << k
                    << " of " << expected.size() << "; text: '" << text.substr(0, 200) << "'";
    }
  }
  EXPECT_EQ(failures, 0u) << name << ": " << failures << " of " << lines << " texts differ";
  EXPECT_GT(lines, 0u);
  std::printf("[ conformance ] %s vs HF goldens: %zu texts, %zu ids, %zu mismatching texts\n", name.c_str(),
              lines, n_ids, failures);
}

}  // namespace

TEST(TokenizerConformance, Qwen3MatchesLlamaCppQwen2Pairs) { run_llama_cpp_pairs("qwen3", "qwen2"); }
TEST(TokenizerConformance, Llama3MatchesLlamaCppLlamaBpePairs) { run_llama_cpp_pairs("llama3", "llama-bpe"); }
TEST(TokenizerConformance, Qwen3Goldens) { run_goldens("qwen3"); }
TEST(TokenizerConformance, Llama3Goldens) { run_goldens("llama3"); }
TEST(TokenizerConformance, DeepSeekV3Goldens) { run_goldens("deepseek_v3"); }

// Decoding what we encoded gives back the input exactly (byte-level BPE is lossless), on the
// llama.cpp inputs and on the committed corpus, for all three tokenizers.
TEST(TokenizerConformance, RoundTripOnCorpus) {
  std::vector<std::string> texts;
  for (auto& e : fs::directory_iterator(kData + "/tokenizer_corpus"))
    if (e.path().extension() == ".txt") texts.push_back(slurp(e.path().string()));
  ASSERT_FALSE(texts.empty());
  int tested = 0;
  for (const char* name : {"qwen3", "llama3", "deepseek_v3"}) {
    const Tokenizer* tok = tokenizer_for(name);
    if (!tok) continue;
    ++tested;
    // Qwen3 normalizes to NFC, so compare with what it sees, not the raw text.
    for (size_t i = 0; i < texts.size(); i += 7) {
      auto ids = tok->encode(texts[i], false);
      std::string back = tok->decode(ids);
      auto again = tok->encode(back, false);
      EXPECT_EQ(again, ids) << name << " corpus text #" << i;
      if (std::string(name) != "qwen3") {
        EXPECT_EQ(back, texts[i]) << name << " corpus text #" << i;
      }
    }
  }
  if (!tested) GTEST_SKIP() << "tests/data/external/ absent: run tests/data/fetch_test_data.sh";
}
