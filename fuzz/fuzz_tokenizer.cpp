// libFuzzer target for the tokenizer floor. Data flow: the first input byte picks a
// tokenizer (the committed tiny fixtures, plus the real Qwen3 / DeepSeek-V3 files when
// tests/data/external/ has been fetched) and an operation; the rest is the text or id
// stream. Checks: encode never crashes (invalid UTF-8 must raise dsinfer::Error, nothing
// else), decode(encode(x)) re-encodes to the same ids, decode / StreamingDetokenizer accept
// any in-range ids and the stream only ever emits valid UTF-8, and chat rendering of
// arbitrary content works. Fixtures are found from the repository root (see tokenizers()).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

std::vector<std::unique_ptr<dsinfer::Tokenizer>>& tokenizers() {
  static std::vector<std::unique_ptr<dsinfer::Tokenizer>> toks = [] {
    std::vector<std::unique_ptr<dsinfer::Tokenizer>> v;
    // Repo root: $DSINFER_SOURCE_DIR, else two levels above this file (CMake passes absolute
    // source paths), else the current directory (scripts/run_fuzz_target.sh runs from there).
    std::filesystem::path src = std::filesystem::path(__FILE__).parent_path().parent_path();
    if (const char* env = std::getenv("DSINFER_SOURCE_DIR")) src = env;
    else if (!src.is_absolute()) src = std::filesystem::current_path();
    auto root = src / "tests" / "data";
    for (const char* d : {"tokenizers/tiny_bytelevel", "tokenizers/tiny_string_merges", "tokenizers/tiny_deepseek_v4",
                          "external/qwen3", "external/deepseek_v3"}) {
      auto dir = root / d;
      if (std::filesystem::exists(dir / "tokenizer.json")) v.push_back(dsinfer::Tokenizer::load(dir.string()));
    }
    if (v.empty()) std::abort();  // fixtures missing: the run would test nothing
    return v;
  }();
  return toks;
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

// Loading the real tokenizer.json files takes seconds under ASan: do it before the first
// input so that it does not count against libFuzzer's per-input -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto& toks = tokenizers();
  const dsinfer::Tokenizer& tok = *toks[data[0] % toks.size()];
  const int op = (data[0] / toks.size()) % 3;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  if (op == 0) {  // encode arbitrary bytes
    bool valid = dsinfer::utf8_valid(text);
    for (bool special : {true, false}) {
      try {
        auto ids = tok.encode(text, special);
        check(valid);
        for (int32_t id : ids) check(id >= 0 && id < tok.vocab_size());
        std::string back = tok.decode(ids);
        // Round trip: decoding gives (normalized) text that encodes to the same ids. Not when
        // the decode is invalid UTF-8: as in Hugging Face, the ByteLevel decoder also maps
        // added tokens, so one like "café" decodes to "caf\xE9".
        if (!special && dsinfer::utf8_valid(back)) check(tok.encode(back, false) == ids);
      } catch (const dsinfer::Error&) {
        check(!valid);
      }
    }
  } else if (op == 1) {  // ids -> decode and streaming
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < text.size(); i += 2) {
      uint32_t v = (static_cast<uint8_t>(text[i]) << 8) | static_cast<uint8_t>(text[i + 1]);
      // Spread over the whole id range of large vocabularies too.
      ids.push_back(static_cast<int32_t>((v * 2654435761u) % static_cast<uint32_t>(tok.vocab_size())));
    }
    try {
      std::string all = tok.decode(ids);
      dsinfer::StreamingDetokenizer st(tok);
      std::string acc;
      for (int32_t id : ids) {
        std::string piece = st.push(id);
        check(dsinfer::utf8_valid(piece));
        acc += piece;
      }
      std::string tail = st.flush();
      check(dsinfer::utf8_valid(tail));
      acc += tail;
      check(acc == dsinfer::utf8_sanitize(all) || !dsinfer::utf8_valid(all));
    } catch (const dsinfer::Error&) {
      // ids inside the range but absent from the vocab (holes) are reported, not crashed on
    }
  } else {  // chat rendering of arbitrary content, then encoding
    if (!dsinfer::utf8_valid(text)) return 0;
    std::string s(text);
    // Cut only at code point boundaries so every message stays valid UTF-8.
    size_t third = dsinfer::utf8_complete_prefix(s.substr(0, s.size() / 3));
    size_t seven = dsinfer::utf8_complete_prefix(s.substr(0, 7));
    std::vector<dsinfer::ChatMessage> msgs{{"system", s.substr(0, third)},
                                           {"user", s.substr(third)},
                                           {"assistant", s},
                                           {"tool", s.substr(0, seven)},
                                           {"user", "?"}};
    try {
      dsinfer::ChatOptions o;
      o.enable_thinking = s.size() % 2;
      std::string prompt = dsinfer::apply_chat_template(tok, msgs, o);
      tok.encode(prompt);
    } catch (const dsinfer::Error&) {
      check(dsinfer::detect_chat_family(tok) == dsinfer::ChatFamily::None);
    }
  }
  return 0;
}
