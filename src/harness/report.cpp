// dsinfer harness: level summaries and the JSON / Markdown / HTML+SVG reports (see report.h).
#include "harness/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>

#include "core/error.h"
#include "core/mapped_file.h"

namespace dsinfer::harness {

using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json summary_json(const Summary& s) {
  return {{"count", s.count}, {"mean", num(s.mean)}, {"min", num(s.min)}, {"p50", num(s.p50)},
          {"p90", num(s.p90)}, {"p99", num(s.p99)}, {"max", num(s.max)}};
}

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string bytes_str(double b) {
  if (!std::isfinite(b) || b <= 0) return "n/a";
  if (b >= 1024.0 * 1024 * 1024) return fmt("%.2f GiB", b / (1024.0 * 1024 * 1024));
  return fmt("%.1f MiB", b / (1024.0 * 1024));
}

std::string pct(double v) { return fmt("%.1f%%", v * 100); }

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// Markdown table -> HTML table (the reports share one table source).
std::string md_table_to_html(const std::string& md) {
  std::string out = "<table>\n";
  size_t pos = 0;
  int row = 0;
  while (pos < md.size()) {
    size_t nl = md.find('\n', pos);
    if (nl == std::string::npos) nl = md.size();
    std::string line = md.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.size() < 2 || line[0] != '|') continue;
    if (line.find("---") != std::string::npos) continue;
    std::vector<std::string> cells;
    size_t a = 1;
    while (a < line.size()) {
      size_t b = line.find('|', a);
      if (b == std::string::npos) break;
      std::string c = line.substr(a, b - a);
      const size_t s = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
      cells.push_back(s == std::string::npos ? "" : c.substr(s, e - s + 1));
      a = b + 1;
    }
    const char* tag = row == 0 ? "th" : "td";
    out += "<tr>";
    for (const std::string& c : cells) out += std::string("<") + tag + ">" + html_escape(c) + "</" + tag + ">";
    out += "</tr>\n";
    ++row;
  }
  return out + "</table>\n";
}

std::string level_table_md(const std::vector<LevelReport>& levels) {
  std::string t =
      "| level | done/sent | errors | TTFT P50 | TTFT P99 | TPOT P50 | ITL P50 | ITL P99 | E2E mean | E2E P50 | E2E P90 | "
      "E2E P99 | output tok/s | tok/s per user | req/s | τ | reuse | cache hit |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const LevelReport& l : levels) {
    std::string errs;
    for (const auto& [k, n] : l.errors) errs += (errs.empty() ? "" : " ") + k + ":" + std::to_string(n);
    if (errs.empty()) errs = "0";
    t += "| " + l.label + " | " + std::to_string(l.completed) + "/" + std::to_string(l.requests) + " | " + errs + " | " +
         format_seconds(l.ttft.p50) + " | " + format_seconds(l.ttft.p99) + " | " + format_seconds(l.tpot.p50) + " | " +
         format_seconds(l.itl.p50) + " | " + format_seconds(l.itl.p99) + " | " + format_seconds(l.e2e.mean) + " | " +
         format_seconds(l.e2e.p50) + " | " + format_seconds(l.e2e.p90) + " | " + format_seconds(l.e2e.p99) + " | " +
         fmt("%.1f", l.output_tps) + " | " + fmt("%.1f", l.per_user_tps) + " | " + fmt("%.2f", l.request_tps) + " | " +
         (l.server_scraped ? fmt("%.2f", l.server.tau) : "n/a") + " | " +
         (l.server_scraped ? pct(l.server.reuse_rate_window) : "n/a") + " | " +
         (l.server_scraped ? pct(l.server.cache_hit_window) : "n/a") + " |\n";
  }
  return t;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"};

// Round-number ticks covering [lo, hi] (the first <= lo, the last >= hi).
std::vector<double> nice_ticks(double lo, double hi, int want = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  // The last tick is the first one at or above hi, so an axis from ticks.front() to
  // ticks.back() holds every value.
  for (double v = std::floor(lo / step) * step;; v += step) {
    t.push_back(v);
    if (v >= hi - step * 1e-9) break;
  }
  return t;
}

