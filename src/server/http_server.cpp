// dsinfer server floor: routes, auth, limits, SSE streaming, disconnect -> cancel and the
// SIGTERM drain (see http_server.h for the data flow).
#include "server/http_server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "core/error.h"

namespace dsinfer::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_json(e).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_json(httplib::Response& res, const json& j, int status = 200) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// Compares without an early exit, so the key cannot be guessed byte by byte from timing.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// Calls fn(fd) for each of this process's descriptors until it returns true; returns that
// descriptor, or -1.
template <typename Fn>
int find_descriptor(Fn&& fn) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    if (fn(static_cast<int>(fd))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

// The connection socket of a request. cpp-httplib 0.11 gives a handler neither its socket
// nor a close notification, so the socket is found among the process's open descriptors by
// its addresses: local port = the request's, peer = the request's remote address and port,
// converted as httplib does (getnameinfo, numeric). That pair is unique among the open TCP
// connections, and the socket stays open (owned by this request's worker) until the
// handler returns. -1 when none matches.
int connection_socket(const httplib::Request& req) {
  return find_descriptor([&](int fd) {
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
    if (req.local_port > 0 && port_of(local) != req.local_port) return false;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
    if (port_of(peer) != req.remote_port) return false;
    char host[NI_MAXHOST];
    return getnameinfo(reinterpret_cast<const sockaddr*>(&peer), peer_len, host, sizeof host, nullptr, 0,
                       NI_NUMERICHOST) == 0 &&
           req.remote_addr == host;
  });
}

// Raises the accept backlog of the server's listening socket on `port` to SOMAXCONN.
// Debian's cpp-httplib 0.11 is a shared library built with a backlog of 5
// (CPPHTTPLIB_LISTEN_BACKLOG): a burst of 128 clients then overflows the accept queue, the
// kernel drops handshakes and clients stall a second or more in SYN retries (and a client
// that gives up meanwhile is never seen). listen() on a listening socket only changes its
// backlog. The socket is found like connection_socket: by its address among our descriptors.
// Returns whether it was found.
bool raise_listen_backlog(int port) {
  const int fd = find_descriptor([&](int fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) return false;
    sockaddr_storage local{};
    socklen_t local_len = sizeof local;
    return getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0 && port_of(local) == port;
  });
  return fd >= 0 && ::listen(fd, SOMAXCONN) == 0;
}

// Whether the peer closed (FIN: recv returns 0) or reset the connection. Bytes waiting
// (a pipelined request) or none yet mean it is still there. Never blocks or consumes.
bool peer_closed(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

// GET handler of an endpoint switched off by its flag: 404 naming the flag.
auto disabled_endpoint(ServerMetrics& metrics, std::string what, std::string flag) {
  return [&metrics, what = std::move(what), flag = std::move(flag)](const httplib::Request&, httplib::Response& res) {
    metrics.count_rejected(404);
    send_error(res, ApiError(404, what + ": disabled by " + flag + "=false (the server was started without it)", {},
                             "endpoint_disabled"));
  };
}

}  // namespace

// One request between its handler thread and the engine's stepping thread.
struct HttpServer::Exchange {
  CompletionRequest req;
  std::vector<int32_t> prompt;
  std::string id;
  int64_t created = 0;
  Clock::time_point arrival;
  double arrival_unix = 0;
  uint64_t engine_id = 0;

  std::mutex mu;
  std::condition_variable cv;
  std::string unsent;      // text not yet written to the stream
  std::string text;        // all text (non-streaming body, request log)
  bool finished = false, first_sent = false;
  bool disconnected = false, drain_cancelled = false;
  std::string finish_reason, error;
  int prompt_tokens = 0, completion_tokens = 0;
  double ttft_s = -1, e2e_s = 0;
};

HttpServer::HttpServer(HttpOptions opts, ServerMetrics& metrics)
    : opts_(std::move(opts)), metrics_(metrics), svr_(std::make_unique<httplib::Server>()) {
  started_unix_ = static_cast<int64_t>(std::time(nullptr));
  install_routes();
}

