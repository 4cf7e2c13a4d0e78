// dsinfer harness: cpp-httplib client calls behind the small interface of http_client.h.
// One httplib::Client per call: the load client runs one request per thread, and a fresh
// connection per request is what an independent user looks like to the server.
#include "harness/http_client.h"

#include <httplib.h>

#include <chrono>

#include "core/error.h"

namespace dsinfer::harness {

namespace {

void configure(httplib::Client& c, const HttpOptions& o) {
  const auto us = [](double s) { return std::chrono::microseconds(static_cast<int64_t>(s * 1e6)); };
  c.set_connection_timeout(us(o.connect_timeout_s));
  c.set_read_timeout(us(o.read_timeout_s));
  c.set_write_timeout(us(o.read_timeout_s));
  c.set_keep_alive(false);
}

httplib::Headers headers(const HttpOptions& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

void fill_error(HttpResponse& r, httplib::Error e) {
  r.status = 0;
  switch (e) {
    case httplib::Error::Connection:
      r.error_kind = "connect";
      r.error = "cannot connect (connection refused or host unreachable)";
      break;
    case httplib::Error::ConnectionTimeout:
      r.error_kind = "connect";
      r.error = "connection timed out";
      break;
    case httplib::Error::Read:
      r.error_kind = "read";
      r.error = "read failed (server closed the connection or read timeout)";
      break;
    case httplib::Error::Write:
      r.error_kind = "write";
      r.error = "write failed";
      break;
    case httplib::Error::Canceled:
      r.error_kind = "cancelled";
      r.error = "cancelled";
      break;
    default:
      r.error_kind = "other";
      r.error = httplib::to_string(e);
  }
}

}  // namespace

BaseUrl parse_base_url(const std::string& url, const std::string& flag) {
  const std::string scheme = "http://";
  if (url.compare(0, 8, "https://") == 0)
    throw Error(flag + ": https is not supported by this build (use http://HOST:PORT), got '" + url + "'");
  if (url.compare(0, scheme.size(), scheme) != 0) throw Error(flag + ": expected http://HOST[:PORT], got '" + url + "'");
  std::string rest = url.substr(scheme.size());
  rest = rest.substr(0, rest.find('/'));
  BaseUrl b;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) throw Error(flag + ": unterminated IPv6 address in '" + url + "'");
    b.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') throw Error(flag + ": bad host in '" + url + "'");
  } else {
    const size_t colon = rest.find(':');
    b.host = rest.substr(0, colon);
    rest = colon == std::string::npos ? "" : rest.substr(colon);
  }
  if (b.host.empty()) throw Error(flag + ": no host in '" + url + "'");
  if (!rest.empty()) {
    const std::string p = rest.substr(1);
    if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
      throw Error(flag + ": bad port in '" + url + "'");
    b.port = std::stoi(p);
    if (b.port < 1 || b.port > 65535) throw Error(flag + ": port out of range in '" + url + "'");
  }
  return b;
}

HttpResponse http_get(const BaseUrl& url, const std::string& path, const HttpOptions& o) {
  httplib::Client c(url.host, url.port);
  configure(c, o);
  HttpResponse r;
  auto res = c.Get(path.c_str(), headers(o));
  if (!res) {
    fill_error(r, res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  return r;
}

HttpResponse http_post_json(const BaseUrl& url, const std::string& path, const std::string& body, const HttpOptions& o) {
  httplib::Client c(url.host, url.port);
  configure(c, o);
  HttpResponse r;
  auto res = c.Post(path.c_str(), headers(o), body, "application/json");
  if (!res) {
    fill_error(r, res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  return r;
}

HttpResponse http_post_stream(const BaseUrl& url, const std::string& path, const std::string& body, const HttpOptions& o,
                              const std::function<bool(std::string_view)>& on_data) {
  httplib::Client c(url.host, url.port);
  configure(c, o);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers(o);
  req.headers.emplace("Accept", "text/event-stream");
  req.body = body;
  req.set_header("Content-Type", "application/json");
  int status = 0;
  std::string error_body;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status < 200 || status >= 300) {
      if (error_body.size() < 65536) error_body.append(data, len);
      return true;
    }
    return on_data(std::string_view(data, len));
  };
  HttpResponse r;
  auto res = c.send(req);
  if (!res) {
    fill_error(r, res.error());
    if (status != 0 && res.error() == httplib::Error::Canceled) r.status = status;  // aborted by on_data
    return r;
  }
  r.status = res->status;
  if (!r.ok()) r.body = error_body.empty() ? res->body : error_body;
  return r;
}

std::string describe_failure(const BaseUrl& url, const std::string& method, const std::string& path, const HttpResponse& r) {
  std::string s = method + " " + url.origin() + path + ": ";
  if (r.status == 0) return s + r.error;
  std::string body = r.body.substr(0, 200);
  for (char& c : body)
    if (c == '\n' || c == '\r') c = ' ';
  return s + "HTTP " + std::to_string(r.status) + (body.empty() ? "" : ": " + body);
}

}  // namespace dsinfer::harness
