// dsinfer harness: formatting of the server's cache statistics (see cache_report.h).
#include "harness/cache_report.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace dsinfer::harness {

using nlohmann::json;

namespace {

bool has_num(const json& j, const char* k) { return j.contains(k) && j[k].is_number(); }
double get(const json& j, const char* k) { return has_num(j, k) ? j[k].get<double>() : NAN; }

std::string line(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

}  // namespace

CacheStatsText format_cache_stats(const json& s) {
  if (!s.is_object()) throw Error("cache stats: expected a JSON object");
  CacheStatsText out;
  std::string& t = out.text;
  const double total = get(s, "blocks_total"), used = get(s, "blocks_used"), freeb = get(s, "blocks_free");
  const double bs = get(s, "block_size");
  if (std::isfinite(total) && total > 0) {
    t += line("KV pool: %.0f blocks", total) + (std::isfinite(bs) ? line(" of %.0f tokens", bs) : "") + "\n";
    t += line("  used %.0f (%.1f%%), free %.0f", used, 100.0 * used / total, freeb) + "\n";
    if (has_num(s, "blocks_cached"))
      t += line("  prefix-cache blocks %.0f (idle, evictable: %.0f)", get(s, "blocks_cached"), get(s, "blocks_cached_idle")) + "\n";
  } else {
    t += "KV pool: not reported\n";
  }
  if (s.contains("shards") && s["shards"].is_array()) {
    t += "Shards: " + std::to_string(s["shards"].size()) + "\n";
    int i = 0;
    for (const json& sh : s["shards"]) {
      const double st = get(sh, "total"), su = get(sh, "used");
      t += line("  shard %.0f: used %.0f/%.0f", i++, su, st) +
           line(" (%.1f%%), cached %.0f, hits %.0f", st > 0 ? 100.0 * su / st : 0.0, get(sh, "cached"), get(sh, "hit_blocks")) +
           line(", evictions %.0f, lent %.0f", get(sh, "evictions"), get(sh, "lent")) + "\n";
    }
  } else {
    t += "Shards: not reported\n";
  }
  if (has_num(s, "cache_hit_ratio"))
    t += line("Prefix-cache hit ratio: %.1f%% (%.0f of %.0f prompt tokens served from cache)", 100.0 * get(s, "cache_hit_ratio"),
              get(s, "cached_prompt_tokens"), get(s, "prompt_tokens")) + "\n";
  else
    t += "Prefix-cache hit ratio: not reported\n";
  if (has_num(s, "cache_fragmentation_ratio")) {
    const double f = get(s, "cache_fragmentation_ratio");
    t += line("Fragmentation: %.3f (%.0f unused of %.0f allocated slots)", f, get(s, "unused_slots"), get(s, "allocated_slots"));
    if (f > kFragmentationWarning) {
      out.fragmentation_warning = true;
      t += line("  WARNING: above %.2f; consider --enable-cache-defrag", kFragmentationWarning);
    }
    t += "\n";
  } else {
    t += "Fragmentation: not reported\n";
  }
  for (const char* k : {"alloc_failures", "copy_on_write", "dedup_swaps", "preemptions", "cache_defrags", "requests_running",
                        "requests_waiting"})
    if (has_num(s, k)) t += std::string(k) + ": " + line("%.0f", get(s, k)) + "\n";
  const char* prefix_keys[] = {"largest_cached_prefixes", "largest_prefixes"};
  bool listed = false;
  for (const char* k : prefix_keys) {
    if (!s.contains(k) || !s[k].is_array()) continue;
    listed = true;
    t += "Largest cached prefixes:\n";
    int i = 0;
    for (const json& p : s[k]) {
      std::string desc = p.dump();
      if (p.is_object()) {
        desc.clear();
        if (has_num(p, "tokens")) desc += line("%.0f tokens", get(p, "tokens"));
        if (has_num(p, "blocks")) desc += line(", %.0f blocks", get(p, "blocks"));
        if (has_num(p, "hits")) desc += line(", %.0f hits", get(p, "hits"));
        if (p.contains("text") && p["text"].is_string()) desc += ": \"" + p["text"].get<std::string>().substr(0, 60) + "\"";
        if (desc.empty()) desc = p.dump();
      }
      if (desc.size() > 160) desc = desc.substr(0, 160) + "...";
      t += "  " + std::to_string(++i) + ". " + desc + "\n";
    }
  }
  if (!listed) t += "Largest cached prefixes: not reported by this server\n";
  return out;
}

}  // namespace dsinfer::harness
