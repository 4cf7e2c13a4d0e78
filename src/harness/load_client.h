// dsinfer harness: one streaming OpenAI request, measured from the client's side.
//
// Data flow: (url, path, JSON body) --http_post_stream--> body pieces, each timestamped on
// arrival --SseParser--> events --parse_openai_chunk--> RequestResult: time to first token
// (first chunk with text), the gaps between text chunks (inter-token latency; a server that
// sends several tokens in one chunk yields one gap for them), end-to-end latency, output
// tokens (the server's usage.completion_tokens when it sends one, else the number of text
// chunks), and on failure an error kind:
//   connect      no TCP connection
//   read/write   the connection broke mid-request (or the read timed out)
//   http_4xx     the server refused the request (status in `http_status`)
//   http_5xx     the server failed or is shutting down
//   stream_error an error object inside the stream
//   protocol     a chunk that is not JSON, or the stream ended without [DONE]
#pragma once
#include <string>
#include <vector>

#include "harness/http_client.h"

namespace dsinfer::harness {

struct RequestResult {
  bool ok = false;
  std::string error_kind, error;  // empty when ok
  int http_status = 0;
  double start_s = 0;             // send time, seconds after the run started
  double ttft_s = -1;             // -1: no text arrived
  double e2e_s = 0;
  std::vector<double> itl_s;      // gaps between consecutive text chunks
  int output_tokens = 0;
  int prompt_tokens = -1;         // from usage; -1 unknown
  bool tokens_from_usage = false;
  std::string finish_reason;
};

// Runs one streaming request. Never throws for network or server faults (they are
// results); `run_start` is the steady-clock origin that start_s is measured from.
RequestResult run_streaming_request(const BaseUrl& url, const std::string& path, const std::string& body,
                                    const HttpOptions& o, double run_start_s);

// Seconds on the steady clock (the origin every harness timestamp shares).
double now_s();

}  // namespace dsinfer::harness
