// Server floor unit tests: OpenAI request parsing and validation (every refusal names its
// parameter with the right status), prompt rendering limits, response / chunk shapes,
// hot-reload settings validation, the Prometheus exposition of step observations, the
// --log-dflash-details line format, and serve's start-up refusals of a bad log path and a bad
// --enable-metrics / --enable-health-check value.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_helpers.h"
#include "server/dflash_log.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/runtime_config.h"
#include "tokenizer/tokenizer.h"

using namespace dsinfer;
using namespace dsinfer::server;
using nlohmann::json;

namespace {

ProtocolLimits limits() {
  ProtocolLimits l;
  l.model_id = "m";
  l.max_prompt_tokens = 50;
  l.max_tokens_cap = 100;
  l.default_max_tokens = 16;
  return l;
}

// Expects an ApiError with `status` whose message contains `needle` (and param == param).
void expect_error(const std::string& body, bool chat, int status, const std::string& needle,
                  const std::string& param = "\x01") {
  try {
    parse_completion_request(body, chat, limits());
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << body << " -> " << e.message;
    EXPECT_NE(e.message.find(needle), std::string::npos) << body << " -> " << e.message;
    if (param != "\x01") {
      EXPECT_EQ(e.param, param) << body;
    }
  }
}

const char* kChat = R"({"messages":[{"role":"user","content":"hi"}]})";

}  // namespace

TEST(ServerProtocol, ChatDefaultsAndFields) {
  CompletionRequest r = parse_completion_request(kChat, true, limits());
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FALSE(r.stream);

  r = parse_completion_request(
      R"({"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"user","content":"x"}],"max_completion_tokens":7,"temperature":0,"top_p":0.5,"top_k":5,"seed":-3,
          "stop":["\n","END"],"stream":true,"stream_options":{"include_usage":true},"n":1,"logprobs":false,
          "presence_penalty":0,"user":"u","chat_template_kwargs":{"enable_thinking":false}})",
      true, limits());
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "ab");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_FLOAT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 5);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_FALSE(r.enable_thinking);
}

TEST(ServerProtocol, CompletionPromptForms) {
  EXPECT_EQ(parse_completion_request(R"({"prompt":"abc"})", false, limits()).prompt_text, "abc");
  EXPECT_EQ(parse_completion_request(R"({"prompt":["abc"]})", false, limits()).prompt_text, "abc");
  CompletionRequest r = parse_completion_request(R"({"prompt":[1,2,3],"stop":"x"})", false, limits());
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(parse_completion_request(R"({"prompt":[[4,5]]})", false, limits()).prompt_is_ids);
}

TEST(ServerProtocol, RefusalsNameTheParameter) {
  expect_error("{\"messages\": [", true, 400, "invalid JSON");
  expect_error("[1]", true, 400, "JSON object");
  expect_error(std::string("{\"prompt\":\"\xff\"}"), false, 400, "invalid UTF-8 at byte 11");
  expect_error(R"({"prompt":"\udc00"})", false, 400, "invalid JSON");  // lone surrogate escape
  expect_error(R"({"messages":"hi"})", true, 400, "messages", "messages");
  expect_error(R"({"messages":[]})", true, 400, "messages", "messages");
  expect_error(R"({"messages":[{"role":"tool","content":"x"}]})", true, 400, "messages[0].role");
  expect_error(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true, 400, "text parts");
  expect_error(R"({"messages":[{"role":"user"}]})", true, 400, "messages[0].content");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", true, 400, "max_tokens", "max_tokens");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})", true, 400, "max_tokens");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", true, 400, "max_tokens");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":101})", true, 400, "[1, 100]");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":18446744073709551615})", true, 400,
               "max_tokens");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1e40})", true, 400, "integer");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":4,"max_completion_tokens":5})", true, 400,
               "conflicts");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"temperature":-0.1})", true, 400, "temperature");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", true, 400, "temperature");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", true, 400, "top_p");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"top_k":2.5})", true, 400, "top_k");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"seed":"s"})", true, 400, "seed");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", true, 400, "stop");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"stop":""})", true, 400, "stop");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", true, 400, "at most 4");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"stream":1})", true, 400, "stream");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})", true, 400,
               "only allowed when stream");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"n":2})", true, 400, "n:");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", true, 400, "logprobs");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"frequency_penalty":0.5})", true, 400, "penalties");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":1}})", true, 400, "logit_bias");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", true, 400, "tool");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})", true, 400,
               "response_format");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"bogus":1})", true, 400, "unrecognized", "bogus");
  expect_error(R"({"messages":[{"role":"user","content":"x"}],"model":"other"})", true, 404, "other", "model");
  expect_error(R"({"prompt":"x","echo":true})", false, 400, "echo");
  expect_error(R"({"prompt":["a","b"]})", false, 400, "one prompt");
  expect_error(R"({"prompt":[1,-2]})", false, 400, "index 1");
  expect_error(R"({"prompt":[]})", false, 400, "prompt");
  expect_error(R"({"max_tokens":3})", false, 400, "prompt: required");
  expect_error(R"({"prompt":"x","messages":[]})", false, 400, "unrecognized");
  try {
    parse_completion_request(R"({"model":"x"})", true, limits());
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code, "model_not_found");
    const json j = error_json(e);
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], "model");
    EXPECT_EQ(j["error"]["code"], "model_not_found");
  }
}

