// dsinfer server floor: the OpenAI wire protocol as pure functions — request bodies in,
// validated requests out; engine results in, response / stream-chunk JSON out. No sockets
// and no engine here, so every rule is unit-tested and fuzzed (fuzz/fuzz_request_parser.cpp).
//
// Data flow of one request:
//   HTTP body --parse_completion_request--> CompletionRequest (every field type- and
//   range-checked against ProtocolLimits; anything that cannot be honoured is an ApiError
//   naming the parameter, never silently ignored)
//   --render_prompt (chat template or raw text / ids, via the tokenizer)--> prompt ids
//   (the http server builds the EngineRequest from them and the sampling fields)
//   engine events --chunk_json / completion_json--> `data: {...}` events or one response body.
#pragma once
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsinfer::server {

// An error a client caused (or the server's state, e.g. 503 while draining): the HTTP
// status and OpenAI's error object {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::exception {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : status(status), message(std::move(message)), param(std::move(param)), code(std::move(code)),
        type(std::move(type)) {}
  const char* what() const noexcept override { return message.c_str(); }
  int status;
  std::string message, param, code, type;
};

// {"error": {...}} for an ApiError (param / code null when empty).
nlohmann::json error_json(const ApiError& e);

struct ProtocolLimits {
  std::string model_id;          // the one served model; requests naming another get 404
  int max_prompt_tokens = 4096;  // checked after tokenization (render_prompt)
  int max_tokens_cap = 4096;     // largest max_tokens / max_completion_tokens accepted
  int default_max_tokens = 256;  // when the request gives none
  int max_stop_strings = 4;
  size_t max_stop_bytes = 256;   // per stop string
};

struct CompletionRequest {
  bool chat = false;                   // /v1/chat/completions (else /v1/completions)
  std::string model;
  std::vector<ChatMessage> messages;   // chat
  bool enable_thinking = true;         // chat_template_kwargs.enable_thinking (Qwen3)
  std::string prompt_text;             // completions: text prompt ...
  std::vector<int32_t> prompt_ids;     // ... or token ids (exactly one of the two is used)
  bool prompt_is_ids = false;
  bool stream = false, include_usage = false;
  int max_tokens = 0;                  // resolved (default applied)
  bool max_tokens_given = false;
  float temperature = 1.0f, top_p = 1.0f;  // OpenAI defaults
  int top_k = 0;                       // extension; 0 = off
  uint64_t seed = 0;
  bool seed_given = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;             // extension
  nlohmann::json params;               // the sampling / limit fields as given (for --record-requests)
};

// Parses and validates a request body. Throws ApiError (400 with the parameter named; 404
// for an unknown model) on: malformed JSON or invalid UTF-8, a non-object body, wrong
// types, out-of-range values, and parameters dsinfer cannot honour (n > 1, logprobs,
// tools, penalties, logit_bias, a non-text response_format, echo, best_of, suffix).
CompletionRequest parse_completion_request(std::string_view body, bool chat, const ProtocolLimits& limits);

// The prompt ids for a parsed request: the chat template over `messages`, or the text
// prompt encoded (special tokens not parsed: user text never becomes control tokens), or
// the given ids (checked against the vocabulary). Throws ApiError 400 when the prompt is
// empty, longer than max_prompt_tokens, or the template rejects a role.
std::vector<int32_t> render_prompt(const CompletionRequest& r, const Tokenizer& tok, const ProtocolLimits& limits);

// engine finish reasons -> OpenAI's ("stop" | "length"); anything else passes through.
std::string openai_finish_reason(const std::string& engine_reason);

struct Usage {
  int prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);

// One streaming chunk. Chat: delta {role?, content?}; completions: text. finish_reason ""
// = null. The usage-only chunk (stream_options.include_usage) is usage_chunk_json.
nlohmann::json chunk_json(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& text,
                          bool first, const std::string& finish_reason);
nlohmann::json usage_chunk_json(const CompletionRequest& r, const std::string& id, int64_t created, const Usage& u);
// The non-streaming response body.
nlohmann::json completion_json(const CompletionRequest& r, const std::string& id, int64_t created,
                               const std::string& text, const std::string& finish_reason, const Usage& u);
// GET /v1/models.
nlohmann::json models_json(const std::string& model_id, int64_t created);

// "data: <json>\n\n" (JSON dumped with invalid UTF-8 replaced, never throwing).
std::string sse_event(const nlohmann::json& j);

}  // namespace dsinfer::server
