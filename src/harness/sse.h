// dsinfer harness: incremental Server-Sent Events parsing and the meaning of one OpenAI
// streaming chunk.
//
// Data flow: HTTP body bytes, in whatever pieces the socket delivers them --SseParser::feed-->
// complete events (the joined `data:` lines of each blank-line-terminated block; comments
// `: ...` and other fields dropped) --parse_openai_chunk--> StreamChunk (text delta,
// finish reason, usage, an error object, or the `[DONE]` end marker). The load client
// timestamps each chunk that carries text.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer::harness {

class SseParser {
 public:
  // Appends bytes; returns the data payloads of the events completed by them, in order.
  std::vector<std::string> feed(std::string_view bytes);
  // Bytes received but not yet part of a complete event (a stream cut mid-event).
  bool has_partial() const { return !line_.empty() || !data_.empty() || has_data_; }

 private:
  void end_line(std::vector<std::string>& out);
  std::string line_;   // the current line, without its terminator
  std::string data_;   // data lines of the current event, joined with '\n'
  bool has_data_ = false;
  bool last_was_cr_ = false;  // a "\r\n" split across two feeds is one terminator
};

struct StreamChunk {
  bool done = false;              // the "[DONE]" marker
  std::string text;               // choices[0].delta.content (chat) or choices[0].text
  std::string finish_reason;      // "" when null / absent
  int prompt_tokens = -1, completion_tokens = -1;  // from "usage" when present
  std::string error;              // error.message when the server sent an error object
};

// Parses one event payload. Throws dsinfer::Error ("stream chunk: ...") for a payload that
// is not JSON or not an object.
StreamChunk parse_openai_chunk(std::string_view payload);

}  // namespace dsinfer::harness
