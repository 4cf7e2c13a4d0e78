// dsinfer speculation floor: a reduced draft vocabulary (frequency-ranked drafting, as in
// FR-Spec, Zhao et al. 2025, and EAGLE-3's draft-to-target id map).
//
// Why: a block drafter computes an LM-head row (V x H) for every drafted position, and a
// DSpark Markov head a W2 product (V x r) per position on top; with the small backbones
// drafters have, those vocabulary-sized products are a large share of a round (the shipped
// DSpark drafter: ~45 % of its pass on this CPU). Restricting the DRAFT to the N most
// frequent ids costs N/V of that, and stays lossless: the target verifies every draft against
// its full distribution, and a draft distribution q that is zero outside the subset is still
// a valid proposal for rejection sampling. Only acceptance can move, by the share of tokens
// the subset misses.
//
// A fixed subset misses what a sequence copies from its own context (identifiers in code,
// names in prose: rare in a corpus, frequent in one document). Measured on the shipped
// model's greedy outputs of the held-out prompts, the top 256 ids alone cover 57-61 % of the
// generated tokens, the top 256 plus the ids already in the sequence 96-97 %, and a fixed top
// 6144 of 8192 cut τ by a fifth on a code prompt where top 64 + own ids kept it (docs/
// PERFORMANCE.md, session 13). So the draft vocabulary of a
// sequence is the ranked subset ∪ its committed ids (DraftVocabExtras, grown at every
// commit: tens of rows per sequence).
//
// Data flow: `dsinfer draft-vocab` tokenizes a text corpus and writes draft_vocab.json
// (every id of the vocabulary, most frequent first, with its count and a default size);
// load_drafter reads it (from the drafter's directory, else the target's, or
// --draft-vocab-file), takes the first N ids (--draft-vocab N, or the file's default_size),
// and hands them, sorted by id, to the drafter, which gathers those rows of its LM head and
// Markov W2 once at load time (gather_rows) and maps its argmax/sample back to real ids.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace dsinfer {

struct DraftVocabRanking {
  std::vector<int32_t> ranked_ids;  // every id of the vocabulary, most frequent first (ties: lower id first)
  std::vector<uint64_t> counts;     // count of ranked_ids[i] in the corpus
  int default_size = 0;             // ids a drafter uses unless told otherwise (0: the whole vocabulary)
  uint64_t total_tokens = 0;        // tokens counted
  std::string source;               // what was counted (free text, for the record)
};

// Ranks ids 0..counts.size()-1 by count, descending; equal counts by id, ascending.
DraftVocabRanking rank_token_counts(const std::vector<uint64_t>& counts);

// Reads and validates a draft_vocab.json against a vocabulary of vocab_size ids: ranked_ids
// must be a permutation of [0, vocab_size), counts as long and non-increasing, default_size in
// [0, vocab_size]. Every refusal is one dsinfer::Error line naming the file and field.
DraftVocabRanking read_draft_vocab(const std::string& path, int vocab_size);
void write_draft_vocab(const std::string& path, const DraftVocabRanking& r);

// The first n ranked ids, sorted ascending (so argmax ties resolve to the lower real id, as
// over the full vocabulary). 0 < n <= ranked_ids.size().
std::vector<int32_t> draft_vocab_subset(const DraftVocabRanking& r, int n);

// Share of the counted tokens that the first n ranked ids cover, in [0, 1].
double draft_vocab_coverage(const DraftVocabRanking& r, int n);

// The per-sequence part: committed ids outside the ranked subset, in first-seen order, with
// their rows of the LM head and of the Markov W2 (when the drafter has one). A drafted index
// c < subset size is subset id c; c >= it is ids[c - subset size].
struct DraftVocabExtras {
  std::vector<int32_t> ids;
  std::vector<uint8_t> seen;       // [V]: 1 once the id is in the subset or in ids
  std::vector<uint8_t> head_rows;  // ids.size() rows of the LM head, its dtype
  std::vector<uint8_t> w2_rows;    // ids.size() rows of W2 (empty without a Markov head)
};

// The ranked subset shared by every sequence of a drafter (immutable after load).
class DraftVocab {
 public:
  DraftVocab() = default;
  // ids: ascending, within [0, vocab).
  DraftVocab(std::vector<int32_t> ids, int vocab);
  bool empty() const { return ids_.empty(); }
  int size() const { return static_cast<int>(ids_.size()); }
  const std::vector<int32_t>& ids() const { return ids_; }
  // Adds tokens[0..c) not yet covered to x, copying their rows of `head` and, when non-null,
  // of `w2` (both full-vocabulary matrices).
  void add_context(DraftVocabExtras& x, const int32_t* tokens, int c, const WeightView& head, const WeightView* w2) const;
  // The real id of drafted index c.
  int32_t token(int c, const DraftVocabExtras& x) const {
    return c < size() ? ids_[static_cast<size_t>(c)] : x.ids[static_cast<size_t>(c - size())];
  }
  // q_full[token(j, x)] = probs[j] for j < size() + x.ids.size(): a draft distribution over
  // the draft ids written into a whole-vocabulary row (the caller zeroed it).
  void scatter(const std::vector<float>& probs, const DraftVocabExtras& x, float* q_full) const {
    for (size_t j = 0; j < probs.size(); ++j) q_full[token(static_cast<int>(j), x)] = probs[j];
  }
  // Views over x's rows (x.ids.size() rows; cols and dtype of the full matrix).
  static WeightView rows_view(const std::vector<uint8_t>& rows, const WeightView& full, size_t n);

 private:
  std::vector<int32_t> ids_;
  std::vector<uint8_t> in_subset_;  // [V]
  int V_ = 0;
};

// A view of rows `ids` of `w` (ids.size() x w.cols, same dtype), copied into `storage`, which
// the caller keeps alive as long as the view. Throws for an id outside [0, w.rows).
WeightView gather_rows(const WeightView& w, const std::vector<int32_t>& ids, std::vector<uint8_t>& storage);

}  // namespace dsinfer
