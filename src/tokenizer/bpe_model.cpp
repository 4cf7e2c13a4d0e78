// dsinfer tokenizer floor: BPE model (see bpe_model.h for the data flow).
#include "tokenizer/bpe_model.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dsinfer {

using json = nlohmann::json;

BpeModel::BpeModel(const json& j, const JsonWhere& w) {
  auto it = j.find("vocab");
  if (it == j.end() || !it->is_object()) w.at("vocab").fail("expected an object of token -> id");
  int32_t max_id = -1;
  vocab_.reserve(it->size());
  for (auto& [tok, idv] : it->items()) {
    if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() > (1 << 30))
      w.at("vocab").fail("id of '" + tok + "' is not a valid id");
    int32_t id = idv.get<int32_t>();
    vocab_[tok] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  for (auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = tok;

  auto get_bool = [&](const char* k) {
    auto b = j.find(k);
    if (b == j.end() || b->is_null()) return false;
    if (!b->is_boolean()) w.at(k).fail("expected true or false");
    return b->get<bool>();
  };
  fuse_unk_ = get_bool("fuse_unk");
  byte_fallback_ = get_bool("byte_fallback");
  ignore_merges_ = get_bool("ignore_merges");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto s = j.find(k);
    if (s != j.end() && !s->is_null() && !(s->is_string() && s->get<std::string>().empty()))
      w.at(k).fail("unsupported non-empty value");
  }
  auto dr = j.find("dropout");
  if (dr != j.end() && !dr->is_null() && !(dr->is_number() && dr->get<double>() == 0.0))
    w.at("dropout").fail("unsupported (BPE dropout is a training-time feature)");
  auto unk = j.find("unk_token");
  if (unk != j.end() && !unk->is_null()) {
    if (!unk->is_string()) w.at("unk_token").fail("expected a string");
    auto u = vocab_.find(unk->get<std::string>());
    if (u == vocab_.end()) w.at("unk_token").fail("'" + unk->get<std::string>() + "' is not in model.vocab");
    unk_id_ = u->second;
  }

  auto m = j.find("merges");
  if (m == j.end() || m->is_null()) return;
  if (!m->is_array()) w.at("merges").fail("expected an array");
  merges_.reserve(m->size());
  for (size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    std::string a, b;
    if (e.is_string()) {
      // "a b": exactly one separating space (byte-level tokens never contain a raw space).
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        w.at("merges").at(i).fail("expected \"a b\" with exactly one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      w.at("merges").at(i).fail("expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      w.at("merges").at(i).fail("merge '" + a + "' + '" + b + "' uses a token missing from model.vocab");
    // Later duplicates win, as in Hugging Face (its merge map is built by collecting in order).
    merges_[pair_key(ia->second, ib->second)] = {static_cast<int32_t>(i), iab->second};
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view tok) const {
  auto it = vocab_.find(std::string(tok));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string_view BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return {};
  return id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::tokenize(const std::string& piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(piece, ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheMax) cache_.clear();
    cache_.emplace(piece, ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

void BpeModel::merge_word(const std::string& piece, std::vector<int32_t>& out) const {
  // Symbols: one per char of the piece, as a doubly linked list over a vector.
  struct Sym { int32_t id; int32_t prev, next; bool alive; };
  std::vector<Sym> syms;
  syms.reserve(piece.size());
  auto push = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1, true});
  };
  bool last_unk = false;
  for (size_t i = 0; i < piece.size();) {
    size_t st = i;
    size_t len = utf8_lead_len(static_cast<unsigned char>(piece[i]));
    if (i + len > piece.size()) len = piece.size() - i;
    i += len;
    std::string ch = piece.substr(st, len);
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      push(it->second);
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      std::vector<int32_t> bytes;
      for (unsigned char c : ch) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", c);
        auto bt = vocab_.find(name);
        if (bt == vocab_.end()) { all = false; break; }
        bytes.push_back(bt->second);
      }
      if (all) {
        for (int32_t b : bytes) push(b);
        last_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && last_unk)) push(*unk_id_);
      last_unk = true;
    }
    // No vocab entry, no byte fallback, no unk: Hugging Face drops the char; so do we.
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  struct Cand { int32_t rank, pos, new_id; };
  auto worse = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto consider = [&](int32_t pos) {
    int32_t nx = syms[static_cast<size_t>(pos)].next;
    if (nx < 0) return;
    auto it = merges_.find(pair_key(syms[static_cast<size_t>(pos)].id, syms[static_cast<size_t>(nx)].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(syms.size()); ++p) consider(p);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& s = syms[static_cast<size_t>(c.pos)];
    if (!s.alive || s.next < 0) continue;
    Sym& n = syms[static_cast<size_t>(s.next)];
    // Stale candidate: one side has merged since it was pushed.
    auto it = merges_.find(pair_key(s.id, n.id));
    if (it == merges_.end() || it->second.new_id != c.new_id || it->second.rank != c.rank) continue;
    s.id = c.new_id;
    n.alive = false;
    s.next = n.next;
    if (s.next >= 0) syms[static_cast<size_t>(s.next)].prev = c.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(c.pos);
  }
  for (int32_t p = 0; p >= 0; p = syms[static_cast<size_t>(p)].next) out.push_back(syms[static_cast<size_t>(p)].id);
}

}  // namespace dsinfer
