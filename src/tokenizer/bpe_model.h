// dsinfer tokenizer floor: the BPE model of tokenizer.json ("model": {"type": "BPE"}).
// Input: one pre-token (already byte-level mapped when the pipeline has a ByteLevel
// pre-tokenizer); output: its token ids. Merging uses a rank map keyed by the id pair and a
// min-heap of candidate merges (lowest rank first, leftmost on ties, the order Hugging Face
// applies them in), so a pre-token of n symbols costs O(n log n). Results are cached per
// pre-token string (bounded, mutex-protected: encode() is const and may run on many threads).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/components.h"

namespace dsinfer {

class BpeModel {
 public:
  // `j` is the "model" object. Accepts merges as ["a b", ...] or [["a","b"], ...].
  BpeModel(const nlohmann::json& j, const JsonWhere& where);

  // Appends the ids of one pre-token to `out`.
  void tokenize(const std::string& piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view tok) const;
  // Empty view when `id` is not in the model's vocab.
  std::string_view id_to_token(int32_t id) const;
  // One past the largest id in the vocab.
  int32_t vocab_end() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  void merge_word(const std::string& piece, std::vector<int32_t>& out) const;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  struct Merge { int32_t rank, new_id; };
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  static constexpr size_t kCacheMax = 1 << 16;       // entries before the cache is reset
  static constexpr size_t kCacheMaxPieceBytes = 256;  // longer pieces are not cached
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace dsinfer
