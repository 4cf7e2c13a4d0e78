// dsinfer tokenizer floor: the Tokenizer implementation for Hugging Face tokenizer.json
// files (byte-level BPE and plain BPE). Exposed (rather than hidden in the .cpp) so unit
// tests and tools can load a tokenizer.json from any path and inspect added tokens.
//
// encode: validate UTF-8 -> split out non-normalized added tokens (leftmost-longest,
// honouring lstrip/rstrip/single_word; special ones only when parse_special) -> normalize
// each remaining span -> split out normalized added tokens -> pre-tokenize -> BPE.
// decode: ids -> token strings (added tokens as their content) -> decoder chain -> bytes.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe_model.h"
#include "tokenizer/components.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Byte trie over added-token contents giving leftmost-longest, non-overlapping matches
// (the MatchKind::LeftmostLongest Aho-Corasick semantics Hugging Face uses).
class AddedTokenMatcher {
 public:
  void add(const std::string& content, int32_t index);
  bool empty() const { return terminal_.size() <= 1; }
  struct Match { size_t begin, end; int32_t index; };
  std::vector<Match> find_all(std::string_view s) const;

 private:
  int32_t child(int32_t node, uint8_t b) const;
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_{-1};  // per node: index into added tokens, or -1
  bool first_byte_[256] = {};
};

class HfTokenizer : public Tokenizer {
 public:
  // tokenizer_json: path of tokenizer.json; config_json: path of tokenizer_config.json or
  // "" (then bos/eos/chat template are empty).
  HfTokenizer(const std::string& tokenizer_json, const std::string& config_json);

  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override;
  const std::string& bos_token() const override { return bos_; }
  const std::string& eos_token() const override { return eos_; }
  const std::string& chat_template_source() const override { return chat_template_; }
  std::string id_to_token(int32_t id) const override;

  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  struct Span { size_t begin, end; int32_t id; };  // id < 0: text to tokenize further
  std::vector<Span> split_added(std::string_view s, const AddedTokenMatcher& m, bool parse_special) const;
  void encode_text(std::string_view s, bool parse_special, std::vector<int32_t>& out) const;
  void load_config(const std::string& path);
  // The token of an id: an added token's content, else the model vocabulary's entry; empty
  // for an id with neither (Hugging Face's id_to_token None).
  std::string_view token_of(int32_t id) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  int32_t vocab_size_ = 0;
  std::string bos_, eos_, chat_template_;
};

}  // namespace dsinfer
