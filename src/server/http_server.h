// dsinfer server floor: the HTTP front of the batched engine (cpp-httplib).
//
// Data flow of POST /v1/chat/completions (and /v1/completions):
//   httplib worker thread: auth (Bearer --api-key; every path but /health) -> body limit
//   (413) -> parse_completion_request + render_prompt (openai_protocol.h; 4xx on bad
//   input, never reaching the engine) -> LLMEngine::submit with a callback ->
//   engine stepping thread: events (new text, then the final one) go into the request's
//   Exchange (mutex + condition variable; the callback never blocks) ->
//   worker thread: non-streaming waits for the final event in 100 ms slices, checking between
//   them that the client's socket is still open (a closed one cancels the engine request,
//   which frees its KV at the next step), then writes one JSON body;
//   streaming writes each piece as an SSE chunk, then the finish chunk, the usage chunk
//   (stream_options.include_usage) and `data: [DONE]`. A failed write (client gone) ends
//   the response and cancels the engine request, which frees its KV at the next step.
// The final engine event also feeds the metrics (outcome, TTFT, TPOT, end-to-end) and the
// --record-requests log.
//
// Lifecycle: start() binds and serves at once (/health answers 503 until set_backend()
// and mark_ready()), so load and warm-up are observable. begin_drain() (SIGTERM) refuses
// new requests at once (503, /health "draining"), lets in-flight responses finish for up
// to drain_timeout_s, cancels the rest, then closes the listening socket (not earlier:
// httplib ends every chunked response when it stops), and wait() returns when every
// worker is done.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine/llm_engine.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/request_log.h"
#include "server/runtime_config.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace dsinfer::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (see HttpServer::port())
  std::string api_key;             // "": no auth
  size_t max_body_bytes = 1 << 20;
  double drain_timeout_s = 30.0;
  int http_threads = 128;          // concurrent connections served (more wait in the accept queue)
  // --enable-metrics / --enable-health-check: false replaces GET /metrics or GET /health by a
  // 404 naming the flag (the metrics are still kept: /api/v1/cache/stats reads them).
  bool enable_metrics = true, enable_health_check = true;
  ProtocolLimits limits;
};

// What the handlers need once the model is loaded.
struct Backend {
  LLMEngine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  std::vector<int32_t> stop_ids;    // eos ids (dropped with ignore_eos)
  int max_model_len = 0;
  SettingsCaps caps;
  DflashSettings settings;          // initial settings (hot reload changes them)
  RequestLog* request_log = nullptr;
};

class HttpServer {
 public:
  HttpServer(HttpOptions opts, ServerMetrics& metrics);
  ~HttpServer();

  // Binds host:port (Error naming --host/--port when it cannot) and serves on a thread.
  void start();
  int port() const { return port_; }
  void set_backend(const Backend& b);
  // Model-dependent limits, set before mark_ready().
  void set_limits(const ProtocolLimits& l) { opts_.limits = l; }
  void mark_ready();
  // Stop accepting; in-flight requests get drain_timeout_s to finish, then are cancelled.
  void begin_drain();
  // Blocks until the server stopped (after begin_drain) and every worker returned.
  void wait();

  // Requests submitted to the engine and not yet finished.
  size_t in_flight() const;

 private:
  struct Exchange;
  void install_routes();
  void handle_completion(bool chat, const httplib::Request& req, httplib::Response& res);
  std::shared_ptr<Exchange> submit(bool chat, const CompletionRequest& r, std::vector<int32_t> prompt);
  void record_final(Exchange& x);  // metrics + request log of a finished request
  void unregister(Exchange& x);    // drops it from active_ (may free it)

  HttpOptions opts_;
  ServerMetrics& metrics_;
  std::unique_ptr<httplib::Server> svr_;
  std::thread listen_thread_, drain_thread_;
  int port_ = 0;
  std::atomic<bool> ready_{false}, draining_{false};
  // Set by the listen thread when listen_after_bind returns (see stop_listening).
  std::atomic<bool> listen_done_{false};
  // Closes the listening socket. cpp-httplib's stop() does nothing until the listen thread
  // has marked the server running, so a stop that came first (serve failing to load right
  // after start()) left accept() blocked and the join hung: wait for either first.
  void stop_listening();
  Backend backend_;
  mutable std::mutex mu_;           // settings_, active_
  DflashSettings settings_;
  std::map<uint64_t, std::shared_ptr<Exchange>> active_;  // by engine id, in flight
  int responses_open_ = 0;          // completion responses not yet fully written (mu_)
  std::condition_variable idle_cv_;
  std::atomic<uint64_t> next_id_{1};
  int64_t started_unix_ = 0;
};

}  // namespace dsinfer::server
