// dsinfer harness: the Prometheus text-format parser and the before/after figures (see
// prometheus.h). Label values may hold escaped quotes, backslashes, newlines, commas and
// braces; they are parsed character by character, never split on ','.
#include "harness/prometheus.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace dsinfer::harness {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

double parse_value(std::string_view v, int line_no) {
  if (v == "+Inf" || v == "Inf") return std::numeric_limits<double>::infinity();
  if (v == "-Inf") return -std::numeric_limits<double>::infinity();
  if (v == "NaN") return kNaN;
  std::string s(v);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size())
    throw Error("metrics line " + std::to_string(line_no) + ": bad sample value '" + s + "'");
  return d;
}

}  // namespace

double Scrape::get(const std::string& key) const {
  auto it = series.find(key);
  return it == series.end() ? kNaN : it->second;
}

double Scrape::sum(const std::string& name) const {
  double s = 0;
  bool any = false;
  for (auto it = series.lower_bound(name); it != series.end(); ++it) {
    const std::string& k = it->first;
    if (k.compare(0, name.size(), name) != 0) break;
    if (k.size() != name.size() && k[name.size()] != '{') continue;
    s += it->second;
    any = true;
  }
  return any ? s : kNaN;
}

Scrape parse_prometheus(std::string_view text) {
  Scrape out;
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t i = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i == line.size() || line[i] == '#') continue;
    const auto fail = [&](const std::string& why) {
      return Error("metrics line " + std::to_string(line_no) + ": " + why);
    };
    const size_t name_start = i;
    if (!name_char(line[i], true)) throw fail("expected a metric name");
    while (i < line.size() && name_char(line[i], false)) ++i;
    std::string key(line.substr(name_start, i - name_start));
    if (i < line.size() && line[i] == '{') {
      ++i;
      std::vector<std::pair<std::string, std::string>> labels;
      while (true) {
        while (i < line.size() && (line[i] == ' ' || line[i] == ',')) ++i;
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        const size_t ls = i;
        while (i < line.size() && name_char(line[i], i == ls)) ++i;
        if (i == ls) throw fail("expected a label name");
        std::string lname(line.substr(ls, i - ls));
        if (i >= line.size() || line[i] != '=') throw fail("expected '=' after label " + lname);
        ++i;
        if (i >= line.size() || line[i] != '"') throw fail("expected a quoted value for label " + lname);
        ++i;
        std::string value;
        bool closed = false;
        while (i < line.size()) {
          const char c = line[i++];
          if (c == '"') {
            closed = true;
            break;
          }
          if (c == '\\' && i < line.size()) {
            const char e = line[i++];
            value += e == 'n' ? '\n' : e;
          } else {
            value += c;
          }
        }
        if (!closed) throw fail("unterminated value of label " + lname);
        labels.emplace_back(std::move(lname), std::move(value));
      }
      std::sort(labels.begin(), labels.end());
      key += '{';
      for (size_t k = 0; k < labels.size(); ++k) {
        if (k) key += ',';
        key += labels[k].first + "=\"";
        for (char c : labels[k].second) {
          if (c == '"' || c == '\\') key += '\\';
          if (c == '\n') {
            key += "\\n";
            continue;
          }
          key += c;
        }
        key += '"';
      }
      key += '}';
    }
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t ve = i;
    while (ve < line.size() && line[ve] != ' ' && line[ve] != '\t') ++ve;
    if (ve == i) throw fail("missing sample value for " + key);
    out.series[key] = parse_value(line.substr(i, ve - i), line_no);  // a timestamp after it is ignored
  }
  return out;
}

ServerFigures server_figures(const Scrape& before, const Scrape& after) {
  const auto delta = [&](const std::string& name) { return after.sum(name) - before.sum(name); };
  const auto ratio = [](double num, double den) { return den > 0 ? num / den : (std::isnan(den) || std::isnan(num) ? kNaN : 0.0); };
  ServerFigures f;
  f.tau = ratio(delta("dsinfer_spec_tokens_per_round_sum"), delta("dsinfer_spec_tokens_per_round_count"));
  f.generated_tokens = delta("dsinfer_generation_tokens_total");
  f.reuse_rate_window = ratio(delta("dsinfer_accepted_draft_tokens_total"), f.generated_tokens);
  f.cache_hit_window = ratio(delta("dsinfer_prompt_tokens_cached_total"), delta("dsinfer_prompt_tokens_total"));
  f.reuse_rate_gauge = after.get("dflash_kv_reuse_rate");
  f.cache_hit_gauge = after.get("dspark_cache_hit_ratio");
  f.validation_failures = delta("dflash_validation_failures_total");
  f.kv_fragmentation = after.get("dsinfer_kv_cache_fragmentation_ratio");
  // Peak memory: the first of these names the server exports (ours may add a peak gauge;
  // process_resident_memory_bytes is the Prometheus client libraries' standard name).
  f.peak_memory_bytes = kNaN;
  for (const char* name : {"dsinfer_memory_peak_bytes", "process_peak_resident_memory_bytes", "process_resident_memory_bytes"}) {
    const double v = after.sum(name);
    if (!std::isnan(v)) {
      f.peak_memory_bytes = v;
      break;
    }
  }
  return f;
}

}  // namespace dsinfer::harness
