// dsinfer tokenizer floor: StreamingDetokenizer. Each pushed id is decoded to its bytes
// and appended to a pending buffer; the longest prefix that ends on a code-point boundary is
// released (bytes that can never complete are replaced by U+FFFD), the incomplete tail is
// held back for the next id. With byte-level BPE, decoding ids one at a time and
// concatenating equals decoding them together, so the released text is exactly decode(all).
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dsinfer {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string StreamingDetokenizer::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.decode({id}, skip_special_);
  size_t n = utf8_complete_prefix(pending_);
  if (n == 0) return {};
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsinfer
