// dsinfer harness: the streaming request measurement (see load_client.h).
#include "harness/load_client.h"

#include <chrono>

#include "core/error.h"
#include "harness/sse.h"

namespace dsinfer::harness {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

RequestResult run_streaming_request(const BaseUrl& url, const std::string& path, const std::string& body,
                                    const HttpOptions& o, double run_start_s) {
  RequestResult r;
  const double t0 = now_s();
  r.start_s = t0 - run_start_s;
  SseParser parser;
  double last_text = -1;
  int text_chunks = 0;
  bool done = false;
  std::string stream_error, protocol_error;
  const auto on_data = [&](std::string_view piece) {
    const double t = now_s();
    for (const std::string& ev : parser.feed(piece)) {
      StreamChunk c;
      try {
        c = parse_openai_chunk(ev);
      } catch (const Error& e) {
        protocol_error = e.what();
        return false;
      }
      if (c.done) {
        done = true;
        continue;
      }
      if (!c.error.empty()) {
        stream_error = c.error;
        continue;
      }
      if (!c.text.empty()) {
        if (r.ttft_s < 0) r.ttft_s = t - t0;
        else r.itl_s.push_back(t - last_text);
        last_text = t;
        ++text_chunks;
      }
      if (!c.finish_reason.empty()) r.finish_reason = c.finish_reason;
      if (c.completion_tokens >= 0) {
        r.output_tokens = c.completion_tokens;
        r.tokens_from_usage = true;
      }
      if (c.prompt_tokens >= 0) r.prompt_tokens = c.prompt_tokens;
    }
    return true;
  };
  const HttpResponse res = http_post_stream(url, path, body, o, on_data);
  r.e2e_s = now_s() - t0;
  r.http_status = res.status;
  if (!r.tokens_from_usage) r.output_tokens = text_chunks;
  if (!protocol_error.empty()) {
    r.error_kind = "protocol";
    r.error = protocol_error;
  } else if (res.status == 0) {
    r.error_kind = res.error_kind == "connect" ? "connect" : res.error_kind == "write" ? "write" : "read";
    r.error = res.error;
  } else if (res.status >= 400) {
    r.error_kind = res.status < 500 ? "http_4xx" : "http_5xx";
    r.error = "HTTP " + std::to_string(res.status) + ": " + res.body.substr(0, 300);
  } else if (!stream_error.empty()) {
    r.error_kind = "stream_error";
    r.error = stream_error;
  } else if (!done) {
    r.error_kind = "protocol";
    r.error = "stream ended without data: [DONE]";
  } else {
    r.ok = true;
  }
  return r;
}

}  // namespace dsinfer::harness