std::string tick_label(double v) {
  char buf[32];
  if (std::fabs(v) >= 100 || v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string html_page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html_escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;"
         "margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}"
         "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}svg{margin:1em 1em 1em 0;"
         "border:1px solid #ddd}pre{background:#f7f7f7;padding:1em;overflow:auto}.warn{color:#b00}</style>"
         "</head><body>\n<h1>" +
         html_escape(title) + "</h1>\n" + body + "</body></html>\n";
}

std::string meta_md(const json& meta) {
  std::string s;
  for (const auto& [k, v] : meta.items()) s += "- " + k + ": " + (v.is_string() ? v.get<std::string>() : v.dump()) + "\n";
  return s;
}

// Plots for a set of named level lists (one series per name).
std::string plots_html(const std::vector<std::string>& names, const std::vector<std::vector<LevelReport>>& runs) {
  std::vector<PlotSeries> lat, pareto, ttft;
  const bool several = names.size() > 1;
  for (size_t m = 0; m < names.size(); ++m) {
    PlotSeries p50{several ? names[m] + " P50" : "E2E P50", {}, {}, {}};
    PlotSeries p90{several ? names[m] + " P90" : "E2E P90", {}, {}, {}};
    PlotSeries p99{several ? names[m] + " P99" : "E2E P99", {}, {}, {}};
    PlotSeries t50{several ? names[m] + " TTFT P50" : "TTFT P50", {}, {}, {}};
    PlotSeries t99{several ? names[m] + " TTFT P99" : "TTFT P99", {}, {}, {}};
    PlotSeries par{names[m], {}, {}, {}};
    for (const LevelReport& l : runs[m]) {
      const double x = l.concurrency > 0 ? l.concurrency : l.request_rate;
      if (std::isfinite(l.e2e.p50)) {
        p50.x.push_back(x), p50.y.push_back(l.e2e.p50);
        p90.x.push_back(x), p90.y.push_back(l.e2e.p90);
        p99.x.push_back(x), p99.y.push_back(l.e2e.p99);
      }
      if (std::isfinite(l.ttft.p50)) {
        t50.x.push_back(x), t50.y.push_back(l.ttft.p50);
        t99.x.push_back(x), t99.y.push_back(l.ttft.p99);
      }
      if (std::isfinite(l.per_user_tps) && std::isfinite(l.output_tps)) {
        par.x.push_back(l.output_tps);
        par.y.push_back(l.per_user_tps);
        par.point_labels.push_back(l.label);
      }
    }
    lat.push_back(p50);
    if (!several) lat.push_back(p90);
    lat.push_back(p99);
    ttft.push_back(t50);
    ttft.push_back(t99);
    pareto.push_back(par);
  }
  const bool by_rate = !runs.empty() && !runs[0].empty() && runs[0][0].concurrency <= 0;
  const std::string xl = by_rate ? "request rate (req/s)" : "concurrency (log2)";
  return svg_chart("End-to-end latency percentiles", xl, "seconds", lat, !by_rate) +
         svg_chart("Time to first token", xl, "seconds", ttft, !by_rate) +
         svg_chart("Per-user vs total throughput (Pareto view)", "total output tokens/s", "tokens/s per user", pareto,
                   false);
}

}  // namespace

