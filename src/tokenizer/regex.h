// dsinfer tokenizer floor: thin PCRE2 wrapper used by the Split / ByteLevel pre-tokenizers,
// the Replace normalizer and added-token word-boundary checks. Patterns are compiled once at
// load time with UTF + UCP (so \s, \w, \d and \p{..} follow Unicode, as Oniguruma does in
// Hugging Face tokenizers) and JIT-compiled when the platform allows; matching is const and
// thread-safe (match data and JIT stack are per call / per thread).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsinfer {

// Rewrites the \p{..}, \P{..}, \s, \d, \w (and \S \D \W \b \B, POSIX classes, some
// case-insensitive literals) of a pattern so that PCRE2 10.42's Unicode 14 tables give the
// same classes as the reference (Hugging Face tokenizers 0.23.2 / Oniguruma), using the
// generated table src/tokenizer/unicode_fixups.inc. Regex's constructor applies it to every
// pattern. A pattern the rewriter cannot parse is returned unchanged (PCRE2 then reports
// the error). See regex_unicode.cpp and docs/TOKENIZER.md.
std::string rewrite_for_reference_unicode(std::string_view pattern);

class Regex {
 public:
  // Throws Error("<where>: invalid regex ...") when PCRE2 rejects the pattern. The pattern
  // goes through rewrite_for_reference_unicode first.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches of `s` (valid UTF-8), leftmost first, as [start, end)
  // byte ranges. After an empty match the search resumes one code point further, so the
  // scan always terminates.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

  // Whether the pattern matches anywhere in `s`.
  bool search(std::string_view s) const;

  // Escapes `literal` so that it matches itself (for Split/Replace "String" patterns).
  static std::string escape(std::string_view literal);

 private:
  // Runs one match at `start`; returns false on no match, throws Error on match failure.
  bool match_at(std::string_view s, size_t start, size_t& ms, size_t& me, void* md) const;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
  std::string where_;
};

}  // namespace dsinfer
