// dsinfer tokenizer floor: PCRE2 wrapper (see regex.h). The JIT stack is per thread and
// grows to 8 MiB, enough for pre-tokenizer patterns on multi-megabyte inputs; should a match
// still hit a resource limit we retry without JIT and then report an Error, never crash.
// Patterns are compiled after rewrite_for_reference_unicode (regex_unicode.cpp), so that
// property classes follow the reference's Unicode tables rather than PCRE2 10.42's.
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <memory>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dsinfer {

namespace {

struct JitStack {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  JitStack() {
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    if (stack && ctx) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~JitStack() {
    if (ctx) pcre2_match_context_free(ctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

pcre2_match_context* thread_match_context() {
  thread_local JitStack js;
  return js.ctx;
}

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(md); }
};

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : where_(where) {
  auto compile = [](const std::string& p, int& err, PCRE2_SIZE& off) {
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err,
                         &off, nullptr);
  };
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string rewritten = rewrite_for_reference_unicode(pattern);
  pcre2_code* code = compile(rewritten, err, off);
  if (!code) {
    // Report errors against the user's pattern; a rewrite that breaks a valid pattern is a bug.
    int err0 = 0;
    PCRE2_SIZE off0 = 0;
    pcre2_code* orig = compile(pattern, err0, off0);
    if (!orig)
      throw Error(where + ": invalid regex at offset " + std::to_string(off0) + ": " + pcre2_message(err0));
    pcre2_code_free(orig);
    throw Error(where + ": internal error: Unicode-table rewrite of the regex does not compile (offset " +
                std::to_string(off) + ": " + pcre2_message(err) + ")");
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::match_at(std::string_view s, size_t start, size_t& ms, size_t& me, void* mdp) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* md = static_cast<pcre2_match_data*>(mdp);
  // Inputs are validated (or produced by us) as UTF-8 before they get here.
  uint32_t opts = PCRE2_NO_UTF_CHECK;
  int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, opts, md,
                       jit_ ? thread_match_context() : nullptr);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit_) {
    // JIT resource limit: fall back to the interpreter, which has its own (heap) limits.
    rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start,
                     opts | PCRE2_NO_JIT, md, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error(where_ + ": regex match failed: " + pcre2_message(rc));
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  ms = ov[0];
  me = ov[1];
  if (me < ms) me = ms;  // \K can produce this; treat as empty
  return true;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  MatchData md(static_cast<pcre2_code*>(code_));
  if (!md.md) throw Error(where_ + ": out of memory");
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t ms, me;
    if (!match_at(s, pos, ms, me, md.md)) break;
    out.emplace_back(ms, me);
    if (me > pos && me > ms) {
      pos = me;
    } else {
      // Empty match: step one code point past it so that the scan makes progress.
      if (ms >= s.size()) break;
      pos = ms + utf8_lead_len(static_cast<unsigned char>(s[ms]));
    }
  }
  return out;
}

bool Regex::search(std::string_view s) const {
  MatchData md(static_cast<pcre2_code*>(code_));
  if (!md.md) throw Error(where_ + ": out of memory");
  size_t ms, me;
  return match_at(s, 0, ms, me, md.md);
}

std::string Regex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    unsigned char u = static_cast<unsigned char>(c);
    bool plain = u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                 (c >= 'A' && c <= 'Z') || c == '_';
    if (plain) {
      out += c;
    } else if (c == '\0') {
      out += "\\x{0}";
    } else {
      out += '\\';
      out += c;
    }
  }
  return out;
}

}  // namespace dsinfer