LevelReport summarize_level(const std::string& label, const LoadPlan& plan, const LevelRun& run) {
  LevelReport l;
  l.label = label;
  l.concurrency = plan.request_rate > 0 ? 0 : plan.concurrency;
  l.request_rate = plan.request_rate;
  l.wall_s = run.wall_s;
  l.process_peak_rss_bytes = kNaN;
  l.process_cpu_utilisation = kNaN;
  l.server.tau = l.server.reuse_rate_window = l.server.cache_hit_window = kNaN;
  l.server.reuse_rate_gauge = l.server.cache_hit_gauge = l.server.peak_memory_bytes = kNaN;
  l.server.validation_failures = l.server.generated_tokens = l.server.kv_fragmentation = kNaN;
  std::vector<double> ttft, tpot, itl, e2e, per_user, prompt;
  for (const RequestResult& r : run.results) {
    ++l.requests;
    if (!r.ok) {
      ++l.failed;
      l.errors[r.error_kind]++;
      if (l.first_error.empty()) l.first_error = r.error_kind + ": " + r.error;
      continue;
    }
    ++l.completed;
    if (!r.tokens_from_usage) l.tokens_from_usage = false;
    l.output_tokens += r.output_tokens;
    e2e.push_back(r.e2e_s);
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    for (double g : r.itl_s) itl.push_back(g);
    if (r.prompt_tokens >= 0) prompt.push_back(r.prompt_tokens);
    if (r.output_tokens >= 2 && r.ttft_s >= 0 && r.e2e_s > r.ttft_s) {
      const double t = (r.e2e_s - r.ttft_s) / (r.output_tokens - 1);
      tpot.push_back(t);
      per_user.push_back(1.0 / t);
    }
  }
  l.ttft = summarize(ttft);
  l.tpot = summarize(tpot);
  l.itl = summarize(itl);
  l.e2e = summarize(e2e);
  l.output_tps = run.wall_s > 0 ? l.output_tokens / run.wall_s : kNaN;
  l.request_tps = run.wall_s > 0 ? l.completed / run.wall_s : kNaN;
  l.per_user_tps = mean(per_user);
  l.mean_prompt_tokens = mean(prompt);
  return l;
}

json level_json(const LevelReport& l) {
  json errs = json::object();
  for (const auto& [k, n] : l.errors) errs[k] = n;
  json j = {{"label", l.label},
            {"concurrency", l.concurrency},
            {"request_rate", l.request_rate},
            {"requests", l.requests},
            {"completed", l.completed},
            {"failed", l.failed},
            {"errors", errs},
            {"first_error", l.first_error},
            {"wall_s", l.wall_s},
            {"ttft_s", summary_json(l.ttft)},
            {"tpot_s", summary_json(l.tpot)},
            {"itl_s", summary_json(l.itl)},
            {"e2e_s", summary_json(l.e2e)},
            {"output_tokens", l.output_tokens},
            {"output_tokens_per_s", num(l.output_tps)},
            {"tokens_per_s_per_user", num(l.per_user_tps)},
            {"requests_per_s", num(l.request_tps)},
            {"mean_prompt_tokens", num(l.mean_prompt_tokens)},
            {"tokens_from_usage", l.tokens_from_usage},
            {"process_peak_rss_bytes", num(l.process_peak_rss_bytes)},
            {"process_cpu_utilisation", num(l.process_cpu_utilisation)}};
  if (l.server_scraped)
    j["server"] = {{"tau", num(l.server.tau)},
                   {"reuse_rate_window", num(l.server.reuse_rate_window)},
                   {"cache_hit_ratio_window", num(l.server.cache_hit_window)},
                   {"dflash_kv_reuse_rate", num(l.server.reuse_rate_gauge)},
                   {"dspark_cache_hit_ratio", num(l.server.cache_hit_gauge)},
                   {"validation_failures", num(l.server.validation_failures)},
                   {"generated_tokens", num(l.server.generated_tokens)},
                   {"peak_memory_bytes", num(l.server.peak_memory_bytes)},
                   {"kv_cache_fragmentation_ratio", num(l.server.kv_fragmentation)}};
  else
    j["server"] = nullptr;
  return j;
}

json to_json(const BenchReport& r) {
  json lv = json::array();
  for (const LevelReport& l : r.levels) lv.push_back(level_json(l));
  return {{"meta", r.meta}, {"levels", lv}};
}

