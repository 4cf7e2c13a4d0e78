// dsinfer tokenizer floor: normalizers, pre-tokenizers and decoders built from
// tokenizer.json (see components.h). The semantics mirror Hugging Face `tokenizers`,
// including its less obvious rules: ByteLevel's add_prefix_space applies to every piece it
// receives, Split drops empty pieces, a MergedWith* match only merges into a neighbour that
// is not itself a match, and the ByteLevel decoder falls back to a token's raw UTF-8 when
// one of its chars is not in the byte alphabet (added tokens such as "<｜User｜>").
#include "tokenizer/components.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace dsinfer {

using json = nlohmann::json;

void JsonWhere::fail(const std::string& msg) const {
  throw Error(file + ": field '" + field + "': " + msg);
}

// ---- JSON accessors that report the field at fault -------------------------------------
namespace {

const json& need(const json& j, const char* key, const JsonWhere& w) {
  if (!j.is_object()) w.fail("expected an object");
  auto it = j.find(key);
  if (it == j.end()) w.at(key).fail("missing");
  return *it;
}
std::string need_string(const json& j, const char* key, const JsonWhere& w) {
  const json& v = need(j, key, w);
  if (!v.is_string()) w.at(key).fail("expected a string");
  return v.get<std::string>();
}
bool opt_bool(const json& j, const char* key, bool dflt, const JsonWhere& w) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) w.at(key).fail("expected true or false");
  return it->get<bool>();
}
const json& need_array(const json& j, const char* key, const JsonWhere& w) {
  const json& v = need(j, key, w);
  if (!v.is_array()) w.at(key).fail("expected an array");
  return v;
}
std::string type_of(const json& j, const JsonWhere& w) {
  if (!j.is_object()) w.fail("expected an object");
  return need_string(j, "type", w);
}
[[noreturn]] void unsupported(const std::string& type, const JsonWhere& w) {
  w.at("type").fail("unsupported '" + type + "'");
}

