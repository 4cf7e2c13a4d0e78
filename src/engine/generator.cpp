// dsinfer engine: the generation loop, plain or speculative (see generator.h).
#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/speculative.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer {

std::string StopStringMatcher::feed(std::string_view piece) {
  if (stopped_) return {};
  held_.append(piece);
  // Earliest complete stop string wins.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    size_t p = held_.find(s);
    if (p != std::string::npos) cut = std::min(cut, p);
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    size_t max_k = std::min(s.size() - (s.empty() ? 0 : 1), held_.size());
    for (size_t k = max_k; k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

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
  if (!stop.stop_strings.empty() && !tok) throw Error("stop: stop strings need a tokenizer in the model directory");
  const int max_len = static_cast<int>(prompt.size()) + stop.max_tokens;
  if (max_len > cfg.max_position_embeddings)
    throw Error("max_tokens: prompt (" + std::to_string(prompt.size()) + ") + max_tokens (" +
                std::to_string(stop.max_tokens) + ") exceeds max_position_embeddings (" +
                std::to_string(cfg.max_position_embeddings) + ")");

  SpecDecoder dec(model, sampling, spec, max_len);
  GenerationResult res;
  res.prompt_tokens = static_cast<int>(prompt.size());
  std::unique_ptr<StreamingDetokenizer> detok;
  if (tok) detok = std::make_unique<StreamingDetokenizer>(*tok);
  StopStringMatcher matcher(stop.stop_strings);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };
  // Appends one generated id; returns true when generation must end here.
  auto push = [&](int32_t id) {
    res.ids.push_back(id);
    if (std::find(stop.stop_ids.begin(), stop.stop_ids.end(), id) != stop.stop_ids.end()) {
      res.finish_reason = "stop";
      return true;  // the stop id's own text is not emitted
    }
    if (detok) {
      emit(matcher.feed(detok->push(id)));
      if (matcher.stopped()) {
        res.finish_reason = "stop";
        return true;
      }
    }
    return false;
  };

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  int32_t first = dec.prefill(prompt);
  auto t1 = clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.finish_reason = "length";
  bool done = push(first);
  // Each round emits its accepted drafts and then the correction/bonus token, one by one
  // through the same stop checks; a stop inside the drafts discards the rest of the round.
  while (!done && static_cast<int>(res.ids.size()) < stop.max_tokens) {
    SpecRound& r = dec.round(stop.max_tokens - static_cast<int>(res.ids.size()));
    for (int32_t id : r.tokens) {
      r.committed++;
      if ((done = push(id))) break;
    }
    res.spec.add(r);
    if (spec.on_round) spec.on_round(r);
  }
  if (detok && !matcher.stopped()) {
    emit(matcher.feed(detok->flush()));
    emit(matcher.flush());
  }
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace dsinfer
