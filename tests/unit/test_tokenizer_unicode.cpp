// Regex property classes follow the reference (Hugging Face tokenizers 0.23.2 / Oniguruma)
// rather than PCRE2 10.42's Unicode 14 tables: src/tokenizer/regex_unicode.cpp rewrites
// patterns with the table generated from tools/reference/unicode_tables/fixups.json.
//  - exhaustive: every probe of tools/reference/unicode_tables/tokenizers-0.23.2.classes.json
//    (the reference's measured membership), in plain, negated and in-class forms, is checked
//    against every code point through dsinfer::Regex;
//  - spot checks (Kawi, U+180E) and exact rewrites of tricky pattern syntax.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

using dsinfer::Regex;
using dsinfer::rewrite_for_reference_unicode;

namespace {

using Range = std::pair<uint32_t, uint32_t>;  // inclusive
using Ranges = std::vector<Range>;

const std::string kTables = std::string(DSINFER_SOURCE_DIR) + "/tools/reference/unicode_tables/";

std::string utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

uint32_t decode_at(const std::string& s, size_t i) {
  auto u = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[k])); };
  uint32_t b = u(i);
  if (b < 0x80) return b;
  if (b < 0xE0) return ((b & 0x1F) << 6) | (u(i + 1) & 0x3F);
  if (b < 0xF0) return ((b & 0x0F) << 12) | ((u(i + 1) & 0x3F) << 6) | (u(i + 2) & 0x3F);
  return ((b & 0x07) << 18) | ((u(i + 1) & 0x3F) << 12) | ((u(i + 2) & 0x3F) << 6) | (u(i + 3) & 0x3F);
}

// Every code point except the surrogates, in order, as one UTF-8 string, and the byte
// offsets that cut it into chunks of 4096 code points (short runs keep (?:X)+ within the
// JIT stack).
struct AllCodePoints {
  std::string text;
  std::vector<size_t> cuts;
};
const AllCodePoints& all_code_points() {
  static const AllCodePoints a = [] {
    AllCodePoints t;
    size_t n = 0;
    for (uint32_t c = 0; c <= 0x10FFFF; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      if (n++ % 4096 == 0) t.cuts.push_back(t.text.size());
      t.text += utf8(c);
    }
    t.cuts.push_back(t.text.size());
    return t;
  }();
  return a;
}

void add_range(Ranges& rs, uint32_t lo, uint32_t hi) {
  // Split across the surrogate gap; merge with the previous range when adjacent (as the
  // reference table does: ranges never span the surrogates).
  if (lo < 0xD800 && hi > 0xDFFF) {
    add_range(rs, lo, 0xD7FF);
    add_range(rs, 0xE000, hi);
    return;
  }
  uint32_t prev_end = rs.empty() ? 0 : rs.back().second;
  if (!rs.empty() && prev_end + 1 >= lo)
    rs.back().second = std::max(prev_end, hi);
  else
    rs.emplace_back(lo, hi);
}

// The code points `pattern` matches, scanning all code points with (?:pattern)+ (or, for
// `single`, the one-code-point matches of pattern itself).
Ranges measure(const std::string& pattern, bool single = false) {
  Regex re(single ? pattern : "(?:" + pattern + ")+", "test");
  const AllCodePoints& all = all_code_points();
  const std::string& s = all.text;
  Ranges out;
  for (size_t k = 0; k + 1 < all.cuts.size(); ++k) {
    size_t base = all.cuts[k];
    for (auto [b, e] : re.find_all(std::string_view(s).substr(base, all.cuts[k + 1] - base))) {
      if (e <= b) continue;
      b += base;
      size_t last = base + e - 1;
      while ((static_cast<unsigned char>(s[last]) & 0xC0) == 0x80) --last;
      if (single && last != b) continue;
      add_range(out, decode_at(s, b), decode_at(s, last));
    }
  }
  return out;
}

