// dsinfer tokenizer floor: rewrite of regex property classes so that the system PCRE2
// (Debian 12: 10.42, Unicode 14 tables) classifies code points as the reference does
// (Hugging Face tokenizers 0.23.2 on Oniguruma, newer Unicode). See regex.h and
// docs/TOKENIZER.md ("Unicode tables"); the data is src/tokenizer/unicode_fixups.inc,
// generated from tools/reference/unicode_tables/fixups.json.
//
// For a class atom with PCRE2 set P, the reference's set is (P ∪ A) \ R with A ("add") and
// R ("remove") from the table. The pattern is scanned token by token (escapes, \Q..\E,
// character classes with POSIX members, groups and their inline flags, (?x) comments), and:
//  - outside a class: R empty -> [P A]; A empty -> [^P' R] (P' = complement of P, e.g. \P{X});
//    both -> (?:[^P' R]|[A]). Small classes with removals (\s, a few scripts) are spelled
//    out from the reference's full range list instead, which needs neither.
//  - inside a class: a member without removals gets its A ranges appended in place (correct
//    for negated classes too). Members with removals cannot be expressed in one PCRE2 class
//    (no subtraction in 10.42), so the class becomes a group: [items] ->
//    (?:[others]|[^P'_k R_k]...), and [^items] -> (?:[^others P_k...]|(?!U)[R_k...]) where U
//    is the union written as above; the first branch is the common, fast path.
//  - \b / \B use the reference's \w set via lookarounds when \w differs.
//  - a case-insensitive literal such as "ss" that the reference also matches as one code
//    point (U+00DF) becomes (?:ss|[\x{DF}...]) (outside classes, lookbehinds and (?x)).
// Patterns the scanner cannot follow (unterminated class, \Q, group...) are returned
// unchanged so that PCRE2 reports the error on the user's pattern.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace dsinfer {

namespace {

struct UniRange {
  uint32_t lo, hi;
};
enum class UniKind { Prop, Escape, Posix, Fold };
struct UniFixup {
  UniKind kind;
  const char* key;
  const UniRange* add;
  size_t n_add;
  const UniRange* rem;
  size_t n_rem;
  const UniRange* full;
  size_t n_full;
};

#include "tokenizer/unicode_fixups.inc"

using Ranges = std::vector<UniRange>;

struct ParseError {};

std::string lower_loose(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' || c == '_' || c == '-') continue;
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  return out;
}

// Long general-category names and ISO 15924 codes of the probed scripts -> probe keys
// (PCRE2 and Oniguruma accept property names loosely: case, spaces, '_' and '-' ignored).
const char* const kAliases[][2] = {
    {"letter", "l"}, {"uppercaseletter", "lu"}, {"lowercaseletter", "ll"},
    {"titlecaseletter", "lt"}, {"modifierletter", "lm"}, {"otherletter", "lo"},
    {"mark", "m"}, {"nonspacingmark", "mn"}, {"spacingmark", "mc"}, {"enclosingmark", "me"},
    {"number", "n"}, {"decimalnumber", "nd"}, {"letternumber", "nl"}, {"othernumber", "no"},
    {"punctuation", "p"}, {"connectorpunctuation", "pc"}, {"dashpunctuation", "pd"},
    {"openpunctuation", "ps"}, {"closepunctuation", "pe"}, {"initialpunctuation", "pi"},
    {"finalpunctuation", "pf"}, {"otherpunctuation", "po"}, {"symbol", "s"},
    {"mathsymbol", "sm"}, {"currencysymbol", "sc"}, {"modifiersymbol", "sk"},
    {"othersymbol", "so"}, {"separator", "z"}, {"spaceseparator", "zs"},
    {"lineseparator", "zl"}, {"paragraphseparator", "zp"}, {"other", "c"}, {"control", "cc"},
    {"format", "cf"}, {"privateuse", "co"}, {"unassigned", "cn"}, {"hani", "han"},
    {"hira", "hiragana"}, {"kana", "katakana"}, {"hang", "hangul"}, {"latn", "latin"},
    {"grek", "greek"}, {"cyrl", "cyrillic"}, {"arab", "arabic"}, {"hebr", "hebrew"},
    {"deva", "devanagari"}, {"zyyy", "common"}, {"zinh", "inherited"}, {"qaai", "inherited"},
};

const UniFixup* find_fixup(UniKind kind, std::string_view key) {
  std::string k = lower_loose(key);
  if (kind == UniKind::Prop)
    for (auto& a : kAliases)
      if (k == a[0]) k = a[1];
  for (const UniFixup& f : kUniFixups)
    if (f.kind == kind && (kind == UniKind::Escape ? key == f.key : k == lower_loose(f.key))) return &f;
  return nullptr;
}

Ranges to_ranges(const UniRange* r, size_t n) { return Ranges(r, r + n); }

// Complement within U+0000..U+10FFFF, leaving out the surrogates (not valid in UTF mode).
Ranges complement(const Ranges& rs) {
  Ranges out;
  uint32_t next = 0;
  auto push = [&](uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) out.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
    } else {
      out.push_back({lo, hi});
    }
  };
  for (const UniRange& r : rs) {
    if (r.lo > next) push(next, r.lo - 1);
    next = r.hi + 1;
  }
  if (next <= 0x10FFFF) push(next, 0x10FFFF);
  return out;
}