void HttpServer::stop_listening() {
  while (!svr_->is_running() && !listen_done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  svr_->stop();
}

HttpServer::~HttpServer() {
  if (listen_thread_.joinable()) {
    stop_listening();
    listen_thread_.join();
  }
  if (drain_thread_.joinable()) drain_thread_.join();
}

void HttpServer::set_backend(const Backend& b) {
  std::lock_guard<std::mutex> lock(mu_);
  backend_ = b;
  settings_ = b.settings;
}

void HttpServer::mark_ready() { ready_ = true; }

size_t HttpServer::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_.size();
}

void HttpServer::install_routes() {
  httplib::Server& s = *svr_;
  const int threads = opts_.http_threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_payload_max_length(opts_.max_body_bytes);
  s.set_keep_alive_timeout(2);  // an idle keep-alive connection delays a drain by at most this

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!opts_.api_key.empty()) {
      const std::string h = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      if (h.compare(0, prefix.size(), prefix) != 0 || !same_secret(h.substr(prefix.size()), opts_.api_key)) {
        metrics_.count_rejected(401);
        send_error(res, ApiError(401, h.empty() ? "missing API key: send Authorization: Bearer <key>" : "invalid API key",
                                 {}, "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (draining_) {
      metrics_.count_rejected(503);
      send_error(res, ApiError(503, "server is shutting down", {}, {}, "server_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!ready_) {
      metrics_.count_rejected(503);
      send_error(res, ApiError(503, "model is loading; retry when GET /health returns 200", {}, {}, "server_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own refusals (413 body too large, 404 no route, 400 bad framing) get an
  // OpenAI error body; responses that already carry one are left alone.
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = "HTTP " + std::to_string(res.status);
    if (res.status == 413)
      msg = "request body: larger than the limit of " + std::to_string(opts_.max_body_bytes) + " bytes (--max-body-bytes)";
    else if (res.status == 404)
      msg = "no route for " + req.method + " " + req.path;
    metrics_.count_rejected(res.status);
    send_error(res, ApiError(res.status, msg));
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, what, {}, {}, "server_error"));
  });

  if (opts_.enable_health_check)
    s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (draining_) return send_json(res, {{"status", "draining"}}, 503);
      if (!ready_) return send_json(res, {{"status", "loading"}}, 503);
      send_json(res, {{"status", "ok"}});
    });
  else
    s.Get("/health", disabled_endpoint(metrics_, "GET /health", "--enable-health-check"));
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, models_json(opts_.limits.model_id, started_unix_));
  });
  s.Post("/v1/chat/completions",
         [this](const httplib::Request& req, httplib::Response& res) { handle_completion(true, req, res); });
  s.Post("/v1/completions",
         [this](const httplib::Request& req, httplib::Response& res) { handle_completion(false, req, res); });
  if (opts_.enable_metrics)
    s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.render(backend_.engine->stats(), opts_.limits.model_id), "text/plain; version=0.0.4");
    });
  else
    s.Get("/metrics", disabled_endpoint(metrics_, "GET /metrics", "--enable-metrics"));
  s.Get("/api/v1/cache/stats", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json j = metrics_.cache_stats_json(backend_.engine->stats());
    // The longest prefixes the cache holds, with the start of their text (dsinfer cache-stats).
    nlohmann::json prefixes = nlohmann::json::array();
    const int bs = j.value("block_size", 0);
    for (const CachedPrefix& p : backend_.engine->largest_cached_prefixes(8)) {
      nlohmann::json e = {{"tokens", p.tokens}, {"blocks", bs > 0 ? p.tokens / bs : 0}, {"in_use", p.in_use}};
      if (backend_.tokenizer) {
        try {
          e["text"] = backend_.tokenizer->decode(p.head_tokens, false);
        } catch (const Error&) {
        }
      }
      prefixes.push_back(std::move(e));
    }
    j["largest_cached_prefixes"] = std::move(prefixes);
    send_json(res, j);
  });
  s.Get("/api/v1/config/dflash", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    send_json(res, settings_json(settings_));
  });
  s.Post("/api/v1/config/dflash", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      const DflashSettings next = apply_settings_patch(settings_, req.body, backend_.caps);
      try {
        backend_.engine->set_runtime_config(to_engine_config(next, backend_.caps));
      } catch (const Error& e) {
        throw ApiError(400, e.what());
      }
      std::fprintf(stderr, "serve: config/dflash changed: %s -> %s (applies at the next engine step)\n",
                   settings_json(settings_).dump().c_str(), settings_json(next).dump().c_str());
      settings_ = next;
      metrics_.count_config_change();
      send_json(res, settings_json(settings_));
    } catch (const ApiError& e) {
      metrics_.count_rejected(e.status);
      send_error(res, e);
    }
  });
}

