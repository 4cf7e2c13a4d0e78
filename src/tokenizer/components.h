// dsinfer tokenizer floor: the pluggable stages of a Hugging Face tokenizer.json pipeline,
// each built from its JSON object: Normalizer (text -> text), PreTokenizer (list of pieces
// -> finer list of pieces; ByteLevel also maps every byte to its printable stand-in char),
// Decoder (token strings -> bytes). The BPE model sits between pre-tokenizer and decoder
// (bpe_model.h). Anything unsupported is rejected at load time with an Error naming the
// file and the JSON field, e.g. "DIR/tokenizer.json: field 'normalizer.type': unsupported 'X'".
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer {

// Where a JSON value came from, for error messages: file path + dotted field path.
struct JsonWhere {
  std::string file;
  std::string field;
  JsonWhere at(const std::string& key) const { return {file, field.empty() ? key : field + "." + key}; }
  JsonWhere at(size_t index) const { return {file, field + "[" + std::to_string(index) + "]"}; }
  // "FILE: field 'FIELD': MSG"
  [[noreturn]] void fail(const std::string& msg) const;
};

// GPT-2 byte-level alphabet: every byte maps to one printable code point (bytes that are
// already printable map to themselves, the rest to U+0100 and up).
const std::string& byte_to_unicode(uint8_t b);  // UTF-8 of the stand-in char
// Inverse map; returns -1 for a code point that is not a stand-in.
int unicode_to_byte(uint32_t cp);

// Unicode White_Space property (Rust's char::is_whitespace, Hugging Face's \s).
bool unicode_white_space(uint32_t cp);
// Rust regex's Unicode \w: letters, marks, decimal digits, connector punctuation.
bool unicode_word_char(uint32_t cp);

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view s) const = 0;
};
// Returns nullptr for JSON null. Supported: NFC, NFD, NFKC, NFKD, Lowercase, Sequence,
// Replace (String or Regex pattern), Prepend, Strip.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const JsonWhere& where);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits each piece further; empty pieces are dropped (as Hugging Face does).
  virtual void pre_tokenize(std::vector<std::string>& pieces) const = 0;
};
// Returns nullptr for JSON null. Supported: Split (String/Regex pattern, behavior
// Removed/Isolated/MergedWithPrevious/MergedWithNext/Contiguous, invert), ByteLevel
// (add_prefix_space, use_regex), Digits, Sequence.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const JsonWhere& where);

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Transforms the token strings in place (a chain, like Hugging Face's decode_chain).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};
// Returns nullptr for JSON null. Supported: ByteLevel, Sequence, Fuse, Replace (String),
// ByteFallback, Strip.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const JsonWhere& where);

}  // namespace dsinfer