std::string hex_cp(uint32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", static_cast<unsigned>(c));
  return buf;
}

std::string ranges_text(const Ranges& rs) {
  std::string out;
  for (const UniRange& r : rs) {
    out += hex_cp(r.lo);
    if (r.hi != r.lo) {
      out += '-';
      out += hex_cp(r.hi);
    }
  }
  return out;
}

// One class atom after fixups: the reference's set is (P ∪ add) \ rem.
struct Item {
  std::string pos;  // PCRE2 text for P, valid inside [...]
  std::string neg;  // PCRE2 text for the complement of P, valid inside [...]
  Ranges add, rem;
  bool fixed = false;  // a table entry applies (pos/add/rem differ from the source text)
  std::string full_atom;  // spelled-out reference list as an atom, when the table has one
};

// `negated`: the atom is the complement form (\P{X}, \S, [:^x:]).
Item make_item(const UniFixup* fx, bool negated, std::string pos, std::string neg) {
  Item it{std::move(pos), std::move(neg), {}, {}, false, {}};
  if (!fx) return it;
  it.fixed = true;
  if (fx->n_full) {
    Ranges full = to_ranges(fx->full, fx->n_full);
    Ranges comp = complement(full);
    it.pos = ranges_text(negated ? comp : full);
    it.neg = ranges_text(negated ? full : comp);
    it.full_atom = std::string(negated ? "[^" : "[") + ranges_text(full) + "]";
    return it;
  }
  Ranges a = to_ranges(fx->add, fx->n_add), r = to_ranges(fx->rem, fx->n_rem);
  it.add = negated ? r : a;
  it.rem = negated ? a : r;
  return it;
}

// The item as a standalone atom (outside any class).
std::string atom_text(const Item& it) {
  if (!it.full_atom.empty()) return it.full_atom;
  if (it.rem.empty()) return "[" + it.pos + ranges_text(it.add) + "]";
  std::string sub = "[^" + it.neg + ranges_text(it.rem) + "]";
  if (it.add.empty()) return sub;
  return "(?:" + sub + "|[" + ranges_text(it.add) + "])";
}

class Rewriter {
 public:
  explicit Rewriter(std::string_view p) : p_(p) {}

  std::string run() {
    groups_.push_back({false, false, false});
    while (i_ < p_.size()) step();
    return out_;
  }

 private:
  struct Group {
    bool icase, extended, lookbehind;
  };

  std::string_view p_;
  size_t i_ = 0;
  std::string out_;
  std::vector<Group> groups_;

  char at(size_t k) const { return k < p_.size() ? p_[k] : '\0'; }
  size_t cp_len(size_t k) const {
    size_t n = utf8_lead_len(static_cast<unsigned char>(p_[k]));
    if (n == 0) n = 1;
    return std::min(n, p_.size() - k);
  }
  // Index just past the first `term` at or after k; throws when absent.
  size_t through(size_t k, char term) const {
    size_t e = p_.find(term, k);
    if (e == std::string_view::npos) throw ParseError{};
    return e + 1;
  }