std::shared_ptr<HttpServer::Exchange> HttpServer::submit(bool chat, const CompletionRequest& r,
                                                         std::vector<int32_t> prompt) {
  auto x = std::make_shared<Exchange>();
  x->req = r;
  x->prompt = std::move(prompt);
  x->created = static_cast<int64_t>(std::time(nullptr));
  x->id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(started_unix_) + "-" + std::to_string(next_id_++);
  x->arrival = Clock::now();
  x->arrival_unix = unix_now();

  EngineRequest er;
  er.prompt = x->prompt;
  er.sampling.temperature = r.temperature;
  er.sampling.top_p = r.top_p;
  er.sampling.top_k = r.top_k;
  er.sampling.seed = r.seed_given ? r.seed : next_id_.load() * 0x9E3779B97F4A7C15ull;
  er.stop.max_tokens = r.max_tokens;
  er.stop.stop_strings = r.stop;
  er.log_id = x->id;  // --log-dflash-details names rounds by the response id
  if (!r.ignore_eos) er.stop.stop_ids = backend_.stop_ids;
  Exchange* raw = x.get();
  er.on_event = [this, raw](const RequestEvent& ev) {
    {
      std::lock_guard<std::mutex> lock(raw->mu);
      if (!ev.new_ids.empty() && raw->ttft_s < 0) raw->ttft_s = seconds_since(raw->arrival);
      raw->unsent += ev.new_text;
      raw->text += ev.new_text;
      if (ev.finished) {
        raw->finish_reason = ev.finish_reason;
        raw->error = ev.error;
        raw->prompt_tokens = ev.prompt_tokens;
        raw->completion_tokens = ev.completion_tokens;
        raw->e2e_s = seconds_since(raw->arrival);
      }
    }
    if (ev.finished) {
      // Counted before the handler can see `finished`: a client that has its answer must
      // find the request in /metrics (the handler may answer the moment the flag is set).
      record_final(*raw);
      std::lock_guard<std::mutex> lock(raw->mu);
      raw->finished = true;
    }
    raw->cv.notify_all();
    if (ev.finished) unregister(*raw);
  };
  // Held across submit so the final event (possibly on the stepping thread before submit
  // returns) finds the exchange registered.
  std::lock_guard<std::mutex> lock(mu_);
  try {
    x->engine_id = backend_.engine->submit(std::move(er));
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string param = msg.substr(0, msg.find(':'));
    throw ApiError(400, msg, param.size() < 40 ? param : std::string());
  }
  active_[x->engine_id] = x;
  return x;
}

void HttpServer::record_final(Exchange& x) {
  // Runs on the engine's stepping thread, once per request, before the handler is told.
  RequestTiming t;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(x.mu);
    reason = x.finish_reason;
    t.outcome = x.disconnected && reason == "cancelled" ? "disconnected" : reason;
    t.ttft_s = x.ttft_s;
    t.e2e_s = x.e2e_s;
    t.completion_tokens = x.completion_tokens;
  }
  metrics_.observe_request(t);
  if (backend_.request_log) {
    json rec = {{"endpoint", x.req.chat ? "/v1/chat/completions" : "/v1/completions"}, {"prompt_ids", x.prompt}};
    if (x.req.chat) {
      json msgs = json::array();
      for (const ChatMessage& m : x.req.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
      rec["messages"] = msgs;
      // Not "prompt": replay tools take exactly one of prompt / prompt_ids.
    } else if (!x.req.prompt_is_ids) {
      rec["prompt_text"] = x.req.prompt_text;
    }
    rec["params"] = x.req.params;
    rec["arrival_unix_s"] = x.arrival_unix;
    rec["ttft_s"] = t.ttft_s >= 0 ? json(t.ttft_s) : json(nullptr);
    rec["e2e_s"] = t.e2e_s;
    rec["prompt_tokens"] = x.prompt.size();
    rec["completion_tokens"] = t.completion_tokens;
    rec["finish_reason"] = t.outcome;
    backend_.request_log->write(rec);
  }
}

