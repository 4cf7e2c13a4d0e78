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

#include "engine/output_stream.h"
#include "engine/speculative.h"
#include "sampling/sampler.h"

namespace dsinfer {

class Model;
class Tokenizer;

struct GenerationResult {
  std::vector<int32_t> ids;   // generated ids (the token completing a stop string included)
  std::string text;           // detokenized output, cut before any stop string
  std::string finish_reason;  // "stop" (stop id or string) | "length"
  int prompt_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;  // time for generated tokens after the first
  SpecStats spec;               // rounds, tau, acceptance per draft position, timings
};

// tok may be null (no text).
GenerationResult generate(Model& model, const Tokenizer* tok, const std::vector<int32_t>& prompt,
                          const SamplingParams& sampling, const StopConditions& stop,
                          const TextCallback& on_text = {}, const SpecOptions& spec = {});


}  // namespace dsinfer
