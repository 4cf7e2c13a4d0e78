// dsinfer harness: `dsinfer cache-stats` — the KV pool of a running server, read from its
// GET /api/v1/cache/stats JSON (server/metrics.cpp cache_stats_json) and turned into text.
//
// Data flow: JSON body --format_cache_stats--> lines: pool occupancy, per-shard usage,
// prefix-cache hit ratio, fragmentation (allocated-but-unused slots / allocated slots) with
// the article's warning above 0.35, the largest cached prefixes when the server lists them.
// Fields the server does not send are printed as "not reported", never guessed.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace dsinfer::harness {

// The article's level: fragmentation above this is worth a defrag (--enable-cache-defrag).
constexpr double kFragmentationWarning = 0.35;

struct CacheStatsText {
  std::string text;
  bool fragmentation_warning = false;
};

// Throws Error ("cache stats: ...") when the body is not a JSON object.
CacheStatsText format_cache_stats(const nlohmann::json& stats);

}  // namespace dsinfer::harness