void HttpServer::unregister(Exchange& x) {
  // After the handler was told; active_ held a reference to x until here. engine_id is read
  // under mu_: the handler sets it (and registers x) under mu_ after submit returns, and a
  // request the engine finishes before that (a tiny model does, in microseconds) used to be
  // read here as id 0, so its real entry stayed in active_ for ever and every drain waited
  // out its timeout for it. x is not touched after the erase (it may drop the last
  // reference).
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.erase(x.engine_id);
  }
  idle_cv_.notify_all();
}

void HttpServer::handle_completion(bool chat, const httplib::Request& hreq, httplib::Response& res) {
  // Counted until the response is written (the drain waits for it): the streaming
  // releaser or the end of this handler (a non-streaming body is a few bytes written
  // right after) closes it.
  struct Open {
    HttpServer* self = nullptr;
    bool armed = true;
    void close() {
      if (!armed) return;
      armed = false;
      {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->responses_open_--;
      }
      self->idle_cv_.notify_all();
    }
    ~Open() { close(); }
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    responses_open_++;
  }
  auto open = std::make_shared<Open>();
  open->self = this;
  std::shared_ptr<Exchange> x;
  try {
    CompletionRequest r = parse_completion_request(hreq.body, chat, opts_.limits);
    std::vector<int32_t> prompt = render_prompt(r, *backend_.tokenizer, opts_.limits);
    const int room = backend_.max_model_len - static_cast<int>(prompt.size());
    if (room < 1)
      throw ApiError(400,
                     std::string(chat ? "messages" : "prompt") + ": " + std::to_string(prompt.size()) +
                         " tokens leave no room to generate within the model length (" +
                         std::to_string(backend_.max_model_len) + ")",
                     chat ? "messages" : "prompt", "context_length_exceeded");
    if (!r.max_tokens_given) r.max_tokens = std::min(r.max_tokens, room);
    x = submit(chat, r, std::move(prompt));
  } catch (const ApiError& e) {
    metrics_.count_rejected(e.status);
    return send_error(res, e);
  }

  if (!x->req.stream) {
    // Waits for the final event in short slices; between them, a client that closed its
    // connection cancels the request (its KV is freed at the next step; counted as
    // "disconnected"). The socket is looked up only when the first slice passes, so short
    // requests never pay for it.
    int fd = -2;  // -2: not looked up yet; -1: not found (the request then runs to its end)
    std::unique_lock<std::mutex> lock(x->mu);
    while (!x->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return x->finished; })) {
      if (x->disconnected) continue;  // cancelled; the final event follows at the next step
      if (fd == -2) {
        fd = connection_socket(hreq);
        if (fd < 0) {
          static std::atomic<bool> warned{false};
          if (!warned.exchange(true))
            std::fprintf(stderr, "serve: warning: connection socket of %s:%d not found: a non-streaming request "
                                 "whose client goes away runs to its end\n",
                         hreq.remote_addr.c_str(), hreq.remote_port);
        }
      }
      if (fd < 0 || !peer_closed(fd)) continue;
      x->disconnected = true;
      lock.unlock();
      backend_.engine->cancel(x->engine_id);
      lock.lock();
    }
    if (x->disconnected && x->finish_reason == "cancelled")  // nobody reads this answer
      return send_error(res, ApiError(400, "client closed the connection: request cancelled"));
    if (x->finish_reason == "error")
      return send_error(res, ApiError(500, "generation failed: " + x->error, {}, {}, "server_error"));
    if (x->finish_reason == "cancelled")
      return send_error(res, ApiError(503, "server is shutting down: request cancelled after the drain timeout", {}, {},
                                      "server_error"));
    return send_json(res, completion_json(x->req, x->id, x->created, x->text, x->finish_reason,
                                          Usage{x->prompt_tokens, x->completion_tokens}));
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [x](size_t, httplib::DataSink& sink) {
        std::unique_lock<std::mutex> lock(x->mu);
        x->cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return x->finished || !x->unsent.empty(); });
        std::string out;
        if (!x->unsent.empty() || !x->first_sent) {
          out += sse_event(chunk_json(x->req, x->id, x->created, x->unsent, !x->first_sent, ""));
          x->first_sent = true;
          x->unsent.clear();
        }
        if (x->finished) {
          if (x->finish_reason == "error" || x->finish_reason == "cancelled") {
            const ApiError e = x->finish_reason == "error"
                                   ? ApiError(500, "generation failed: " + x->error, {}, {}, "server_error")
                                   : ApiError(503, "server is shutting down: request cancelled", {}, {}, "server_error");
            out += sse_event(error_json(e));
          } else {
            out += sse_event(chunk_json(x->req, x->id, x->created, "", false, x->finish_reason));
            if (x->req.include_usage)
              out += sse_event(usage_chunk_json(x->req, x->id, x->created, Usage{x->prompt_tokens, x->completion_tokens}));
          }
          out += "data: [DONE]\n\n";
          lock.unlock();
          if (!sink.write(out.data(), out.size())) return false;
          sink.done();
          return true;
        }
        lock.unlock();
        // Nothing new: an SSE comment keeps proxies from timing out and lets a write
        // failure reveal a client that went away while the request waited.
        if (out.empty()) out = ": waiting\n\n";
        return sink.write(out.data(), out.size());
      },
      [this, x, open](bool success) {
        open->close();
        bool cancel = false;
        {
          std::lock_guard<std::mutex> lock(x->mu);
          if (!success && !x->finished) {
            x->disconnected = true;
            cancel = true;
          }
        }
        if (cancel) backend_.engine->cancel(x->engine_id);  // frees its KV at the next step
      });
}

