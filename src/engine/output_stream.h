// dsinfer engine: one request's output side — generated ids in, final text pieces out.
//
// Data flow per generated id: stop-id check -> StreamingDetokenizer (complete UTF-8 only)
// -> StopStringMatcher (holds back text that could still become a stop string) -> the text
// callback. A stop id or a completed stop string ends the stream ("stop"); reaching
// max_tokens ends it as "length". Both the single-sequence generate() and the batched
// LLMEngine feed their ids through this, so stop semantics are identical in both.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer {

class Tokenizer;
class StreamingDetokenizer;

struct StopConditions {
  int max_tokens = 256;                  // generated tokens, > 0
  std::vector<int32_t> stop_ids;         // e.g. the model's eos ids
  std::vector<std::string> stop_strings; // text never includes the stop string
};

// Streams text pieces (complete UTF-8) as they become final.
using TextCallback = std::function<void(std::string_view)>;

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

class OutputStream {
 public:
  // tok may be null (ids only, no text; stop strings then need a tokenizer: Error).
  OutputStream(const Tokenizer* tok, const StopConditions& stop, TextCallback on_text = {});
  ~OutputStream();
  OutputStream(OutputStream&&) noexcept;

  // Appends one generated id; returns true when the stream has ended (stop or length).
  bool push(int32_t id);
  // Ends the stream early (e.g. cancellation) or after the last push: flushes held text.
  void finish();

  bool done() const { return done_; }
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::string& text() const { return text_; }
  // "stop" | "length" once done (empty before).
  const std::string& finish_reason() const { return finish_reason_; }
  int remaining() const { return stop_.max_tokens - static_cast<int>(ids_.size()); }

 private:
  void emit(const std::string& s);

  StopConditions stop_;
  TextCallback on_text_;
  std::unique_ptr<StreamingDetokenizer> detok_;
  StopStringMatcher matcher_;
  std::vector<int32_t> ids_;
  std::string text_;
  std::string finish_reason_;
  bool done_ = false, flushed_ = false;
};

}  // namespace dsinfer