json to_json(const CompareReport& r) {
  json modes = json::array();
  for (size_t m = 0; m < r.modes.size(); ++m) {
    json lv = json::array();
    for (const LevelReport& l : r.runs[m]) lv.push_back(level_json(l));
    modes.push_back({{"mode", r.modes[m]}, {"levels", lv}});
  }
  return {{"meta", r.meta}, {"modes", modes}};
}

std::string to_markdown(const BenchReport& r) {
  std::string s = "# dsinfer bench\n\n" + meta_md(r.meta) + "\n## Per level\n\n" + level_table_md(r.levels);
  s += "\nTimes: P50/P90/P99 are linear-interpolation percentiles over the level's completed requests. "
       "TPOT = (E2E - TTFT) / (output tokens - 1); tok/s per user = mean of 1/TPOT. "
       "τ, reuse and cache hit come from the server's /metrics (deltas over the level; n/a when not exported).\n";
  for (const LevelReport& l : r.levels) {
    if (!l.first_error.empty()) s += "\n- " + l.label + " first error: " + l.first_error + "\n";
    if (!l.tokens_from_usage)
      s += "\n- " + l.label + ": the server sent no usage; output tokens are counted as text chunks\n";
  }
  return s;
}

std::string compare_table_text(const CompareReport& r, size_t level) {
  struct Row {
    std::string name;
    bool lower_better;
    std::function<double(const LevelReport&)> get;
    std::function<std::string(double)> show;
  };
  const auto secs = [](double v) { return format_seconds(v); };
  const auto tps = [](double v) { return fmt("%.1f tok/s", v); };
  const std::vector<Row> rows = {
      {"P50 latency", true, [](const LevelReport& l) { return l.e2e.p50; }, secs},
      {"P99 latency", true, [](const LevelReport& l) { return l.e2e.p99; }, secs},
      {"TTFT P50", true, [](const LevelReport& l) { return l.ttft.p50; }, secs},
      {"throughput", false, [](const LevelReport& l) { return l.output_tps; }, tps},
      {"tok/s per user", false, [](const LevelReport& l) { return l.per_user_tps; }, tps},
      {"memory peak", true, [](const LevelReport& l) { return l.process_peak_rss_bytes; }, bytes_str},
      {"CPU utilisation", false, [](const LevelReport& l) { return l.process_cpu_utilisation; }, pct},
      {"reuse rate", false, [](const LevelReport& l) { return l.server_scraped ? l.server.reuse_rate_window : kNaN; }, pct},
      {"cache hit rate", false, [](const LevelReport& l) { return l.server_scraped ? l.server.cache_hit_window : kNaN; }, pct},
      {"tau", false, [](const LevelReport& l) { return l.server_scraped ? l.server.tau : kNaN; },
       [](double v) { return fmt("%.2f", v); }},
      {"errors", true, [](const LevelReport& l) { return static_cast<double>(l.failed); },
       [](double v) { return fmt("%.0f", v); }},
  };
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> head = {"metric"};
  for (size_t m = 0; m < r.modes.size(); ++m) head.push_back(r.modes[m]);
  for (size_t m = 1; m < r.modes.size(); ++m) head.push_back(r.modes[m] + " vs " + r.modes[0]);
  cells.push_back(head);
  for (const Row& row : rows) {
    std::vector<std::string> c = {row.name};
    std::vector<double> v;
    for (size_t m = 0; m < r.modes.size(); ++m) {
      const double x = level < r.runs[m].size() ? row.get(r.runs[m][level]) : kNaN;
      v.push_back(x);
      c.push_back(row.show(x));
    }
    for (size_t m = 1; m < r.modes.size(); ++m) {
      if (std::isfinite(v[0]) && std::isfinite(v[m]) && v[0] != 0) c.push_back(fmt("%+.1f%%", (v[m] / v[0] - 1) * 100));
      else c.push_back("n/a");
    }
    cells.push_back(c);
  }
  std::vector<size_t> w(head.size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  std::string out;
  const std::string label = !r.runs.empty() && level < r.runs[0].size() ? r.runs[0][level].label : "";
  out += "level " + label + "\n";
  for (const auto& row : cells) {
    for (size_t i = 0; i < row.size(); ++i) {
      std::string cell = row[i];
      cell.resize(w[i] + 2, ' ');
      out += i == 0 ? cell : "  " + cell;
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

std::string to_markdown(const CompareReport& r) {
  std::string s = "# dsinfer bench --compare\n\n" + meta_md(r.meta) + "\n";
  const size_t levels = r.runs.empty() ? 0 : r.runs[0].size();
  for (size_t i = 0; i < levels; ++i) {
    // The article's table, as Markdown.
    const std::string txt = compare_table_text(r, i);
    s += "## " + txt.substr(0, txt.find('\n')) + "\n\n";
    bool first = true;
    size_t pos = txt.find('\n') + 1;
    while (pos < txt.size()) {
      const size_t nl = txt.find('\n', pos);
      std::string line = txt.substr(pos, nl - pos);
      pos = nl + 1;
      // Columns are separated by 2+ spaces.
      std::vector<std::string> cells;
      size_t a = 0;
      while (a < line.size()) {
        size_t b = line.find("  ", a);
        if (b == std::string::npos) b = line.size();
        std::string c = line.substr(a, b - a);
        if (!c.empty()) cells.push_back(c);
        a = b;
        while (a < line.size() && line[a] == ' ') ++a;
      }
      s += "|";
      for (const auto& c : cells) s += " " + c + " |";
      s += "\n";
      if (first) {
        s += "|";
        for (size_t k = 0; k < cells.size(); ++k) s += "---|";
        s += "\n";
        first = false;
      }
    }
    s += "\n";
  }
  for (size_t m = 0; m < r.modes.size(); ++m) s += "## " + r.modes[m] + ": every level\n\n" + level_table_md(r.runs[m]) + "\n";
  return s;
}

std::string to_html(const BenchReport& r) {
  std::string body = "<ul>";
  for (const auto& [k, v] : r.meta.items())
    body += "<li>" + html_escape(k) + ": " + html_escape(v.is_string() ? v.get<std::string>() : v.dump()) + "</li>";
  body += "</ul>\n" + plots_html({"this server"}, {r.levels}) + "<h2>Per level</h2>\n" + md_table_to_html(level_table_md(r.levels));
  body += "<p>P50/P90/P99: linear-interpolation percentiles over completed requests. TPOT = (E2E &minus; TTFT) / "
          "(output tokens &minus; 1); tok/s per user = mean of 1/TPOT. &tau;, reuse and cache hit from the server's "
          "/metrics (n/a when it does not export them).</p>\n";
  for (const LevelReport& l : r.levels)
    if (!l.first_error.empty()) body += "<p class=\"warn\">" + html_escape(l.label + " first error: " + l.first_error) + "</p>\n";
  return html_page("dsinfer bench", body);
}

std::string to_html(const CompareReport& r) {
  std::string body = "<ul>";
  for (const auto& [k, v] : r.meta.items())
    body += "<li>" + html_escape(k) + ": " + html_escape(v.is_string() ? v.get<std::string>() : v.dump()) + "</li>";
  body += "</ul>\n" + plots_html(r.modes, r.runs);
  const std::string md = to_markdown(r);
  // Each "## " section of the Markdown becomes a heading and a table.
  size_t pos = md.find("\n## ");
  while (pos != std::string::npos) {
    const size_t next = md.find("\n## ", pos + 1);
    const std::string sec = md.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    const size_t nl = sec.find('\n');
    body += "<h2>" + html_escape(sec.substr(3, nl - 3)) + "</h2>\n" + md_table_to_html(sec.substr(nl + 1));
    pos = next;
  }
  return html_page("dsinfer bench --compare", body);
}

std::vector<std::string> write_reports(const std::string& dir, const std::string& name, const json& j,
                                       const std::string& markdown, const std::string& html) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("--out-dir: cannot create '" + dir + "': " + ec.message());
  const std::vector<std::string> paths = {dir + "/" + name + ".json", dir + "/" + name + ".md", dir + "/" + name + ".html"};
  write_text_file(paths[0], j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  write_text_file(paths[1], markdown);
  write_text_file(paths[2], html);
  return paths;
}

std::string svg_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<PlotSeries>& series, bool log2_x) {
  const double W = 560, H = 340, L = 70, R = 160, T = 36, B = 50;
  const auto tx = [&](double x) { return log2_x ? std::log2(std::max(x, 1e-9)) : x; };
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y1 = 0;
  for (const auto& s : series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, tx(s.x[i]));
      x1 = std::max(x1, tx(s.x[i]));
      y1 = std::max(y1, s.y[i]);
    }
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + tick_label(W) + "\" height=\"" + tick_label(H) +
                  "\" viewBox=\"0 0 " + tick_label(W) + " " + tick_label(H) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o += "<text x=\"" + tick_label(W / 2) + "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">" + html_escape(title) + "</text>\n";
  if (!std::isfinite(x0)) return o + "<text x=\"" + tick_label(W / 2) + "\" y=\"" + tick_label(H / 2) +
                                 "\" text-anchor=\"middle\">no data</text>\n</svg>\n";
  if (x1 == x0) {
    x0 -= 1;
    x1 += 1;
  }
  std::vector<double> yt = nice_ticks(0, y1 > 0 ? y1 : 1);
  const double ymax = yt.back();
  const auto px = [&](double x) { return L + (tx(x) - x0) / (x1 - x0) * (W - L - R); };
  const auto py = [&](double y) { return H - B - y / ymax * (H - T - B); };
  char buf[256];
  // Axes, grid, ticks.
  for (double v : yt) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%.1f\" y=\"%.1f\" "
                  "text-anchor=\"end\">",
                  L, py(v), W - R, py(v), L - 5, py(v) + 4);
    o += buf + tick_label(v) + "</text>\n";
  }
  if (log2_x) {
    for (int e = static_cast<int>(std::floor(x0)); e <= static_cast<int>(std::ceil(x1)); ++e) {
      const double v = std::pow(2.0, e);
      if (tx(v) < x0 - 1e-9 || tx(v) > x1 + 1e-9) continue;
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", px(v), H - B + 15);
      o += buf + tick_label(v) + "</text>\n";
    }
  } else {
    for (double v : nice_ticks(x0, x1)) {
      if (v < x0 - 1e-9 || v > x1 + 1e-9) continue;
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", px(v), H - B + 15);
      o += buf + tick_label(v) + "</text>\n";
    }
  }
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/><line x1=\"%.1f\" y1=\"%.1f\" "
                "x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n",
                L, H - B, W - R, H - B, L, T, L, H - B);
  o += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (L + W - R) / 2, H - 12);
  o += buf + html_escape(x_label) + "</text>\n";
  std::snprintf(buf, sizeof buf, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">", (T + H - B) / 2);
  o += buf + html_escape(y_label) + "</text>\n";
  // Series.
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* col = kColors[k % (sizeof kColors / sizeof kColors[0])];
    std::string pts;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(s.x[i]), py(s.y[i]));
      pts += buf;
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(s.x[i]), py(s.y[i]), col);
      o += buf;
      if (i < s.point_labels.size()) {
        std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", px(s.x[i]) + 5, py(s.y[i]) - 5, col);
        o += buf + html_escape(s.point_labels[i]) + "</text>\n";
      }
    }
    if (!pts.empty()) o += std::string("<polyline fill=\"none\" stroke=\"") + col + "\" stroke-width=\"1.5\" points=\"" + pts + "\"/>\n";
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">",
                  W - R + 12, T + 16.0 * k, col, W - R + 26, T + 16.0 * k + 9);
    o += buf + html_escape(s.name) + "</text>\n";
  }
  return o + "</svg>\n";
}

}  // namespace dsinfer::harness
