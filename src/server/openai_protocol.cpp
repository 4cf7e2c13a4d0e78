// dsinfer server floor: OpenAI request parsing/validation and response JSON (see
// openai_protocol.h). Every check names the parameter so a client can fix its request
// from the message alone.
#include "server/openai_protocol.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dsinfer::server {

namespace {

using nlohmann::json;

ApiError bad(const std::string& param, const std::string& msg) { return ApiError(400, param + ": " + msg, param); }

bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

std::string type_name(const json& v) { return v.type_name(); }

int64_t get_int(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json& v = body[key];
  if (!v.is_number_integer())
    throw bad(key, "must be an integer, got " + type_name(v) + (v.is_number_float() ? " " + v.dump() : ""));
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();  // nlohmann stores every non-negative integer here
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo)))
      throw bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    return static_cast<int64_t>(u);
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return x;
}

double get_number(const json& body, const char* key, double lo, double hi, bool lo_open = false) {
  const json& v = body[key];
  if (!v.is_number()) throw bad(key, "must be a number, got " + type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi) {
    char range[96];
    std::snprintf(range, sizeof range, "%s%g, %g]", lo_open ? "(" : "[", lo, hi);
    throw bad(key, std::string("must be in ") + range + ", got " + v.dump());
  }
  return x;
}

bool get_bool(const json& body, const char* key) {
  const json& v = body[key];
  if (!v.is_boolean()) throw bad(key, "must be a boolean, got " + type_name(v));
  return v.get<bool>();
}

const std::string& get_string(const json& body, const char* key) {
  const json& v = body[key];
  if (!v.is_string()) throw bad(key, "must be a string, got " + type_name(v));
  return v.get_ref<const std::string&>();
}

// Parameters dsinfer cannot honour: accepted only at their neutral value.
void reject_unsupported(const json& body, bool chat) {
  if (given(body, "n") && get_int(body, "n", 1, 128) != 1) throw bad("n", "only n = 1 is supported");
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (given(body, k) && get_number(body, k, -2.0, 2.0) != 0.0) throw bad(k, "penalties are not supported (only 0)");
  if (given(body, "logit_bias")) {
    if (!body["logit_bias"].is_object()) throw bad("logit_bias", "must be an object");
    if (!body["logit_bias"].empty()) throw bad("logit_bias", "not supported");
  }
  if (given(body, "logprobs")) {
    const json& v = body["logprobs"];
    if (chat ? !(v.is_boolean() && !v.get<bool>()) : !(v.is_number_integer() && v.get<int64_t>() == 0))
      throw bad("logprobs", "not supported");
  }
  if (given(body, "top_logprobs")) throw bad("top_logprobs", "not supported");
  if (given(body, "tools")) {
    if (!body["tools"].is_array()) throw bad("tools", "must be an array");
    if (!body["tools"].empty()) throw bad("tools", "tool calling is not supported");
  }
  if (given(body, "tool_choice") && body["tool_choice"] != "none") throw bad("tool_choice", "tool calling is not supported");
  if (given(body, "response_format")) {
    const json& v = body["response_format"];
    if (!v.is_object() || !v.contains("type") || v["type"] != "text")
      throw bad("response_format", "only {\"type\": \"text\"} is supported");
  }
  if (given(body, "echo") && get_bool(body, "echo")) throw bad("echo", "not supported");
  if (given(body, "best_of") && get_int(body, "best_of", 1, 128) != 1) throw bad("best_of", "only 1 is supported");
  if (given(body, "suffix") && !get_string(body, "suffix").empty()) throw bad("suffix", "not supported");
}

std::string part_text(const json& content, size_t mi) {
  const std::string where = "messages[" + std::to_string(mi) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return {};
  if (!content.is_array()) throw bad(where, "must be a string or an array of text parts, got " + type_name(content));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& p = content[i];
    const std::string pw = where + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) throw bad(pw, "must be an object with a \"type\"");
    if (p["type"] != "text") throw bad(pw + ".type", "only text parts are supported, got " + p["type"].dump());
    if (!p.contains("text") || !p["text"].is_string()) throw bad(pw + ".text", "must be a string");
    text += p["text"].get<std::string>();
  }
  return text;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  if (!given(body, "messages")) throw bad("messages", "required");
  const json& ms = body["messages"];
  if (!ms.is_array()) throw bad("messages", "must be an array, got " + type_name(ms));
  if (ms.empty()) throw bad("messages", "must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad(where, "must be an object, got " + type_name(m));
    if (!m.contains("role") || !m["role"].is_string()) throw bad(where + ".role", "required string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for system instructions
    if (role != "system" && role != "user" && role != "assistant")
      throw bad(where + ".role", "must be system, developer, user or assistant, got \"" + role + "\"");
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) throw bad(where + ".tool_calls", "tool calling is not supported");
    if (!m.contains("content")) throw bad(where + ".content", "required");
    out.push_back({role, part_text(m["content"], i)});
  }
  return out;
}

