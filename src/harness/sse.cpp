// dsinfer harness: SSE framing (WHATWG "text/event-stream": lines end in \n, \r\n or \r; an
// empty line dispatches the event; "data:" lines are joined with \n; a single space after
// the colon is dropped; lines starting with ':' are comments) and OpenAI chunk fields.
#include "harness/sse.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsinfer::harness {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> out;
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // second half of "\r\n"
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = c == '\r';
    if (c == '\n' || c == '\r') {
      end_line(out);
      continue;
    }
    line_ += c;
  }
  return out;
}

void SseParser::end_line(std::vector<std::string>& out) {
  if (line_.empty()) {  // blank line: dispatch
    if (has_data_) out.push_back(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  std::string_view l = line_;
  if (l.front() != ':') {
    const size_t colon = l.find(':');
    const std::string_view field = l.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
    }
    // event:, id:, retry: carry nothing an OpenAI stream needs.
  }
  line_.clear();
}

StreamChunk parse_openai_chunk(std::string_view payload) {
  StreamChunk c;
  if (payload == "[DONE]") {
    c.done = true;
    return c;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(payload);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("stream chunk: invalid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error("stream chunk: not a JSON object");
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) c.error = (*e)["message"];
    else c.error = e->dump();
    if (c.error.empty()) c.error = "error";
    return c;
  }
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    const auto& c0 = (*ch)[0];
    if (c0.is_object()) {
      if (auto d = c0.find("delta"); d != c0.end() && d->is_object()) {
        if (auto t = d->find("content"); t != d->end() && t->is_string()) c.text = t->get<std::string>();
      }
      if (auto t = c0.find("text"); t != c0.end() && t->is_string()) c.text += t->get<std::string>();
      if (auto f = c0.find("finish_reason"); f != c0.end() && f->is_string()) c.finish_reason = f->get<std::string>();
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) c.prompt_tokens = p->get<int>();
    if (auto p = u->find("completion_tokens"); p != u->end() && p->is_number_integer()) c.completion_tokens = p->get<int>();
  }
  return c;
}

}  // namespace dsinfer::harness
