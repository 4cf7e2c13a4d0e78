// dsinfer tokenizer floor: UTF-8 validation (see utf8.h).
#include "tokenizer/utf8.h"

#include <cstdint>

namespace dsinfer {

// Decodes the sequence at s[i]; returns its length, 0 if invalid, -1 if valid so far but
// truncated by the end of the string.
static int seq_len(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  if (c < 0x80) return 1;
  int n;
  uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) { n = 3; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) n = 3;
  else if (c == 0xED) { n = 3; hi = 0x9F; }
  else if (c >= 0xEE && c <= 0xEF) n = 3;
  else if (c == 0xF0) { n = 4; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else if (c == 0xF4) { n = 4; hi = 0x8F; }
  else return 0;
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    uint8_t x = b(i + k);
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return 0;
  }
  return n;
}

size_t utf8_invalid_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int n = seq_len(s, i);
    if (n <= 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

size_t utf8_complete_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int n = seq_len(s, i);
    if (n < 0) return i;      // incomplete tail: hold it back
    if (n == 0) n = 1;        // invalid byte: pass it through, it will never complete
    i += static_cast<size_t>(n);
  }
  return i;
}

}  // namespace dsinfer
