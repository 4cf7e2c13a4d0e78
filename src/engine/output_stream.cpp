// dsinfer engine: stop handling and streaming detokenization of one request (output_stream.h).
#include "engine/output_stream.h"

#include <algorithm>

#include "core/error.h"
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

OutputStream::OutputStream(const Tokenizer* tok, const StopConditions& stop, TextCallback on_text)
    : stop_(stop), on_text_(std::move(on_text)), matcher_(stop.stop_strings) {
  if (stop.max_tokens <= 0) throw Error("max_tokens: must be > 0, got " + std::to_string(stop.max_tokens));
  if (!stop.stop_strings.empty() && !tok) throw Error("stop: stop strings need a tokenizer in the model directory");
  if (tok) detok_ = std::make_unique<StreamingDetokenizer>(*tok);
}

OutputStream::~OutputStream() = default;
OutputStream::OutputStream(OutputStream&&) noexcept = default;

void OutputStream::emit(const std::string& s) {
  if (s.empty()) return;
  text_ += s;
  if (on_text_) on_text_(s);
}

bool OutputStream::push(int32_t id) {
  if (done_) return true;
  ids_.push_back(id);
  if (std::find(stop_.stop_ids.begin(), stop_.stop_ids.end(), id) != stop_.stop_ids.end()) {
    finish_reason_ = "stop";  // the stop id's own text is not emitted
    done_ = true;
  } else if (detok_) {
    emit(matcher_.feed(detok_->push(id)));
    if (matcher_.stopped()) {
      finish_reason_ = "stop";
      done_ = true;
    }
  }
  if (!done_ && static_cast<int>(ids_.size()) >= stop_.max_tokens) {
    finish_reason_ = "length";
    done_ = true;
  }
  if (done_) finish();
  return done_;
}

void OutputStream::finish() {
  if (flushed_) return;
  flushed_ = true;
  done_ = true;
  if (detok_ && !matcher_.stopped()) {
    emit(matcher_.feed(detok_->flush()));
    emit(matcher_.flush());
  }
}

}  // namespace dsinfer
