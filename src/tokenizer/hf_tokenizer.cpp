// dsinfer tokenizer floor: loading tokenizer.json / tokenizer_config.json and the
// encode/decode pipeline (see hf_tokenizer.h for the data flow).
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"
#include "tokenizer/utf8.h"

namespace dsinfer {

using json = nlohmann::json;

namespace {

// Last / first code point of a valid UTF-8 string.
uint32_t last_cp(std::string_view s) {
  size_t st = s.size() - 1;
  while (st > 0 && (static_cast<uint8_t>(s[st]) & 0xC0) == 0x80) --st;
  return utf8_next(s, st);
}
uint32_t first_cp(std::string_view s) {
  size_t i = 0;
  return utf8_next(s, i);
}

}  // namespace

// ---- added-token trie -----------------------------------------------------------------------

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  auto it = edges_.find((static_cast<uint64_t>(node) << 8) | b);
  return it == edges_.end() ? -1 : it->second;
}

void AddedTokenMatcher::add(const std::string& content, int32_t index) {
  if (content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : content) {
    int32_t nx = child(node, c);
    if (nx < 0) {
      nx = static_cast<int32_t>(terminal_.size());
      terminal_.push_back(-1);
      edges_[(static_cast<uint64_t>(node) << 8) | c] = nx;
    }
    node = nx;
  }
  if (terminal_[static_cast<size_t>(node)] < 0) terminal_[static_cast<size_t>(node)] = index;
  first_byte_[static_cast<unsigned char>(content[0])] = true;
}