TEST(ServerProtocol, RenderPromptLimits) {
  auto tok = Tokenizer::load(std::string(DSINFER_SOURCE_DIR) + "/models/embedded/target");
  ProtocolLimits l = limits();
  CompletionRequest chat = parse_completion_request(kChat, true, l);
  const std::vector<int32_t> ids = render_prompt(chat, *tok, l);
  EXPECT_GT(ids.size(), 3u);  // the ChatML markers around "hi"
  // Completions text never turns into control tokens.
  CompletionRequest t = parse_completion_request(R"({"prompt":"<|im_end|>"})", false, l);
  for (int32_t id : render_prompt(t, *tok, l)) EXPECT_FALSE(tok->is_special(id));
  CompletionRequest big = parse_completion_request(R"({"prompt":[1,2,3,99999]})", false, l);
  EXPECT_THROW(render_prompt(big, *tok, l), ApiError);
  std::string long_text(2000, 'a');
  long_text.append(" b c d e f g h i j k l m n o p q r s t u v w x y z");
  CompletionRequest long_prompt = parse_completion_request(json{{"prompt", long_text}}.dump(), false, l);
  try {
    render_prompt(long_prompt, *tok, l);
    ADD_FAILURE() << "long prompt accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
  }
}

TEST(ServerProtocol, ResponseShapes) {
  CompletionRequest chat = parse_completion_request(kChat, true, limits());
  json c = chunk_json(chat, "id1", 5, "", true, "");
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  c = chunk_json(chat, "id1", 5, "", false, "length");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(c["choices"][0]["delta"].empty());
  json u = usage_chunk_json(chat, "id1", 5, Usage{3, 4});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 7);
  json body = completion_json(chat, "id1", 5, "hey", "stop", Usage{3, 1});
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(body["usage"]["completion_tokens"], 1);
  CompletionRequest text = parse_completion_request(R"({"prompt":"a"})", false, limits());
  EXPECT_EQ(chunk_json(text, "x", 1, "t", true, "")["choices"][0]["text"], "t");
  EXPECT_EQ(completion_json(text, "x", 1, "t", "stop", {})["object"], "text_completion");
  // Text that is not valid UTF-8 never breaks the stream.
  EXPECT_NE(sse_event(json{{"t", std::string("\xff")}}).find("data: "), std::string::npos);
}