void parse_prompt(const json& body, CompletionRequest& r) {
  if (!given(body, "prompt")) throw bad("prompt", "required");
  const json& p = body["prompt"];
  auto ids_from = [&](const json& a) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer() || a[i].get<int64_t>() < 0 || a[i].get<int64_t>() > INT32_MAX)
        throw bad("prompt", "token id at index " + std::to_string(i) + " is not a non-negative integer");
      r.prompt_ids.push_back(static_cast<int32_t>(a[i].get<int64_t>()));
    }
    r.prompt_is_ids = true;
  };
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_string()) {
    if (p.size() != 1) throw bad("prompt", "only one prompt per request is supported");
    r.prompt_text = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_array()) {
    if (p.size() != 1) throw bad("prompt", "only one prompt per request is supported");
    ids_from(p[0]);
  } else if (p.is_array() && !p.empty()) {
    ids_from(p);
  } else {
    throw bad("prompt", "must be a non-empty string, array of one string, or array of token ids");
  }
}

const std::set<std::string>& known_keys(bool chat) {
  // Everything parse_completion_request reads or checks; user/metadata/store/... are
  // bookkeeping fields that do not change generation.
  static const std::set<std::string> common = {
      "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
      "n", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user",
      "ignore_eos", "metadata", "store", "service_tier"};
  static std::set<std::string> c = [] {
    std::set<std::string> s = common;
    for (const char* k : {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
                          "response_format", "chat_template_kwargs"})
      s.insert(k);
    return s;
  }();
  static std::set<std::string> t = [] {
    std::set<std::string> s = common;
    for (const char* k : {"prompt", "echo", "best_of", "suffix"}) s.insert(k);
    return s;
  }();
  return chat ? c : t;
}

}  // namespace

json error_json(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

CompletionRequest parse_completion_request(std::string_view body_text, bool chat, const ProtocolLimits& limits) {
  const size_t bad_byte = utf8_invalid_offset(body_text);
  if (bad_byte != std::string_view::npos)
    throw ApiError(400, "request body: invalid UTF-8 at byte " + std::to_string(bad_byte));
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("request body: invalid JSON: ") + e.what());
  }
  if (!body.is_object()) throw ApiError(400, "request body: must be a JSON object, got " + type_name(body));
  for (const auto& [key, value] : body.items())
    if (!known_keys(chat).count(key))
      throw bad(key, std::string("unrecognized request argument for ") + (chat ? "/v1/chat/completions" : "/v1/completions"));

  CompletionRequest r;
  r.chat = chat;
  if (given(body, "model")) {
    r.model = get_string(body, "model");
    if (r.model != limits.model_id)
      throw ApiError(404, "model: '" + r.model + "' does not exist; this server serves '" + limits.model_id + "'",
                     "model", "model_not_found");
  } else {
    r.model = limits.model_id;
  }
  reject_unsupported(body, chat);
  if (chat) {
    r.messages = parse_messages(body);
    if (given(body, "chat_template_kwargs")) {
      const json& k = body["chat_template_kwargs"];
      if (!k.is_object()) throw bad("chat_template_kwargs", "must be an object");
      for (const auto& [key, v] : k.items()) {
        if (key != "enable_thinking") throw bad("chat_template_kwargs." + key, "unsupported (only enable_thinking)");
        if (!v.is_boolean()) throw bad("chat_template_kwargs.enable_thinking", "must be a boolean");
        r.enable_thinking = v.get<bool>();
      }
    }
  } else {
    parse_prompt(body, r);
  }
  if (given(body, "stream")) r.stream = get_bool(body, "stream");
  if (given(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw bad("stream_options", "must be an object");
    if (!r.stream) throw bad("stream_options", "only allowed when stream is true");
    for (const auto& [key, v] : so.items()) {
      if (key != "include_usage") throw bad("stream_options." + key, "unsupported (only include_usage)");
      if (!v.is_boolean()) throw bad("stream_options.include_usage", "must be a boolean");
      r.include_usage = v.get<bool>();
    }
  }
  const char* mt_key = nullptr;
  for (const char* k : {"max_completion_tokens", "max_tokens"})
    if (given(body, k)) {
      if (mt_key && get_int(body, k, 1, limits.max_tokens_cap) != r.max_tokens)
        throw bad(k, std::string("conflicts with ") + mt_key);
      r.max_tokens = static_cast<int>(get_int(body, k, 1, limits.max_tokens_cap));
      r.max_tokens_given = true;
      mt_key = k;
    }
  if (!r.max_tokens_given) r.max_tokens = limits.default_max_tokens;
  if (given(body, "temperature")) r.temperature = static_cast<float>(get_number(body, "temperature", 0.0, 2.0));
  if (given(body, "top_p")) r.top_p = static_cast<float>(get_number(body, "top_p", 0.0, 1.0, /*lo_open=*/true));
  if (given(body, "top_k")) {
    const int64_t k = get_int(body, "top_k", -1, 1 << 20);
    r.top_k = k < 0 ? 0 : static_cast<int>(k);  // -1 (vLLM's "off") = 0
  }
  if (given(body, "seed")) {
    r.seed = static_cast<uint64_t>(get_int(body, "seed", std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max()));
    r.seed_given = true;
  }
  if (given(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_string()) throw bad("stop", "element " + std::to_string(i) + " must be a string");
        r.stop.push_back(s[i].get<std::string>());
      }
    } else {
      throw bad("stop", "must be a string or an array of strings, got " + type_name(s));
    }
    if (static_cast<int>(r.stop.size()) > limits.max_stop_strings)
      throw bad("stop", "at most " + std::to_string(limits.max_stop_strings) + " stop strings");
    for (const std::string& st : r.stop) {
      if (st.empty()) throw bad("stop", "stop strings must not be empty");
      if (st.size() > limits.max_stop_bytes)
        throw bad("stop", "stop strings must be at most " + std::to_string(limits.max_stop_bytes) + " bytes");
    }
  }
  if (given(body, "ignore_eos")) r.ignore_eos = get_bool(body, "ignore_eos");
  if (given(body, "user")) (void)get_string(body, "user");

  r.params = {{"max_tokens", r.max_tokens}, {"temperature", r.temperature}, {"top_p", r.top_p},
              {"top_k", r.top_k}, {"stream", r.stream}, {"stop", r.stop}};
  if (r.seed_given) r.params["seed"] = r.seed;
  if (r.ignore_eos) r.params["ignore_eos"] = true;
  if (chat && !r.enable_thinking) r.params["enable_thinking"] = false;
  return r;
}

