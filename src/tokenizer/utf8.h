// dsinfer tokenizer floor: UTF-8 validation and boundary helpers. Used to reject invalid
// prompts with a precise byte offset, by the streaming detokenizer to hold back an
// incomplete multi-byte sequence until its remaining bytes arrive (and to replace bytes that
// can never complete with U+FFFD), and by the byte-level BPE code to walk code points.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsinfer {

// Returns npos when `s` is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF),
// otherwise the byte offset of the first invalid sequence.
size_t utf8_invalid_offset(std::string_view s);
inline bool utf8_valid(std::string_view s) { return utf8_invalid_offset(s) == std::string_view::npos; }

// Length of the longest prefix of `s` that ends on a complete code point boundary,
// treating a trailing *incomplete but so-far-valid* sequence as not yet complete.
size_t utf8_complete_prefix(std::string_view s);

// Copy of `s` in which every maximal invalid subsequence is replaced by U+FFFD (the same
// policy as Python's errors="replace" and Rust's from_utf8_lossy), so the result is always
// valid UTF-8.
std::string utf8_sanitize(std::string_view s);

// Appends the UTF-8 encoding of code point `cp` (must be a Unicode scalar value).
void utf8_append(std::string& out, uint32_t cp);

// Decodes the code point starting at s[i] of a *valid* UTF-8 string and advances i.
uint32_t utf8_next(std::string_view s, size_t& i);

// Byte length of the sequence whose lead byte is `lead` (1 for ASCII and for stray bytes).
inline size_t utf8_lead_len(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

}  // namespace dsinfer
