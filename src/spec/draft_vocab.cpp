// dsinfer speculation floor: reduced draft vocabulary (see draft_vocab.h).
#include "spec/draft_vocab.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"

namespace dsinfer {

using json = nlohmann::json;

DraftVocabRanking rank_token_counts(const std::vector<uint64_t>& counts) {
  DraftVocabRanking r;
  r.ranked_ids.resize(counts.size());
  std::iota(r.ranked_ids.begin(), r.ranked_ids.end(), 0);
  std::stable_sort(r.ranked_ids.begin(), r.ranked_ids.end(),
                   [&](int32_t a, int32_t b) { return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)]; });
  r.counts.reserve(counts.size());
  for (int32_t id : r.ranked_ids) {
    r.counts.push_back(counts[static_cast<size_t>(id)]);
    r.total_tokens += counts[static_cast<size_t>(id)];
  }
  return r;
}

DraftVocabRanking read_draft_vocab(const std::string& path, int vocab_size) {
  const json j = read_json_file(path);
  const auto fail = [&](const std::string& field, const std::string& why) -> void {
    throw Error(path + ": field '" + field + "': " + why);
  };
  if (!j.is_object()) throw Error(path + ": expected a JSON object");
  DraftVocabRanking r;
  if (!j.contains("ranked_ids") || !j.at("ranked_ids").is_array()) fail("ranked_ids", "missing or not a list");
  const json& ids = j.at("ranked_ids");
  if (static_cast<int64_t>(ids.size()) != vocab_size)
    fail("ranked_ids", std::to_string(ids.size()) + " ids, but the vocabulary has " + std::to_string(vocab_size) +
                           " (ranked for another tokenizer?)");
  std::vector<char> seen(static_cast<size_t>(vocab_size), 0);
  r.ranked_ids.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer()) fail("ranked_ids", "item " + std::to_string(i) + " is not an integer");
    const int64_t id = ids[i].get<int64_t>();
    if (id < 0 || id >= vocab_size)
      fail("ranked_ids", "id " + std::to_string(id) + " outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    if (seen[static_cast<size_t>(id)]++) fail("ranked_ids", "id " + std::to_string(id) + " listed twice");
    r.ranked_ids.push_back(static_cast<int32_t>(id));
  }
  if (j.contains("counts")) {
    const json& c = j.at("counts");
    if (!c.is_array() || c.size() != ids.size()) fail("counts", "expected a list as long as ranked_ids");
    for (size_t i = 0; i < c.size(); ++i) {
      if (!c[i].is_number_unsigned() && !(c[i].is_number_integer() && c[i].get<int64_t>() >= 0))
        fail("counts", "item " + std::to_string(i) + " is not a non-negative integer");
      r.counts.push_back(c[i].get<uint64_t>());
      if (i > 0 && r.counts[i] > r.counts[i - 1]) fail("counts", "not in descending order at item " + std::to_string(i));
      r.total_tokens += r.counts[i];
    }
  }
  if (j.contains("default_size")) {
    const json& d = j.at("default_size");
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > vocab_size)
      fail("default_size", "expected an integer in [0, " + std::to_string(vocab_size) + "]");
    r.default_size = d.get<int>();
  }
  if (j.contains("source") && j.at("source").is_string()) r.source = j.at("source").get<std::string>();
  return r;
}

void write_draft_vocab(const std::string& path, const DraftVocabRanking& r) {
  json j;
  j["format"] = "dsinfer draft vocabulary ranking, v1";
  j["source"] = r.source;
  j["total_tokens"] = r.total_tokens;
  j["default_size"] = r.default_size;
  j["ranked_ids"] = r.ranked_ids;
  j["counts"] = r.counts;
  write_text_file(path, j.dump() + "\n");
}

std::vector<int32_t> draft_vocab_subset(const DraftVocabRanking& r, int n) {
  if (n <= 0 || static_cast<size_t>(n) > r.ranked_ids.size())
    throw Error("--draft-vocab: " + std::to_string(n) + " is outside [1, " + std::to_string(r.ranked_ids.size()) + "]");
  std::vector<int32_t> ids(r.ranked_ids.begin(), r.ranked_ids.begin() + n);
  std::sort(ids.begin(), ids.end());
  return ids;
}

double draft_vocab_coverage(const DraftVocabRanking& r, int n) {
  if (r.total_tokens == 0 || r.counts.empty()) return 0.0;
  uint64_t c = 0;
  for (int i = 0; i < n && static_cast<size_t>(i) < r.counts.size(); ++i) c += r.counts[static_cast<size_t>(i)];
  return static_cast<double>(c) / static_cast<double>(r.total_tokens);
}

DraftVocab::DraftVocab(std::vector<int32_t> ids, int vocab) : ids_(std::move(ids)), V_(vocab) {
  in_subset_.assign(static_cast<size_t>(vocab), 0);
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (ids_[i] < 0 || ids_[i] >= vocab || (i > 0 && ids_[i] <= ids_[i - 1]))
      throw Error("draft vocabulary: ids must be ascending and within [0, " + std::to_string(vocab) + ")");
    in_subset_[static_cast<size_t>(ids_[i])] = 1;
  }
}

void DraftVocab::add_context(DraftVocabExtras& x, const int32_t* tokens, int c, const WeightView& head,
                             const WeightView* w2) const {
  if (!tokens || c <= 0) return;
  if (x.seen.empty()) x.seen = in_subset_;
  const size_t head_bytes = static_cast<size_t>(head.cols) * dtype_size(head.dtype);
  const size_t w2_bytes = w2 ? static_cast<size_t>(w2->cols) * dtype_size(w2->dtype) : 0;
  for (int i = 0; i < c; ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= V_ || x.seen[static_cast<size_t>(t)]) continue;  // out-of-range ids are the caller's to refuse
    x.seen[static_cast<size_t>(t)] = 1;
    x.ids.push_back(t);
    const auto* h = static_cast<const uint8_t*>(head.data) + static_cast<size_t>(t) * head_bytes;
    x.head_rows.insert(x.head_rows.end(), h, h + head_bytes);
    if (w2) {
      const auto* w = static_cast<const uint8_t*>(w2->data) + static_cast<size_t>(t) * w2_bytes;
      x.w2_rows.insert(x.w2_rows.end(), w, w + w2_bytes);
    }
  }
}

WeightView DraftVocab::rows_view(const std::vector<uint8_t>& rows, const WeightView& full, size_t n) {
  WeightView v;
  v.data = rows.data();
  v.dtype = full.dtype;
  v.rows = static_cast<int64_t>(n);
  v.cols = full.cols;
  return v;
}

WeightView gather_rows(const WeightView& w, const std::vector<int32_t>& ids, std::vector<uint8_t>& storage) {
  const size_t row_bytes = static_cast<size_t>(w.cols) * dtype_size(w.dtype);
  storage.resize(ids.size() * row_bytes);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= w.rows)
      throw Error("draft vocabulary: id " + std::to_string(ids[i]) + " outside the matrix's " + std::to_string(w.rows) +
                  " rows");
    std::memcpy(storage.data() + i * row_bytes, src + static_cast<size_t>(ids[i]) * row_bytes, row_bytes);
  }
  WeightView v;
  v.data = storage.data();
  v.dtype = w.dtype;
  v.rows = static_cast<int64_t>(ids.size());
  v.cols = w.cols;
  return v;
}

}  // namespace dsinfer