Ranges complement(const Ranges& rs) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : rs) {
    if (lo > next) add_range(out, next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) add_range(out, next, 0x10FFFF);
  Ranges clean;  // drop the surrogates
  for (auto [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) clean.emplace_back(lo, hi);
    else {
      if (lo < 0xD800) clean.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) clean.emplace_back(0xE000, hi);
    }
  }
  return clean;
}

Ranges with(Ranges rs, uint32_t c) {
  rs.emplace_back(c, c);
  std::sort(rs.begin(), rs.end());
  Ranges out;
  for (auto [lo, hi] : rs) add_range(out, lo, hi);
  return out;
}

bool contains(const Ranges& rs, uint32_t c) {
  auto it = std::upper_bound(rs.begin(), rs.end(), Range{c, 0xFFFFFFFF});
  return it != rs.begin() && std::prev(it)->second >= c;
}

std::string describe_diff(const Ranges& got, const Ranges& want) {
  // First code point where they differ (candidates: range edges), for the failure message.
  std::vector<uint32_t> edges;
  for (const Ranges* rs : {&got, &want})
    for (auto [lo, hi] : *rs) {
      edges.push_back(lo);
      edges.push_back(hi + 1);
    }
  std::sort(edges.begin(), edges.end());
  for (uint32_t c : edges) {
    bool g = contains(got, c), w = contains(want, c);
    if (g != w) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "U+%04X: dsinfer %s, reference %s", c, g ? "matches" : "does not match",
                    w ? "matches" : "does not");
      return buf;
    }
  }
  return "same code points, different range lists";
}

const nlohmann::json& reference_classes() {
  static const nlohmann::json j = [] {
    std::ifstream f(kTables + "tokenizers-0.23.2.classes.json");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str().empty() ? nlohmann::json() : nlohmann::json::parse(ss.str());
  }();
  return j;
}

Ranges reference_ranges(const std::string& probe) {
  for (auto& p : reference_classes().at("probes"))
    if (p.at("name") == probe) {
      Ranges rs;
      for (auto& r : p.at("ranges")) rs.emplace_back(r[0].get<uint32_t>(), r[1].get<uint32_t>());
      return rs;
    }
  ADD_FAILURE() << "probe " << probe << " not in the reference table";
  return {};
}

bool matches_whole(const std::string& pattern, uint32_t c) {
  Regex re(pattern, "test");
  std::string s = utf8(c);
  auto m = re.find_all(s);
  return m.size() == 1 && m[0].first == 0 && m[0].second == s.size();
}

}  // namespace

// Every probe the reference was measured with: the rewritten pattern matches exactly the
// reference's code points, also negated (\P, \S, [^..], [:^..:]) and next to other members.
TEST(TokenizerUnicode, EveryProbeMatchesReferenceOnEveryCodePoint) {
  const auto& ref = reference_classes();
  if (ref.is_null()) GTEST_SKIP() << kTables << "tokenizers-0.23.2.classes.json absent";
  const uint32_t kExtra = 0x180E;  // a member added to classes (in \s for PCRE2, not for the reference)
  const std::string extra = "\\x{180E}";
  int checked = 0;
  for (auto& p : ref.at("probes")) {
    std::string name = p.at("name"), mode = p.at("mode");
    Ranges S;
    for (auto& r : p.at("ranges")) S.emplace_back(r[0].get<uint32_t>(), r[1].get<uint32_t>());
    Ranges notS = complement(S);
    std::vector<std::pair<std::string, Ranges>> cases;
    if (mode == "single") {
      Ranges got = measure(name, true);
      EXPECT_EQ(got, S) << name << ": " << describe_diff(got, S);
      ++checked;
      continue;
    }
    if (name.rfind("\\p{", 0) == 0 || (name.size() == 2 && name[0] == '\\')) {
      // \p{X} / \s: the complement form is \P{X} / \S.
      std::string inner = name.substr(1), neg;
      if (name[1] == 'p')
        neg = "\\P" + name.substr(2);
      else
        neg = std::string("\\") + static_cast<char>(std::toupper(static_cast<unsigned char>(name[1])));
      cases = {{name, S},
               {neg, notS},
               {"[" + name + "]", S},
               {"[^" + name + "]", notS},
               {"[" + neg + "]", notS},
               {"[^" + neg + "]", S},
               {"[" + extra + name + "]", with(S, kExtra)},
               {"[" + name + extra + "]", with(S, kExtra)},
               {"[^" + extra + neg + "]", complement(with(notS, kExtra))},
               {"[^" + name + extra + "]", complement(with(S, kExtra))}};
    } else if (name.rfind("[[:", 0) == 0) {
      std::string posix = name.substr(1, name.size() - 2);  // [:alpha:]
      std::string neg = "[:^" + posix.substr(2);
      cases = {{name, S},
               {"[" + neg + "]", notS},
               {"[^" + posix + "]", notS},
               {"[^" + neg + "]", S},
               {"[" + extra + posix + "]", with(S, kExtra)},
               {"[^" + extra + posix + "]", complement(with(S, kExtra))}};
    } else {
      cases = {{name, S}};
    }
    for (auto& [pattern, want] : cases) {
      Ranges got = measure(pattern);
      EXPECT_EQ(got, want) << pattern << ": " << describe_diff(got, want);
      ++checked;
    }
  }
  std::printf("[ unicode ] %d patterns checked on all 1,112,064 code points\n", checked);
}

