// dsinfer engine: the generation loop, plain or speculative (see generator.h).
#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer {

GenerationResult generate(Model& model, const Tokenizer* tok, const std::vector<int32_t>& prompt,
                          const SamplingParams& sampling, const StopConditions& stop, const TextCallback& on_text,
                          const SpecOptions& spec) {
  validate_sampling_params(sampling);
  if (stop.max_tokens <= 0) throw Error("max_tokens: must be > 0, got " + std::to_string(stop.max_tokens));
  if (prompt.empty()) throw Error("prompt: empty (at least one token is needed)");
  const auto& cfg = model.config();
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size)
      throw Error("prompt: token id " + std::to_string(prompt[i]) + " at index " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
  const int max_len = static_cast<int>(prompt.size()) + stop.max_tokens;
  if (max_len > cfg.max_position_embeddings)
    throw Error("max_tokens: prompt (" + std::to_string(prompt.size()) + ") + max_tokens (" +
                std::to_string(stop.max_tokens) + ") exceeds max_position_embeddings (" +
                std::to_string(cfg.max_position_embeddings) + ")");

  SpecDecoder dec(model, sampling, spec, max_len);
  GenerationResult res;
  res.prompt_tokens = static_cast<int>(prompt.size());
  OutputStream out(tok, stop, on_text);

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  int32_t first = dec.prefill(prompt);
  auto t1 = clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  // Each round emits its accepted drafts and then the correction/bonus token, one by one
  // through the same stop checks; a stop inside the drafts discards the rest of the round.
  bool done = out.push(first);
  while (!done) {
    SpecRound& r = dec.round(out.remaining());
    for (int32_t id : r.tokens) {
      r.committed++;
      if ((done = out.push(id))) break;
    }
    res.spec.add(r);
    if (spec.on_round) spec.on_round(r);
  }
  out.finish();
  res.ids = out.ids();
  res.text = out.text();
  res.finish_reason = out.finish_reason();
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace dsinfer