void HttpServer::start() {
  const bool ok = opts_.port == 0 ? (port_ = svr_->bind_to_any_port(opts_.host)) > 0
                                  : svr_->bind_to_port(opts_.host, opts_.port);
  if (!ok)
    throw Error("--host/--port: cannot listen on " + opts_.host + ":" + std::to_string(opts_.port) +
                " (address in use or not local?)");
  if (opts_.port != 0) port_ = opts_.port;
  if (!raise_listen_backlog(port_))
    std::fprintf(stderr, "serve: warning: accept backlog left at cpp-httplib's 5 (listening socket not found)\n");
  listen_thread_ = std::thread([this] {
    svr_->listen_after_bind();
    listen_done_ = true;
  });
}

void HttpServer::begin_drain() {
  if (draining_.exchange(true)) return;
  drain_thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    const auto bound = std::chrono::duration<double>(opts_.drain_timeout_s);
    auto drained = [&] { return active_.empty() && responses_open_ == 0; };
    if (!idle_cv_.wait_for(lock, bound, drained)) {
      std::fprintf(stderr, "serve: drain timeout (%.1f s): cancelling %zu request(s)\n", opts_.drain_timeout_s,
                   active_.size());
      for (auto& [id, x] : active_) {
        {
          std::lock_guard<std::mutex> xl(x->mu);
          x->drain_cancelled = true;
        }
        backend_.engine->cancel(id);
      }
      idle_cv_.wait_for(lock, std::chrono::seconds(10), drained);
    }
    lock.unlock();
    stop_listening();  // closes the listening socket; idle keep-alive workers end within 2 s
  });
}

void HttpServer::wait() {
  if (listen_thread_.joinable()) listen_thread_.join();
  if (drain_thread_.joinable()) drain_thread_.join();
}

}  // namespace dsinfer::server