TEST(TokenizerUnicode, KawiLetterIsALetter) {
  // U+11F04 KAWI LETTER A (Unicode 15): unassigned for PCRE2 10.42, \p{L} for the reference.
  EXPECT_TRUE(matches_whole(R"(\p{L})", 0x11F04));
  EXPECT_TRUE(matches_whole(R"(\p{Lo})", 0x11F04));
  EXPECT_TRUE(matches_whole(R"([\p{L}\p{M}])", 0x11F04));
  EXPECT_FALSE(matches_whole(R"([^\r\n\p{L}\p{P}\p{S}])", 0x11F04));
  EXPECT_FALSE(matches_whole(R"(\P{L})", 0x11F04));
  EXPECT_FALSE(matches_whole(R"(\p{Cn})", 0x11F04));
  // DeepSeek-V3's main split keeps a Kawi word in one piece.
  Regex ds(R"([^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)", "test");
  std::string word = " " + utf8(0x11F04) + utf8(0x11F05) + utf8(0x11F06);
  auto m = ds.find_all(word);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], std::make_pair(size_t{0}, word.size()));
}

TEST(TokenizerUnicode, MongolianVowelSeparatorFollowsReferenceWhitespace) {
  if (reference_classes().is_null()) GTEST_SKIP() << "reference table absent";
  // U+180E is in PCRE2 10.42's \s but not in the reference's.
  bool ref_space = contains(reference_ranges("\\s"), 0x180E);
  EXPECT_FALSE(ref_space);
  EXPECT_EQ(matches_whole(R"(\s)", 0x180E), ref_space);
  EXPECT_EQ(matches_whole(R"(\S)", 0x180E), !ref_space);
  EXPECT_EQ(matches_whole(R"([\s])", 0x180E), ref_space);
  EXPECT_EQ(matches_whole(R"([^\s\p{L}\p{N}])", 0x180E), !ref_space);
  EXPECT_EQ(matches_whole(R"([[:space:]])", 0x180E), contains(reference_ranges("[[:space:]]"), 0x180E));
  EXPECT_TRUE(matches_whole(R"(\s)", 0x3000));
  EXPECT_TRUE(matches_whole(R"(\s)", '\n'));
}

TEST(TokenizerUnicode, CaseInsensitiveMultiLetterFold) {
  // The reference matches U+00DF / U+1E9E for (?i:ss) and U+FB05/U+FB06 for (?i:st).
  EXPECT_TRUE(matches_whole("(?i:ss)", 0xDF));
  EXPECT_TRUE(matches_whole("(?i:ss)", 0x1E9E));
  EXPECT_TRUE(matches_whole("(?i:st)", 0xFB06));
  EXPECT_FALSE(matches_whole("ss", 0xDF));
  Regex re("(?i:'ss|x)", "test");
  EXPECT_TRUE(re.search("'SS"));
  EXPECT_TRUE(re.search("'" + utf8(0xDF)));
}

