// dsinfer tokenizer floor: byte-level BPE loaded from a Hugging Face tokenizer.json
// (+ tokenizer_config.json), the streaming detokenizer, and chat templates.
//
// Data flow for encode: text -> split out added/special tokens -> normalizer ->
// pre-tokenizer (regex Split / ByteLevel, via PCRE2 with Unicode properties) -> byte-level
// mapping -> BPE merges by rank -> ids. Decode: ids -> token strings -> byte-level
// inverse -> bytes. No BOS/EOS is ever added implicitly; callers add what they need.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json.
  // Throws Error naming the file and field on anything unsupported or malformed.
  static std::unique_ptr<Tokenizer> load(const std::string& dir);

  // Encodes UTF-8 text. With parse_special, special/added token strings in the text map
  // to their ids. Throws Error("prompt: invalid UTF-8 at byte N") on invalid input.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;

  // Concatenated bytes of the tokens (may be a partial UTF-8 sequence at the edges).
  // Special tokens are rendered as their text unless skip_special.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  // Number of ids (including added tokens): every valid id is < vocab_size().
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  // The vocabulary string of `id` (e.g. "Ġhello" for byte-level BPE; an added token's
  // content). Throws Error when id is out of range.
  virtual std::string id_to_token(int32_t id) const { return decode({id}); }
  virtual bool is_special(int32_t id) const = 0;

  // Special-token strings from tokenizer_config.json ("" when absent).
  virtual const std::string& bos_token() const = 0;
  virtual const std::string& eos_token() const = 0;
  // Raw chat_template string from tokenizer_config.json ("" when absent).
  virtual const std::string& chat_template_source() const = 0;
};

// Turns a stream of ids into text pieces that are always complete UTF-8: bytes of a
// code point split across tokens are held back until the code point is complete.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok, bool skip_special = false);
  // Returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  // Returns whatever is held back (invalid bytes replaced by U+FFFD) and resets.
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;  // Qwen3: false appends an empty <think></think> block
};

// Chat template families implemented natively (no Jinja engine): chosen from the
// model directory's tokenizer_config.json chat_template text.
// DeepSeekV3: the V3 (2024-12) Jinja template's format. DeepSeekV4: the V3.1/V3.2/V4 format
// (encoding_dsv4.py rules) where "<｜Assistant｜>" is followed by "<think>" (thinking) or
// "</think>" (chat). See docs/TOKENIZER.md for the exact strings.
enum class ChatFamily { Qwen3ChatML, DeepSeekV3, None, DeepSeekV4 };

ChatFamily detect_chat_family(const Tokenizer& tok);
// Renders messages to the prompt text; throws Error when the family is None or a role
// is not supported by the family.
std::string apply_chat_template(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                const ChatOptions& opts = {});

}  // namespace dsinfer
