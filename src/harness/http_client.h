// dsinfer harness: the small HTTP surface every harness command needs, over cpp-httplib's
// client (kept out of every other header: httplib.h is large and slow to compile).
//
// Data flow: a base URL ("http://host:port", an optional path prefix such as "/v1" is
// dropped by parse_base_url's caller) + a path --> HttpResponse {status, body} or a
// transport failure named in `error` (status 0). Streaming POSTs hand every received body
// piece to a callback as it arrives, which is how the load client timestamps SSE chunks.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace dsinfer::harness {

struct BaseUrl {
  std::string host;
  int port = 80;
  std::string origin() const { return "http://" + host + ":" + std::to_string(port); }
};

// Accepts http://HOST[:PORT][/...]; the path part is ignored (endpoints are absolute).
// Throws Error naming `flag` (e.g. "--url") for anything else (https is not built in).
BaseUrl parse_base_url(const std::string& url, const std::string& flag = "--url");

struct HttpResponse {
  int status = 0;         // 0: no HTTP response (see error)
  std::string body;
  std::string error;      // transport failure: "connection refused", "timeout", ...
  std::string error_kind; // "connect", "timeout", "read", "write", "other" when status == 0
  bool ok() const { return status >= 200 && status < 300; }
};

struct HttpOptions {
  std::string api_key;          // sent as Authorization: Bearer
  double connect_timeout_s = 5;
  double read_timeout_s = 600;  // per read: a long generation streams, so this is an idle bound
};

HttpResponse http_get(const BaseUrl& url, const std::string& path, const HttpOptions& o = {});
HttpResponse http_post_json(const BaseUrl& url, const std::string& path, const std::string& body, const HttpOptions& o = {});

// POST whose response body is delivered piece by piece; on_data returns false to abort.
// The returned body is empty (the pieces went to on_data) unless the status is not 2xx,
// in which case it holds the error body.
HttpResponse http_post_stream(const BaseUrl& url, const std::string& path, const std::string& body, const HttpOptions& o,
                              const std::function<bool(std::string_view)>& on_data);

// One line for a failed call: "GET http://h:p/metrics: connection refused" or
// "... : HTTP 503: <first 200 bytes of the body>".
std::string describe_failure(const BaseUrl& url, const std::string& method, const std::string& path, const HttpResponse& r);

}  // namespace dsinfer::harness
