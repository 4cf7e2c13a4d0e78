// dsinfer engine: single-sequence generation with sampling, stop ids, stop strings and a
// token budget, streaming text through a callback; plain or speculative decoding.
//
// Data flow: prompt ids -> SpecDecoder::prefill (Model::forward, logits of the last row,
// sampled) -> first id; then rounds (SpecDecoder::round, speculative.h): the drafter
// proposes, one target forward verifies [anchor, drafts], the lossless rule accepts a
// prefix and adds one token. Every id of a round goes, in order, through stop-id check ->
// StreamingDetokenizer -> stop-string matcher (holds back text that could still become a
// stop string) -> on_text callback; a stop ends generation at that id.
//
// Plain decoding is the same loop with no drafter: each round verifies just the anchor,
// i.e. one forward of one token, and samples from its row. Greedy speculative output is
// bit-identical to it (batch-invariant target forward); sampled output has the same
// distribution.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/speculative.h"
#include "sampling/sampler.h"

namespace dsinfer {

class Model;
class Tokenizer;

struct StopConditions {
  int max_tokens = 256;                  // generated tokens, > 0
  std::vector<int32_t> stop_ids;         // e.g. the model's eos ids
  std::vector<std::string> stop_strings; // text never includes the stop string
};

struct GenerationResult {
  std::vector<int32_t> ids;   // generated ids (the token completing a stop string included)
  std::string text;           // detokenized output, cut before any stop string
  std::string finish_reason;  // "stop" (stop id or string) | "length"
  int prompt_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;  // time for generated tokens after the first
  SpecStats spec;               // rounds, tau, acceptance per draft position, timings
};

// Streams text pieces (complete UTF-8) as they become final. tok may be null (no text).
using TextCallback = std::function<void(std::string_view)>;

GenerationResult generate(Model& model, const Tokenizer* tok, const std::vector<int32_t>& prompt,
                          const SamplingParams& sampling, const StopConditions& stop,
                          const TextCallback& on_text = {}, const SpecOptions& spec = {});

// Incremental stop-string matcher: feed text pieces, get back the text that is safe to
// emit (cannot be the start of a stop string) and whether a stop string completed.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends `piece`; returns the newly safe text. Sets stopped() once a stop string is
  // seen; text from its first byte on is dropped.
  std::string feed(std::string_view piece);
  // Returns the held-back text (no stop string completed) at the end of generation.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace dsinfer