std::vector<AddedTokenMatcher::Match> AddedTokenMatcher::find_all(std::string_view s) const {
  std::vector<Match> out;
  if (empty()) return out;
  size_t i = 0;
  while (i < s.size()) {
    if (!first_byte_[static_cast<unsigned char>(s[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < s.size(); ++j) {
      node = child(node, static_cast<uint8_t>(s[j]));
      if (node < 0) break;
      if (terminal_[static_cast<size_t>(node)] >= 0) {
        best = terminal_[static_cast<size_t>(node)];
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      out.push_back({i, best_end, best});
      i = best_end;
    } else {
      ++i;
    }
  }
  return out;
}

// ---- loading ----------------------------------------------------------------------------------

HfTokenizer::HfTokenizer(const std::string& path, const std::string& config_path) {
  json j = read_json_file(path);
  JsonWhere root{path, ""};
  if (!j.is_object()) throw Error(path + ": expected a JSON object at top level");

  const json& model = j.contains("model") ? j["model"] : json();
  if (!model.is_object()) root.at("model").fail("missing or not an object");
  std::string type = model.contains("type") && model["type"].is_string() ? model["type"].get<std::string>()
                     : (model.contains("merges") ? "BPE" : "");
  if (type != "BPE") root.at("model").at("type").fail("unsupported '" + type + "'");
  model_ = std::make_unique<BpeModel>(model, root.at("model"));

  auto get = [&](const char* k) -> const json& {
    static const json null_json;
    auto it = j.find(k);
    return it == j.end() ? null_json : *it;
  };
  normalizer_ = make_normalizer(get("normalizer"), root.at("normalizer"));
  pre_tokenizer_ = make_pre_tokenizer(get("pre_tokenizer"), root.at("pre_tokenizer"));
  decoder_ = make_decoder(get("decoder"), root.at("decoder"));
  // post_processor only adds BOS/EOS-style tokens when asked to; dsinfer never is, so any
  // post_processor is accepted and ignored.

  vocab_size_ = model_->vocab_end();
  const json& added = get("added_tokens");
  if (!added.is_null() && !added.is_array()) root.at("added_tokens").fail("expected an array");
  for (size_t i = 0; added.is_array() && i < added.size(); ++i) {
    JsonWhere w = root.at("added_tokens").at(i);
    const json& a = added[i];
    if (!a.is_object()) w.fail("expected an object");
    AddedToken t;
    if (!a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() > (1 << 30))
      w.at("id").fail("missing or not a valid id");
    t.id = a["id"].get<int32_t>();
    if (!a.contains("content") || !a["content"].is_string()) w.at("content").fail("missing or not a string");
    t.content = a["content"].get<std::string>();
    if (t.content.empty()) w.at("content").fail("empty");
    if (!utf8_valid(t.content)) w.at("content").fail("invalid UTF-8");
    auto flag = [&](const char* k, bool dflt) {
      if (!a.contains(k) || a[k].is_null()) return dflt;
      if (!a[k].is_boolean()) w.at(k).fail("expected true or false");
      return a[k].get<bool>();
    };
    t.special = flag("special", false);
    t.lstrip = flag("lstrip", false);
    t.rstrip = flag("rstrip", false);
    t.single_word = flag("single_word", false);
    t.normalized = flag("normalized", !t.special);
    added_by_id_[t.id] = added_.size();
    added_by_content_[t.content] = t.id;
    vocab_size_ = std::max(vocab_size_, t.id + 1);
    added_.push_back(std::move(t));
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    if (t.normalized && normalizer_) normalized_matcher_.add(normalizer_->normalize(t.content), static_cast<int32_t>(i));
    else if (t.normalized) normalized_matcher_.add(t.content, static_cast<int32_t>(i));
    else raw_matcher_.add(t.content, static_cast<int32_t>(i));
  }
  if (!config_path.empty()) load_config(config_path);
}

void HfTokenizer::load_config(const std::string& path) {
  json c = read_json_file(path);
  JsonWhere root{path, ""};
  if (!c.is_object()) throw Error(path + ": expected a JSON object at top level");
  auto token_field = [&](const char* k) -> std::string {
    auto it = c.find(k);
    if (it == c.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      return (*it)["content"].get<std::string>();
    root.at(k).fail("expected a string or {\"content\": ...}");
  };
  bos_ = token_field("bos_token");
  eos_ = token_field("eos_token");
  auto ct = c.find("chat_template");
  if (ct != c.end() && !ct->is_null()) {
    if (ct->is_string()) {
      chat_template_ = ct->get<std::string>();
    } else if (ct->is_array()) {
      // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]: take "default".
      for (auto& e : *ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          chat_template_ = e["template"].get<std::string>();
    } else {
      root.at("chat_template").fail("expected a string or a list of named templates");
    }
  }
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& dir) {
  std::string base = dir.empty() ? std::string(".") : dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string tj = base + "/tokenizer.json";
  if (!file_exists(tj)) throw Error(tj + ": not found (the model directory must hold a Hugging Face tokenizer.json)");
  std::string cfg = base + "/tokenizer_config.json";
  return std::make_unique<HfTokenizer>(tj, file_exists(cfg) ? cfg : "");
}

// ---- encode -----------------------------------------------------------------------------------

std::vector<HfTokenizer::Span> HfTokenizer::split_added(std::string_view s, const AddedTokenMatcher& m,
                                                        bool parse_special) const {
  std::vector<Span> spans;
  size_t start_offset = 0;
  for (const auto& mt : m.find_all(s)) {
    const AddedToken& t = added_[static_cast<size_t>(mt.index)];
    size_t a = mt.begin, b = mt.end;
    if (t.special && !parse_special) continue;  // the text stays and is tokenized as text
    if (t.single_word) {
      bool word_before = a > 0 && unicode_word_char(last_cp(s.substr(0, a)));
      bool word_after = b < s.size() && unicode_word_char(first_cp(s.substr(b)));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t na = a;
      while (na > 0) {
        size_t st = na - 1;
        while (st > 0 && (static_cast<uint8_t>(s[st]) & 0xC0) == 0x80) --st;
        size_t k = st;
        if (!unicode_white_space(utf8_next(s, k))) break;
        na = st;
      }
      a = std::max(na, start_offset);
    }
    if (t.rstrip) {
      while (b < s.size()) {
        size_t k = b;
        if (!unicode_white_space(utf8_next(s, k))) break;
        b = k;
      }
    }
    if (a < start_offset) continue;  // overlaps what an rstrip already consumed
    if (start_offset < a) spans.push_back({start_offset, a, -1});
    spans.push_back({a, b, t.id});
    start_offset = b;
  }
  if (start_offset < s.size()) spans.push_back({start_offset, s.size(), -1});
  return spans;
}

void HfTokenizer::encode_text(std::string_view s, bool parse_special, std::vector<int32_t>& out) const {
  std::string norm = normalizer_ ? normalizer_->normalize(s) : std::string(s);
  std::vector<Span> spans;
  if (normalized_matcher_.empty()) spans.push_back({0, norm.size(), -1});
  else spans = split_added(norm, normalized_matcher_, parse_special);
  for (const Span& sp : spans) {
    if (sp.id >= 0) {
      out.push_back(sp.id);
      continue;
    }
    std::vector<std::string> pieces{norm.substr(sp.begin, sp.end - sp.begin)};
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    for (const auto& p : pieces) model_->tokenize(p, out);
  }
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool parse_special) const {
  size_t bad = utf8_invalid_offset(text);
  if (bad != std::string_view::npos) throw Error("prompt: invalid UTF-8 at byte " + std::to_string(bad));
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  for (const Span& sp : split_added(text, raw_matcher_, parse_special)) {
    if (sp.id >= 0) out.push_back(sp.id);
    else encode_text(text.substr(sp.begin, sp.end - sp.begin), parse_special, out);
  }
  return out;
}

// ---- decode / lookups ---------------------------------------------------------------------------

std::string_view HfTokenizer::token_of(int32_t id) const {
  auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return added_[it->second].content;
  return model_->id_to_token(id);
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  const std::string_view t = token_of(id);
  if (t.empty()) throw Error("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                             std::to_string(vocab_size_) + ")");
  return std::string(t);
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  // An id with no token (a model's vocabulary padded past the tokenizer's, or a gap between
  // the model's ids and the added tokens') decodes to nothing, as Hugging Face's decode
  // skips it: a generated id must never make a stream or a server fail.
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    const std::string_view t = token_of(id);
    if (!t.empty()) tokens.emplace_back(t);
  }
  if (decoder_) decoder_->decode_chain(tokens);
  else if (tokens.size() > 1) {
    // Hugging Face joins with a space when there is no decoder.
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    tokens.assign(1, joined);
  }
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(std::string(token));
  if (it != added_by_content_.end()) return it->second;
  return model_->token_to_id(token);
}

bool HfTokenizer::is_special(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

}  // namespace dsinfer