  // Length of the escape at k (p_[k] == '\\') for escapes copied verbatim.
  size_t escape_len(size_t k) const {
    if (k + 1 >= p_.size()) throw ParseError{};
    char d = p_[k + 1];
    char e = at(k + 2);
    if ((d == 'x' || d == 'o' || d == 'N' || d == 'g' || d == 'k' || d == 'u') && e == '{')
      return through(k + 2, '}') - k;
    if ((d == 'k' || d == 'g') && e == '<') return through(k + 2, '>') - k;
    if ((d == 'k' || d == 'g') && e == '\'') return through(k + 3, '\'') - k;
    if (d == 'c') return k + 2 < p_.size() ? 2 + cp_len(k + 2) : throw ParseError{};
    if (d == 'x') {
      size_t n = 2;
      while (n < 4 && std::isxdigit(static_cast<unsigned char>(at(k + n)))) ++n;
      return n;
    }
    return 1 + cp_len(k + 1);
  }

  // \p{X} \P{X} \p{^X} \pX at k: returns the item and sets `len`.
  Item property_item(size_t k, size_t& len) const {
    bool negated = p_[k + 1] == 'P';
    std::string_view name;
    if (at(k + 2) == '{') {
      size_t e = through(k + 3, '}');
      name = p_.substr(k + 3, e - 1 - (k + 3));
      len = e - k;
    } else {
      if (k + 2 >= p_.size()) throw ParseError{};
      name = p_.substr(k + 2, 1);
      len = 3;
    }
    std::string_view src = p_.substr(k, len);
    if (!name.empty() && name[0] == '^') {
      negated = !negated;
      name.remove_prefix(1);
    }
    const UniFixup* fx = find_fixup(UniKind::Prop, name);
    std::string n(name);
    std::string pos = std::string(negated ? "\\P{" : "\\p{") + n + "}";
    std::string neg = std::string(negated ? "\\p{" : "\\P{") + n + "}";
    if (!fx) pos = std::string(src);
    return make_item(fx, negated, pos, neg);
  }

