// dsinfer engine: single-sequence generation (prefill, then one token per step) with
// sampling, stop ids, stop strings and a token budget, streaming text through a callback.
//
// Data flow: prompt ids -> Model::forward (prefill, logits of the last row) -> Sampler ->
// new id -> stop-id check -> StreamingDetokenizer -> stop-string matcher (holds back text
// that could still become a stop string) -> on_text callback. Each decode step is one
// forward of one token appended to the same KV slot.
//
// This is the plain-decoding baseline the speculative and batched engines of later issues
// must reproduce exactly (greedy) and beat in speed.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

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
};

// Streams text pieces (complete UTF-8) as they become final. tok may be null (no text).
using TextCallback = std::function<void(std::string_view)>;

GenerationResult generate(Model& model, const Tokenizer* tok, const std::vector<int32_t>& prompt,
                          const SamplingParams& sampling, const StopConditions& stop,
                          const TextCallback& on_text = {});

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