// A Split / Replace pattern: {"String": "..."} or {"Regex": "..."}.
std::unique_ptr<Regex> make_pattern(const json& j, const char* key, const JsonWhere& w) {
  const json& p = need(j, key, w);
  JsonWhere pw = w.at(key);
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
    return std::make_unique<Regex>(p["Regex"].get<std::string>(), pw.file + ": field '" + pw.field + ".Regex'");
  if (p.is_object() && p.contains("String") && p["String"].is_string())
    return std::make_unique<Regex>(Regex::escape(p["String"].get<std::string>()),
                                   pw.file + ": field '" + pw.field + ".String'");
  pw.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

// ---- byte-level alphabet ----------------------------------------------------------------
struct ByteTable {
  std::array<std::string, 256> to_uni;
  std::array<int, 512> from_uni;  // stand-in code points are all < 0x144
  ByteTable() {
    from_uni.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      utf8_append(to_uni[b], cp);
      from_uni[cp] = b;
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

}  // namespace

bool unicode_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool unicode_word_char(uint32_t cp) {
  if (cp == '_' || cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

const std::string& byte_to_unicode(uint8_t b) { return byte_table().to_uni[b]; }
int unicode_to_byte(uint32_t cp) { return cp < 512 ? byte_table().from_uni[cp] : -1; }

// ---- normalizers --------------------------------------------------------------------------
namespace {

class UnicodeNorm : public Normalizer {
 public:
  explicit UnicodeNorm(int options) : options_(options) {}
  std::string normalize(std::string_view s) const override {
    if (s.empty()) return {};
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                      static_cast<utf8proc_ssize_t>(s.size()), &out,
                                      static_cast<utf8proc_option_t>(options_));
    if (n < 0) {  // only on invalid UTF-8, which encode() rejects before we get here
      std::free(out);
      throw Error(std::string("normalizer: ") + utf8proc_errmsg(n));
    }
    std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  }

 private:
  int options_;
};

class Lowercase : public Normalizer {
 public:
  std::string normalize(std::string_view s) const override {
    std::string r;
    r.reserve(s.size());
    for (size_t i = 0; i < s.size();) utf8_append(r, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(utf8_next(s, i)))));
    return r;
  }
};

class ReplaceNorm : public Normalizer {
 public:
  ReplaceNorm(std::unique_ptr<Regex> re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  std::string normalize(std::string_view s) const override {
    std::string r;
    size_t prev = 0;
    for (auto [a, b] : re_->find_all(s)) {
      if (a == b) continue;  // an empty match replaces nothing
      r.append(s.substr(prev, a - prev));
      r += content_;
      prev = b;
    }
    r.append(s.substr(prev));
    return r;
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  std::string normalize(std::string_view s) const override {
    return s.empty() ? std::string() : p_ + std::string(s);
  }

 private:
  std::string p_;
};

bool is_unicode_space(uint32_t cp) { return unicode_white_space(cp); }

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view s) const override {
    size_t a = 0, b = s.size();
    if (left_) {
      while (a < b) {
        size_t i = a;
        if (!is_unicode_space(utf8_next(s, i))) break;
        a = i;
      }
    }
    if (right_) {
      while (b > a) {
        size_t st = b - 1;
        while (st > a && (static_cast<uint8_t>(s[st]) & 0xC0) == 0x80) --st;
        size_t i = st;
        if (!is_unicode_space(utf8_next(s, i))) break;
        b = st;
      }
    }
    return std::string(s.substr(a, b - a));
  }

 private:
  bool left_, right_;
};

class NormSequence : public Normalizer {
 public:
  explicit NormSequence(std::vector<std::unique_ptr<Normalizer>> v) : v_(std::move(v)) {}
  std::string normalize(std::string_view s) const override {
    std::string r(s);
    for (auto& n : v_) r = n->normalize(r);
    return r;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> v_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const JsonWhere& w) {
  if (j.is_null()) return nullptr;
  std::string t = type_of(j, w);
  if (t == "NFC") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (t == "NFD") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (t == "NFKC") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (t == "NFKD") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (t == "Lowercase") return std::make_unique<Lowercase>();
  if (t == "Replace") return std::make_unique<ReplaceNorm>(make_pattern(j, "pattern", w), need_string(j, "content", w));
  if (t == "Prepend") return std::make_unique<Prepend>(need_string(j, "prepend", w));
  if (t == "Strip") return std::make_unique<Strip>(opt_bool(j, "strip_left", true, w), opt_bool(j, "strip_right", true, w));
  if (t == "Sequence") {
    const json& arr = need_array(j, "normalizers", w);
    std::vector<std::unique_ptr<Normalizer>> v;
    for (size_t i = 0; i < arr.size(); ++i) {
      auto n = make_normalizer(arr[i], w.at("normalizers").at(i));
      if (n) v.push_back(std::move(n));
    }
    return std::make_unique<NormSequence>(std::move(v));
  }
  unsupported(t, w);
}

// ---- pre-tokenizers -----------------------------------------------------------------------
namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// Splits `s` at the matches of `re` following Hugging Face's SplitDelimiterBehavior.
void split_piece(const std::string& s, const Regex& re, Behavior beh, bool invert,
                 std::vector<std::string>& out) {
  if (s.empty()) return;
  struct Seg { size_t a, b; bool m; };
  std::vector<Seg> segs;
  size_t prev = 0;
  for (auto [a, b] : re.find_all(s)) {
    if (prev != a) segs.push_back({prev, a, invert});
    segs.push_back({a, b, !invert});
    prev = b;
  }
  if (prev != s.size()) segs.push_back({prev, s.size(), invert});

  std::vector<std::pair<size_t, size_t>> pieces;
  bool previous_match = false;
  switch (beh) {
    case Behavior::Removed:
      for (auto& g : segs)
        if (!g.m) pieces.emplace_back(g.a, g.b);
      break;
    case Behavior::Isolated:
      for (auto& g : segs) pieces.emplace_back(g.a, g.b);
      break;
    case Behavior::MergedWithPrevious:
      for (auto& g : segs) {
        if (g.m && !previous_match && !pieces.empty()) pieces.back().second = g.b;
        else pieces.emplace_back(g.a, g.b);
        previous_match = g.m;
      }
      break;
    case Behavior::MergedWithNext:
      for (size_t k = segs.size(); k-- > 0;) {
        auto& g = segs[k];
        if (g.m && !previous_match && !pieces.empty()) pieces.back().first = g.a;
        else pieces.emplace_back(g.a, g.b);
        previous_match = g.m;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    case Behavior::Contiguous:
      for (auto& g : segs) {
        if (g.m == previous_match && !pieces.empty()) pieces.back().second = g.b;
        else pieces.emplace_back(g.a, g.b);
        previous_match = g.m;
      }
      break;
  }
  for (auto [a, b] : pieces)
    if (b > a) out.emplace_back(s.substr(a, b - a));
}

class SplitPre : public PreTokenizer {
 public:
  SplitPre(std::unique_ptr<Regex> re, Behavior beh, bool invert) : re_(std::move(re)), beh_(beh), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 4);
    for (auto& p : pieces) split_piece(p, *re_, beh_, invert_, out);
    pieces.swap(out);
  }

 private:
  std::unique_ptr<Regex> re_;
  Behavior beh_;
  bool invert_;
};

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Regex, where);
  }
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::string> split;
    split.reserve(pieces.size());
    for (auto& p : pieces) {
      std::string s = (add_prefix_space_ && (p.empty() || p[0] != ' ')) ? " " + p : p;
      if (re_) split_piece(s, *re_, Behavior::Isolated, false, split);
      else if (!s.empty()) split.push_back(std::move(s));
    }
    for (auto& s : split) {
      std::string m;
      m.reserve(s.size() * 2);
      for (unsigned char c : s) m += byte_to_unicode(c);
      s.swap(m);
    }
    pieces.swap(split);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class PreSequence : public PreTokenizer {
 public:
  explicit PreSequence(std::vector<std::unique_ptr<PreTokenizer>> v) : v_(std::move(v)) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    for (auto& p : v_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> v_;
};

Behavior parse_behavior(const json& j, const JsonWhere& w) {
  std::string b = need_string(j, "behavior", w);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  w.at("behavior").fail("unsupported '" + b + "'");
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const JsonWhere& w) {
  if (j.is_null()) return nullptr;
  std::string t = type_of(j, w);
  if (t == "Split")
    return std::make_unique<SplitPre>(make_pattern(j, "pattern", w), parse_behavior(j, w),
                                      opt_bool(j, "invert", false, w));
  if (t == "ByteLevel")
    return std::make_unique<ByteLevelPre>(opt_bool(j, "add_prefix_space", true, w),
                                          opt_bool(j, "use_regex", true, w),
                                          w.file + ": field '" + w.field + "'");
  if (t == "Digits") {
    bool individual = opt_bool(j, "individual_digits", false, w);
    return std::make_unique<SplitPre>(std::make_unique<Regex>(R"(\p{N})", w.file),
                                      individual ? Behavior::Isolated : Behavior::Contiguous, false);
  }
  if (t == "Sequence") {
    const json& arr = need_array(j, "pretokenizers", w);
    std::vector<std::unique_ptr<PreTokenizer>> v;
    for (size_t i = 0; i < arr.size(); ++i) {
      auto p = make_pre_tokenizer(arr[i], w.at("pretokenizers").at(i));
      if (p) v.push_back(std::move(p));
    }
    return std::make_unique<PreSequence>(std::move(v));
  }
  unsupported(t, w);
}

// ---- decoders -----------------------------------------------------------------------------
namespace {

class ByteLevelDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string out;
    for (auto& t : tokens) {
      std::string bytes;
      bool ok = utf8_valid(t);
      for (size_t i = 0; ok && i < t.size();) {
        int b = unicode_to_byte(utf8_next(t, i));
        if (b < 0) ok = false;
        else bytes += static_cast<char>(b);
      }
      out += ok ? bytes : t;
    }
    tokens.assign(1, std::move(out));
  }
};

class FuseDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string out;
    for (auto& t : tokens) out += t;
    tokens.assign(1, std::move(out));
  }
};

class ReplaceDec : public Decoder {
 public:
  ReplaceDec(std::unique_ptr<Regex> re, std::string content) : n_(std::move(re), std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = utf8_valid(t) ? n_.normalize(t) : t;
  }

 private:
  ReplaceNorm n_;
};

class ByteFallbackDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;  // bytes of consecutive <0xXX> tokens
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (utf8_valid(pending)) out.push_back(pending);
      else for (size_t k = 0; k < pending_count; ++k) out.push_back("\xEF\xBF\xBD");
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : tokens) {
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4]))) {
        pending += static_cast<char>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
        ++pending_count;
      } else {
        flush();
        out.push_back(t);
      }
    }
    flush();
    tokens.swap(out);
  }
};

class StripDec : public Decoder {
 public:
  StripDec(std::string content, size_t start, size_t stop) : c_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (c_.empty()) return;
    for (auto& t : tokens) {
      size_t a = 0, b = t.size();
      for (size_t k = 0; k < start_ && t.compare(a, c_.size(), c_) == 0 && a + c_.size() <= b; ++k) a += c_.size();
      for (size_t k = 0; k < stop_ && b >= a + c_.size() && t.compare(b - c_.size(), c_.size(), c_) == 0; ++k) b -= c_.size();
      t = t.substr(a, b - a);
    }
  }

 private:
  std::string c_;
  size_t start_, stop_;
};

class DecSequence : public Decoder {
 public:
  explicit DecSequence(std::vector<std::unique_ptr<Decoder>> v) : v_(std::move(v)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : v_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> v_;
};

size_t opt_size(const json& j, const char* key, const JsonWhere& w) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (!it->is_number_unsigned()) w.at(key).fail("expected a non-negative integer");
  return it->get<size_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const JsonWhere& w) {
  if (j.is_null()) return nullptr;
  std::string t = type_of(j, w);
  if (t == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (t == "Fuse") return std::make_unique<FuseDec>();
  if (t == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (t == "Replace") return std::make_unique<ReplaceDec>(make_pattern(j, "pattern", w), need_string(j, "content", w));
  if (t == "Strip") return std::make_unique<StripDec>(need_string(j, "content", w), opt_size(j, "start", w), opt_size(j, "stop", w));
  if (t == "Sequence") {
    const json& arr = need_array(j, "decoders", w);
    std::vector<std::unique_ptr<Decoder>> v;
    for (size_t i = 0; i < arr.size(); ++i) {
      auto d = make_decoder(arr[i], w.at("decoders").at(i));
      if (d) v.push_back(std::move(d));
    }
    return std::make_unique<DecSequence>(std::move(v));
  }
  unsupported(t, w);
}

}  // namespace dsinfer