  // \s \S \d \D \w \W
  static Item type_item(char d) {
    char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(d)));
    bool negated = d != lower;
    char key[2] = {lower, 0};
    const UniFixup* fx = find_fixup(UniKind::Escape, key);
    std::string pos = std::string("\\") + d;
    std::string neg = std::string("\\") + static_cast<char>(negated ? lower : std::toupper(lower));
    return make_item(fx, negated, pos, neg);
  }

  // The reference's \w as an atom, or empty when \w needs no fixup.
  static std::string word_atom() {
    Item w = type_item('w');
    return w.fixed ? atom_text(w) : std::string();
  }

  static bool is_type_escape(char d) {
    return d == 's' || d == 'S' || d == 'd' || d == 'D' || d == 'w' || d == 'W';
  }

  void step() {
    const Group& g = groups_.back();
    char c = p_[i_];
    if (c == '\\') return escape_outside();
    if (c == '[') return char_class();
    if (c == '(') return open_group();
    if (c == ')') {
      if (groups_.size() > 1) groups_.pop_back();
      out_ += c;
      ++i_;
      return;
    }
    if (g.extended && c == '#') {  // comment to end of line
      size_t e = p_.find('\n', i_);
      e = e == std::string_view::npos ? p_.size() : e + 1;
      out_.append(p_.substr(i_, e - i_));
      i_ = e;
      return;
    }
    if (g.icase && !g.extended && !g.lookbehind && try_fold()) return;
    size_t n = cp_len(i_);
    out_.append(p_.substr(i_, n));
    i_ += n;
  }

  void escape_outside() {
    char d = at(i_ + 1);
    if (d == 'Q') {
      size_t e = p_.find("\\E", i_ + 2);
      e = e == std::string_view::npos ? p_.size() : e + 2;
      out_.append(p_.substr(i_, e - i_));
      i_ = e;
      return;
    }
    if (d == 'p' || d == 'P') {
      size_t len = 0;
      Item it = property_item(i_, len);
      out_ += it.fixed ? atom_text(it) : std::string(p_.substr(i_, len));
      i_ += len;
      return;
    }
    if (is_type_escape(d)) {
      Item it = type_item(d);
      out_ += it.fixed ? atom_text(it) : std::string(p_.substr(i_, 2));
      i_ += 2;
      return;
    }
    if (d == 'b' || d == 'B') {
      std::string w = word_atom();
      if (!w.empty()) {
        if (d == 'b')
          out_ += "(?:(?<=" + w + ")(?!" + w + ")|(?<!" + w + ")(?=" + w + "))";
        else
          out_ += "(?:(?<=" + w + ")(?=" + w + ")|(?<!" + w + ")(?!" + w + "))";
        i_ += 2;
        return;
      }
    }
    size_t n = escape_len(i_);
    out_.append(p_.substr(i_, n));
    i_ += n;
  }

  // A case-insensitive literal run listed as a Fold probe (e.g. "ss"): adds the single code
  // points the reference also accepts. Only plain letters not followed by a quantifier.
  bool try_fold() {
    for (const UniFixup& f : kUniFixups) {
      if (f.kind != UniKind::Fold) continue;
      std::string_view key = f.key;
      if (i_ + key.size() > p_.size()) continue;
      bool same = true;
      for (size_t k = 0; k < key.size() && same; ++k)
        same = std::tolower(static_cast<unsigned char>(p_[i_ + k])) == key[k];
      if (!same) continue;
      size_t e = i_ + key.size();
      char q = at(e);
      if (q == '*' || q == '+' || q == '?' || (q == '{' && (std::isdigit(static_cast<unsigned char>(at(e + 1))) || at(e + 1) == ',')))
        continue;
      out_ += "(?:" + std::string(p_.substr(i_, key.size())) + "|[" + ranges_text(to_ranges(f.add, f.n_add)) + "])";
      i_ = e;
      return true;
    }
    return false;
  }

  void open_group() {
    Group g = groups_.back();
    if (at(i_ + 1) == '*') {  // (*VERB), (*VERB:arg), (*pla:...) style groups
      size_t k = i_ + 2;
      while (k < p_.size() && (std::isalpha(static_cast<unsigned char>(p_[k])) || p_[k] == '_')) ++k;
      std::string name(p_.substr(i_ + 2, k - i_ - 2));
      bool lower_group = at(k) == ':' && !name.empty() && std::islower(static_cast<unsigned char>(name[0]));
      if (lower_group) {
        g.lookbehind = g.lookbehind || name == "plb" || name == "nlb" || name.find("lookbehind") != std::string::npos;
        groups_.push_back(g);
        out_.append(p_.substr(i_, k + 1 - i_));
        i_ = k + 1;
      } else {
        size_t e = through(k, ')');
        out_.append(p_.substr(i_, e - i_));
        i_ = e;
      }
      return;
    }
    if (at(i_ + 1) != '?') {
      groups_.push_back(g);
      out_ += '(';
      ++i_;
      return;
    }
    char d = at(i_ + 2);
    size_t copy_to = i_ + 2;  // what is copied verbatim (the group's introducer)
    bool push = true;
    switch (d) {
      case '#':
        copy_to = through(i_ + 2, ')');
        push = false;
        break;
      case ':': case '|': case '>': case '=': case '!':
        copy_to = i_ + 3;
        break;
      case '<':
        if (at(i_ + 3) == '=' || at(i_ + 3) == '!') {
          g.lookbehind = true;
          copy_to = i_ + 4;
        } else {
          copy_to = through(i_ + 3, '>');
        }
        break;
      case 'P':
        if (at(i_ + 3) == '<') {
          copy_to = through(i_ + 4, '>');
        } else {
          copy_to = through(i_ + 3, ')');
          push = false;
        }
        break;
      case '\'':
        copy_to = through(i_ + 3, '\'');
        break;
      case '(':  // conditional: a named / numbered condition is copied, an assertion is parsed
        copy_to = i_ + 2;
        if (at(i_ + 3) != '?' && at(i_ + 3) != '*') copy_to = through(i_ + 3, ')');
        break;
      default: {
        size_t k = i_ + 2;
        while (k < p_.size() && (std::isalpha(static_cast<unsigned char>(p_[k])) || p_[k] == '-' || p_[k] == '^')) ++k;
        bool flags = k > i_ + 2 && (at(k) == ')' || at(k) == ':') &&
                     std::string_view("CR").find(d) == std::string_view::npos;
        if (flags) {
          bool on = true;
          Group& target = at(k) == ')' ? groups_.back() : g;
          for (size_t j = i_ + 2; j < k; ++j) {
            char f = p_[j];
            if (f == '-') on = false;
            else if (f == '^') target.icase = target.extended = false;
            else if (f == 'i') target.icase = on;
            else if (f == 'x') target.extended = on;
          }
          push = at(k) == ':';
          copy_to = k + 1;
        } else {  // recursion / subroutine call / callout: (?R) (?1) (?&name) (?C..)
          copy_to = through(i_ + 2, ')');
          push = false;
        }
      }
    }
    if (push) groups_.push_back(g);
    out_.append(p_.substr(i_, copy_to - i_));
    i_ = copy_to;
  }

  // A [...] class starting at i_.
  void char_class() {
    size_t k = i_ + 1;
    bool negated = false;
    if (at(k) == '^') {
      negated = true;
      ++k;
    }
    struct Member {
      Item item;
      std::string text;  // source text when not fixed
    };
    std::vector<Member> members;
    bool first = true;
    for (;;) {
      if (k >= p_.size()) throw ParseError{};
      char c = p_[k];
      if (c == ']' && !first) break;
      first = false;
      if (c == '[' && at(k + 1) == ':') {  // POSIX [:name:] / [:^name:]
        size_t e = p_.find(":]", k + 2);
        std::string_view body = e == std::string_view::npos ? std::string_view() : p_.substr(k + 2, e - k - 2);
        bool ok = !body.empty() && body.size() < 16 &&
                  std::all_of(body.begin(), body.end(), [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)) || ch == '^' || ch == '<' || ch == '>'; });
        if (ok) {
          bool neg = body[0] == '^';
          std::string name(body.substr(neg ? 1 : 0));
          const UniFixup* fx = find_fixup(UniKind::Posix, name);
          std::string src(p_.substr(k, e + 2 - k));
          Item it = make_item(fx, neg, neg ? "[:^" + name + ":]" : "[:" + name + ":]",
                              neg ? "[:" + name + ":]" : "[:^" + name + ":]");
          members.push_back({std::move(it), src});
          k = e + 2;
          continue;
        }
      }
      if (c == '\\') {
        char d = at(k + 1);
        if (d == 'Q') {
          size_t e = p_.find("\\E", k + 2);
          if (e == std::string_view::npos) throw ParseError{};
          members.push_back({Item{}, std::string(p_.substr(k, e + 2 - k))});
          k = e + 2;
          continue;
        }
        if (d == 'p' || d == 'P') {
          size_t len = 0;
          Item it = property_item(k, len);
          members.push_back({std::move(it), std::string(p_.substr(k, len))});
          k += len;
          continue;
        }
        if (is_type_escape(d)) {
          members.push_back({type_item(d), std::string(p_.substr(k, 2))});
          k += 2;
          continue;
        }
        size_t n = escape_len(k);
        members.push_back({Item{}, std::string(p_.substr(k, n))});
        k += n;
        continue;
      }
      size_t n = cp_len(k);
      members.push_back({Item{}, std::string(p_.substr(k, n))});
      k += n;
    }
    size_t end = k + 1;  // past ']'

    bool any_fixed = false, any_rem = false;
    for (auto& m : members) {
      any_fixed = any_fixed || m.item.fixed;
      any_rem = any_rem || !m.item.rem.empty();
    }
    if (!any_fixed) {
      out_.append(p_.substr(i_, end - i_));
      i_ = end;
      return;
    }
    // in_text: every member as P plus its adds; c0_text: members with removals reduced to
    // their adds (they are added back as separate branches).
    std::string in_text, c0_text, branches;
    Ranges all_rem;
    for (auto& m : members) {
      if (!m.item.fixed) {
        in_text += m.text;
        c0_text += m.text;
        continue;
      }
      std::string adds = ranges_text(m.item.add);
      in_text += m.item.pos + adds;
      if (m.item.rem.empty()) {
        c0_text += m.item.pos + adds;
      } else {
        c0_text += adds;
        branches += "|[^" + m.item.neg + ranges_text(m.item.rem) + "]";
        all_rem.insert(all_rem.end(), m.item.rem.begin(), m.item.rem.end());
      }
    }
    if (!c0_text.empty() && c0_text[0] == '^') c0_text = "\\" + c0_text;
    if (!any_rem) {
      out_ += std::string(negated ? "[^" : "[") + in_text + "]";
    } else {
      std::string uni = c0_text.empty() ? "(?:" + branches.substr(1) + ")" : "(?:[" + c0_text + "]" + branches + ")";
      if (!negated)
        out_ += uni;
      else
        out_ += "(?:[^" + in_text + "]|(?!" + uni + ")[" + ranges_text(all_rem) + "])";
    }
    i_ = end;
  }
};

}  // namespace

std::string rewrite_for_reference_unicode(std::string_view pattern) {
  try {
    return Rewriter(pattern).run();
  } catch (const ParseError&) {
    return std::string(pattern);
  }
}

}  // namespace dsinfer
