// libFuzzer target for the server's request parser (src/server/openai_protocol and
// runtime_config). Data flow: the first input byte picks the endpoint ('c' chat, 't'
// completions, 'r' POST /api/v1/config/dflash; others cycle through them), the rest is the
// request body. Checks: parsing never crashes and refuses only with ApiError (a 4xx; any
// other exception escapes and libFuzzer reports it); an accepted request renders with the
// embedded model's tokenizer (ApiError allowed: limits) and its response / chunk JSON
// serialises; an accepted settings patch stays in range.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "server/openai_protocol.h"
#include "server/runtime_config.h"
#include "tokenizer/tokenizer.h"

namespace {

const dsinfer::Tokenizer* tokenizer() {
  static std::unique_ptr<dsinfer::Tokenizer> tok = [] {
    std::filesystem::path src = std::filesystem::path(__FILE__).parent_path().parent_path();
    if (const char* env = std::getenv("DSINFER_SOURCE_DIR")) src = env;
    else if (!src.is_absolute()) src = std::filesystem::current_path();
    const auto dir = src / "models" / "embedded" / "target";
    std::unique_ptr<dsinfer::Tokenizer> t;
    if (std::filesystem::exists(dir / "tokenizer.json")) t = dsinfer::Tokenizer::load(dir.string());
    return t;
  }();
  return tok.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer::server;
  if (size < 1) return 0;
  const char which = (data[0] == 'c' || data[0] == 't' || data[0] == 'r') ? static_cast<char>(data[0]) : "ctr"[data[0] % 3];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (which == 'r') {
    DflashSettings cur;
    cur.max_reuse_depth = 8;
    const SettingsCaps caps{true, true, true, 8};
    try {
      const DflashSettings s = apply_settings_patch(cur, body, caps);
      if (!(s.validation_threshold >= 0.0f && s.validation_threshold <= 1.0f)) __builtin_trap();
      if (s.max_reuse_depth < 1 || s.max_reuse_depth > 8) __builtin_trap();
      (void)to_engine_config(s, caps);
      (void)settings_json(s).dump();
    } catch (const ApiError& e) {
      if (e.status != 400) __builtin_trap();
    }
    return 0;
  }
  ProtocolLimits limits;
  limits.model_id = "m";
  limits.max_prompt_tokens = 256;
  limits.max_tokens_cap = 1024;
  try {
    const CompletionRequest r = parse_completion_request(body, which == 'c', limits);
    if (r.max_tokens < 1 || r.max_tokens > limits.max_tokens_cap) __builtin_trap();
    if (const dsinfer::Tokenizer* tok = tokenizer()) {
      try {
        (void)render_prompt(r, *tok, limits);
      } catch (const ApiError& e) {
        if (e.status != 400) __builtin_trap();
      }
    }
    (void)sse_event(chunk_json(r, "id", 1, r.prompt_text, true, ""));
    (void)sse_event(completion_json(r, "id", 1, r.prompt_text, "stop", Usage{1, 2}));
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status >= 500) __builtin_trap();
    (void)error_json(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