TEST(ServerRuntimeConfig, ValidatesAndChangesNothingOnError) {
  DflashSettings cur;
  cur.max_reuse_depth = 8;
  cur.schedule_policy = "dspark";
  SettingsCaps caps{true, true, true, 8};
  DflashSettings n = apply_settings_patch(cur, R"({"validation_threshold":0.5,"max_reuse_depth":3})", caps);
  EXPECT_FLOAT_EQ(n.validation_threshold, 0.5f);
  EXPECT_EQ(n.max_reuse_depth, 3);
  EXPECT_EQ(to_engine_config(n, caps).max_reuse_depth, 3);
  EXPECT_EQ(to_engine_config(cur, caps).max_reuse_depth, -1);  // the full block
  EXPECT_EQ(apply_settings_patch(cur, R"({"schedule_policy":"threshold","validation_threshold":0.2})", caps).schedule_policy,
            "threshold");
  for (const char* bad : {R"({"validation_threshold":1.5})", R"({"validation_threshold":"x"})", R"({"max_reuse_depth":0})",
                          R"({"max_reuse_depth":9})", R"({"schedule_policy":"nope"})", R"({"admission_policy":"lifo"})",
                          R"({"async_prefetch":1})", R"({"window_size":-1})", R"({"unknown":1})", "{}", "[1]",
                          "{", R"({"schedule_policy":"threshold"})"}) {
    try {
      apply_settings_patch(cur, bad, caps);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << bad;
    }
  }
  SettingsCaps plain{false, false, false, 0};
  EXPECT_THROW(apply_settings_patch(cur, R"({"schedule_policy":"dspark"})", plain), ApiError);
  EXPECT_THROW(apply_settings_patch(cur, R"({"max_reuse_depth":1})", plain), ApiError);
  EXPECT_THROW(apply_settings_patch(cur, R"({"window_size":64})", caps), ApiError);  // no window support
  SettingsCaps windowed{true, true, true, 8, true, 512};
  EXPECT_EQ(apply_settings_patch(cur, R"({"window_size":64})", windowed).window_size, 64);
  EXPECT_THROW(apply_settings_patch(cur, R"({"window_size":1024})", windowed), ApiError);  // above the loaded window
  EXPECT_THROW(apply_settings_patch(cur, R"({"window_size":0})", windowed), ApiError);
  DflashSettings w = apply_settings_patch(cur, R"({"window_size":512,"admission_policy":"hybrid"})", windowed);
  EXPECT_EQ(to_engine_config(w, windowed).window_size, 0);  // the loaded window
  EXPECT_EQ(to_engine_config(w, windowed).scheduler_policy, SchedulerPolicy::Hybrid);
  EXPECT_NO_THROW(apply_settings_patch(cur, R"({"admission_policy":"fcfs","async_prefetch":false})", caps));
  // Async prefetch: on with a drafter (and in the engine config), refused without one.
  const DflashSettings a = apply_settings_patch(cur, R"({"async_prefetch":true})", caps);
  EXPECT_TRUE(a.async_prefetch);
  EXPECT_TRUE(to_engine_config(a, caps).async_prefetch);
  EXPECT_EQ(settings_json(a).at("async_prefetch"), true);
  EXPECT_THROW(apply_settings_patch(cur, R"({"async_prefetch":true})", plain), ApiError);
}

TEST(ServerMetrics, StepObservationsBecomeCountersAndHistograms) {
  ServerMetrics m(4);
  StepObservation o;
  o.decoding = 2;
  o.verified = 6;
  o.verified_per_request = {4, 2};
  o.accepted_per_request = {2, 0};
  m.observe_step(o);
  StepObservation prefill_only;  // no verify entry: not a decoding step
  prefill_only.prefill_tokens = 10;
  m.observe_step(prefill_only);
  m.observe_request(RequestTiming{"stop", 0.05, 0.25, 5});
  m.observe_request(RequestTiming{"disconnected", -1, 0.01, 0});
  m.count_rejected(400);
  EngineStats st;
  st.generated_tokens = 10;
  st.accepted_draft_tokens = 4;
  st.verified_draft_tokens = 6;
  st.step_seconds = 2.5;
  st.draft_seconds = 0.5;
  st.forward_seconds = 1.5;
  st.choice_steps = 7;
  st.choice_closed = 3;
  st.choice_chosen = 9;
  st.choice_probes = 1;
  st.capture_skipped_steps = 5;
  st.drafting_retired = 4;
  const std::string text = m.render(st, "model\"x");
  auto has = [&](const std::string& line) {
    std::string needle = "\n";
    needle.append(line).append("\n");
    EXPECT_NE(text.find(needle), std::string::npos) << "missing: " << line;
  };
  has("dflash_kv_reuse_rate 0.40000000000000002");
  has("dflash_validation_failures_total 2");
  has("dsinfer_decode_steps_total 1");
  has("dsinfer_spec_position_verified_total{position=\"1\"} 2");
  has("dsinfer_spec_position_verified_total{position=\"3\"} 1");
  has("dsinfer_spec_position_accepted_total{position=\"1\"} 1");
  has("dsinfer_spec_position_accepted_total{position=\"2\"} 1");
  has("dsinfer_spec_position_accepted_total{position=\"3\"} 0");
  has("dsinfer_spec_tokens_per_round_bucket{le=\"1\"} 1");  // the round that accepted 0
  has("dsinfer_spec_tokens_per_round_bucket{le=\"3\"} 2");
  has("dsinfer_verify_budget_per_step_sum 6");
  has("dsinfer_requests_total{outcome=\"disconnected\"} 1");
  has("dsinfer_requests_rejected_total{code=\"400\"} 1");
  has("dsinfer_time_per_output_token_seconds_count 1");  // TPOT only with > 1 token
  has("dsinfer_time_to_first_token_seconds_count 1");
  has("dsinfer_e2e_request_latency_seconds_count 2");
  has("dsinfer_engine_step_seconds_total 2.5");
  has("dsinfer_engine_draft_seconds_total 0.5");
  has("dsinfer_engine_forward_seconds_total 1.5");
  has("dsinfer_drafting_choice_steps_total 7");
  has("dsinfer_drafting_choice_closed_total 3");
  has("dsinfer_drafting_choice_chosen_total 9");
  has("dsinfer_drafting_choice_probes_total 1");
  has("dsinfer_capture_skipped_steps_total 5");
  has("dsinfer_drafting_retired_total 4");
  EXPECT_NE(text.find("model=\"model\\\"x\""), std::string::npos);  // label value escaped
}

TEST(ServerDflashLog, LineHasGenerateFieldsAndTheRequest) {
  EngineRound r;
  r.request_id = 7;
  r.log_id = "chatcmpl-1-2";
  r.step = 42;
  r.batch = 3;
  r.drafted_ids = {5, 6, 7};
  r.drafted_confidences = {0.9f, std::numeric_limits<float>::quiet_NaN(), 0.25f};
  r.round.index = 2;
  r.round.start = 10;
  r.round.anchor = 4;
  r.round.draft_ids = {5, 6};
  r.round.confidences = {0.9f, 0.5f};
  r.round.drafted = 3;
  r.round.verify_len = 3;
  r.round.accepted = 1;
  r.round.next_token = 9;
  r.round.committed = 2;
  r.round.draft_ms = 1.5;
  r.round.verify_ms = 2.5;
  r.step_ms = 4.5;
  const json j = json::parse(engine_round_json(r));
  EXPECT_EQ(j.at("request_id"), "chatcmpl-1-2");
  EXPECT_EQ(j.at("engine_request_id"), 7);
  EXPECT_EQ(j.at("step"), 42);
  EXPECT_EQ(j.at("batch"), 3);
  EXPECT_EQ(j.at("round"), 2);
  EXPECT_EQ(j.at("start"), 10);
  EXPECT_EQ(j.at("anchor"), 4);
  EXPECT_EQ(j.at("draft_ids"), json({5, 6}));
  EXPECT_EQ(j.at("confidences").size(), 2u);
  EXPECT_EQ(j.at("drafted"), 3);
  EXPECT_EQ(j.at("verify_len"), 3);
  EXPECT_EQ(j.at("accepted"), 1);
  EXPECT_EQ(j.at("next_token"), 9);
  EXPECT_EQ(j.at("committed"), 2);
  EXPECT_DOUBLE_EQ(j.at("draft_ms").get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(j.at("verify_ms").get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j.at("step_ms").get<double>(), 4.5);
  EXPECT_EQ(j.at("drafted_ids"), json({5, 6, 7}));
  EXPECT_TRUE(j.at("drafted_confidences")[1].is_null());  // not finite
  r.log_id.clear();  // the warm-up request
  EXPECT_TRUE(json::parse(engine_round_json(r)).at("request_id").is_null());
}

TEST(ServerDflashLog, ServeRefusesBadPathsAndFlagValuesAtStartUp) {
  const auto r = dsinfer_test::run_dsinfer({"serve", "--port", "0", "--log-dflash-details", "/nonexistent/dir/x.jsonl"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--log-dflash-details"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  for (const char* flag : {"--enable-metrics=maybe", "--enable-health-check=maybe"}) {
    const auto b = dsinfer_test::run_dsinfer({"serve", "--port", "0", flag});
    EXPECT_NE(b.exit_code, 0) << flag;
    EXPECT_NE(b.err.find(std::string(flag).substr(0, std::string(flag).find('='))), std::string::npos) << b.err;
  }
}
