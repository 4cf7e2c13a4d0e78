// dsinfer tokenizer floor: UTF-8 validation and boundary helpers. Used to reject invalid
// prompts with a precise byte offset and by the streaming detokenizer to hold back an
// incomplete multi-byte sequence until its remaining bytes arrive.
#pragma once
#include <cstddef>
#include <string_view>

namespace dsinfer {

// Returns npos when `s` is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF),
// otherwise the byte offset of the first invalid sequence.
size_t utf8_invalid_offset(std::string_view s);
inline bool utf8_valid(std::string_view s) { return utf8_invalid_offset(s) == std::string_view::npos; }

// Length of the longest prefix of `s` that ends on a complete code point boundary,
// treating a trailing *incomplete but so-far-valid* sequence as not yet complete.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace dsinfer