std::vector<int32_t> render_prompt(const CompletionRequest& r, const Tokenizer& tok, const ProtocolLimits& limits) {
  std::vector<int32_t> ids;
  try {
    if (r.chat) {
      ChatOptions o;
      o.enable_thinking = r.enable_thinking;
      const std::string text = apply_chat_template(tok, r.messages, o);
      // Special tokens parsed, so the template's markers become control ids. Message text is
      // inserted verbatim, so text that spells a marker becomes one too (as in most ChatML
      // servers); /v1/completions text never does.
      ids = tok.encode(text, /*parse_special=*/true);
    } else if (r.prompt_is_ids) {
      for (size_t i = 0; i < r.prompt_ids.size(); ++i)
        if (r.prompt_ids[i] >= tok.vocab_size())
          throw bad("prompt", "token id " + std::to_string(r.prompt_ids[i]) + " at index " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(tok.vocab_size()) + ")");
      ids = r.prompt_ids;
    } else {
      ids = tok.encode(r.prompt_text, /*parse_special=*/false);
    }
  } catch (const Error& e) {
    throw ApiError(400, std::string(r.chat ? "messages" : "prompt") + ": " + e.what(), r.chat ? "messages" : "prompt");
  }
  if (ids.empty()) throw bad(r.chat ? "messages" : "prompt", "encodes to zero tokens");
  if (static_cast<int>(ids.size()) > limits.max_prompt_tokens)
    throw ApiError(400,
                   std::string(r.chat ? "messages" : "prompt") + ": " + std::to_string(ids.size()) +
                       " tokens exceed the limit of " + std::to_string(limits.max_prompt_tokens),
                   r.chat ? "messages" : "prompt", "context_length_exceeded");
  return ids;
}

std::string openai_finish_reason(const std::string& engine_reason) { return engine_reason; }

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json chunk_json(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& text, bool first,
                const std::string& finish_reason) {
  json choice = {{"index", 0}};
  if (r.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(openai_finish_reason(finish_reason));
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", r.model},
          {"choices", json::array({choice})}};
}

json usage_chunk_json(const CompletionRequest& r, const std::string& id, int64_t created, const Usage& u) {
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", r.model},
          {"choices", json::array()},
          {"usage", usage_json(u)}};
}

json completion_json(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& text,
                     const std::string& finish_reason, const Usage& u) {
  json choice = {{"index", 0}};
  if (r.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = openai_finish_reason(finish_reason);
  return {{"id", id},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", r.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(u)}};
}

json models_json(const std::string& model_id, int64_t created) {
  return {{"object", "list"},
          {"data", json::array({{{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "dsinfer"}}})}};
}

std::string sse_event(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace dsinfer::server
