// dsinfer CLI: `dsinfer cache-stats --url URL` — GET /api/v1/cache/stats of a running
// dsinfer server, printed for people (harness/cache_report.h) or as the raw JSON (--json).
// Exit 0 when the stats were read (a fragmentation warning is printed, not an error;
// --fail-on-warning turns it into exit 3 for scripts); 1 when the server cannot be read.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "harness/cache_report.h"
#include "harness/http_client.h"

namespace dsinfer::cli {

namespace {

struct CacheStatsArgs {
  std::string url, api_key;
  bool json = false, fail_on_warning = false;
};

int run_cache_stats(const CacheStatsArgs& a) {
  using namespace harness;
  const BaseUrl url = parse_base_url(a.url, "--url");
  HttpOptions h;
  h.api_key = a.api_key;
  h.read_timeout_s = 30;
  const HttpResponse r = http_get(url, "/api/v1/cache/stats", h);
  if (!r.ok()) throw Error("--url: " + describe_failure(url, "GET", "/api/v1/cache/stats", r));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.body);
  } catch (const nlohmann::json::exception& e) {
    throw Error("--url: " + url.origin() + "/api/v1/cache/stats: invalid JSON: " + e.what());
  }
  const CacheStatsText t = format_cache_stats(j);
  if (a.json) std::printf("%s\n", j.dump(2).c_str());
  else std::printf("%s", t.text.c_str());
  return a.fail_on_warning && t.fragmentation_warning ? 3 : 0;
}

}  // namespace

Runner register_cache_stats(CLI::App& app) {
  auto a = std::make_shared<CacheStatsArgs>();
  CLI::App* sub = app.add_subcommand("cache-stats", "KV pool occupancy, shards, prefix-cache hit ratio and fragmentation "
                                                    "of a running dsinfer server");
  sub->add_option("--url", a->url, "Server base URL, http://HOST:PORT")->required();
  sub->add_option("--api-key", a->api_key, "Sent as Authorization: Bearer KEY");
  sub->add_flag("--json", a->json, "Print the server's JSON as it is");
  sub->add_flag("--fail-on-warning", a->fail_on_warning, "Exit 3 when fragmentation is above 0.35");
  return [a] { return run_cache_stats(*a); };
}

}  // namespace dsinfer::cli
