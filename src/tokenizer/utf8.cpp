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

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    int n = seq_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
      continue;
    }
    // Maximal invalid subpart: a lead byte followed by as many continuation bytes as were
    // valid for it, or a single stray byte. Each becomes exactly one U+FFFD.
    size_t j = i + 1;
    uint8_t c = static_cast<uint8_t>(s[i]);
    if (c >= 0xC2 && c <= 0xF4) {
      uint32_t lo = (c == 0xE0) ? 0xA0 : (c == 0xF0) ? 0x90 : 0x80;
      uint32_t hi = (c == 0xED) ? 0x9F : (c == 0xF4) ? 0x8F : 0xBF;
      size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      for (size_t k = 1; k < need && j < s.size(); ++k, ++j) {
        uint8_t x = static_cast<uint8_t>(s[j]);
        bool ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
        if (!ok) break;
      }
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  uint32_t c = b(i);
  size_t n = utf8_lead_len(static_cast<unsigned char>(c));
  if (n == 1 || i + n > s.size()) { ++i; return c; }
  uint32_t cp = n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(i + k) & 0x3F);
  i += n;
  return cp;
}

}  // namespace dsinfer