TEST(TokenizerUnicode, RewriteFollowsRegexSyntax) {
  auto rw = [](const std::string& p) { return rewrite_for_reference_unicode(p); };
  // No property class: unchanged.
  for (std::string p : {"abc", R"(a\\p{L})", R"(\Q\p{L}\s\E)", R"([\Q]\p{L}\E])", R"((?#\p{L}))",
                        R"((?x) # \p{L} [ unbalanced in a comment
a)", R"(\p{Zs})", R"(\p{sc:Han})", "(?<ss>a)\\k<ss>", "ss", R"((?i:s+s))",
                        R"([\\\]a-z])", "[]\\p{Zs}]"})
    EXPECT_EQ(rw(p), p) << p;
  // An escaped backslash before p{L} keeps it literal; the next escape is a real class.
  std::string r = rw(R"(\\p{L}\\\p{Lt}\\\p{Pd})");
  EXPECT_EQ(r, R"(\\p{L}\\\p{Lt}\\[\p{Pd}\x{10D6E}])");
  // Inside a class: adds are appended in place, escapes and ']' handling are kept.
  EXPECT_EQ(rw(R"([\\\]\p{Pd}-])"), R"([\\\]\p{Pd}\x{10D6E}-])");
  EXPECT_EQ(rw(R"([]\p{Pd}])"), R"([]\p{Pd}\x{10D6E}])");
  EXPECT_EQ(rw(R"([^\p{Sm}x])"), R"([^\p{Sm}\x{10D8E}-\x{10D8F}x])");
  EXPECT_EQ(rw(R"(\P{Sm})"), R"([^\p{Sm}\x{10D8E}-\x{10D8F}])");
  EXPECT_EQ(rw(R"(\p{^Sm})"), R"([^\p{Sm}\x{10D8E}-\x{10D8F}])");
  EXPECT_EQ(rw(R"(\pL)").substr(0, 18), R"([\p{L}\x{1C89}-\x{)");
  // \s is spelled out from the reference's list (U+180E removed).
  EXPECT_EQ(rw(R"(\s)"), R"([\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}-\x{2029})"
                         R"(\x{202F}\x{205F}\x{3000}])");
  EXPECT_EQ(rw(R"(\S)"), R"([^\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}-\x{2029})"
                         R"(\x{202F}\x{205F}\x{3000}])");
  // Inline flags and groups are tracked: (?i) turns the fold on for the rest of the group.
  EXPECT_EQ(rw("(?:(?i)ss)ss"), R"((?:(?i)(?:ss|[\x{DF}\x{1E9E}]))ss)");
  EXPECT_EQ(rw("(?i)(?<=ss)ss"), R"((?i)(?<=ss)(?:ss|[\x{DF}\x{1E9E}]))");
  EXPECT_EQ(rw("(?i)(?-i:ss)"), "(?i)(?-i:ss)");
  // Unparseable patterns come back unchanged; Regex then reports PCRE2's error.
  EXPECT_EQ(rw(R"([\p{L})"), R"([\p{L})");
  EXPECT_EQ(rw(R"(\p{L)"), R"(\p{L)");
  try {
    Regex bad(R"(a[\p{L})", "here");
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("here: invalid regex at offset"), std::string::npos) << e.what();
  }
}

// Rewritten tokenizer patterns still JIT-compile and behave on ordinary text.
TEST(TokenizerUnicode, TokenizerPatternsStillWork) {
  Regex qwen(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
             "test");
  std::string s = "Hello, world! It's 42 \xE4\xBD\xA0\xE5\xA5\xBD  \n";
  std::vector<std::string> pieces;
  for (auto [b, e] : qwen.find_all(s)) pieces.push_back(s.substr(b, e - b));
  std::vector<std::string> want = {"Hello", ",", " world", "!", " It", "'s", " ", "4", "2", " \xE4\xBD\xA0\xE5\xA5\xBD", "  \n"};
  EXPECT_EQ(pieces, want);
}
