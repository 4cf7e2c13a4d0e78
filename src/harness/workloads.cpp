// dsinfer harness: dataset files, presets and request bodies (see workloads.h).
#include "harness/workloads.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/mapped_file.h"

namespace dsinfer::harness {

using nlohmann::json;

namespace {

// The embedded tokenizer's rate on the held-out prose: 33,722 characters -> 10,206 tokens
// (`dsinfer tokenize --model-path models/embedded/target --file prose.txt | wc -w`).
constexpr double kCharsPerToken = 3.3;

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open (preset data)");
  std::vector<std::string> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw Error(path + ":" + std::to_string(n) + ": invalid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw Error(path + ":" + std::to_string(n) + ": field 'prompt': expected a string");
    out.push_back(j["prompt"].get<std::string>());
  }
  if (out.empty()) throw Error(path + ": no prompts");
  return out;
}

// Cuts at the last newline or space before `max_chars` (never mid-word when avoidable).
// The cut lands on an ASCII byte, so UTF-8 stays whole.
std::string cut(const std::string& s, size_t max_chars) {
  if (s.size() <= max_chars) return s;
  size_t p = s.find_last_of("\n ", max_chars);
  if (p == std::string::npos || p < max_chars / 2) {
    p = max_chars;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
  }
  return s.substr(0, p);
}

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string d(buf, static_cast<size_t>(n));
  return d.substr(0, d.find_last_of('/'));
}

}  // namespace

Workload load_dataset(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  if (!in) throw Error(flag + ": cannot open '" + path + "'");
  Workload w;
  w.name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  std::string line;
  int n = 0;
  double first_arrival = -1;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw Error(where + ": invalid JSON: " + e.what());
    }
    if (!j.is_object()) throw Error(where + ": expected a JSON object per line");
    WorkItem it;
    if (auto p = j.find("params"); p != j.end()) {
      if (!p->is_object()) throw Error(where + ": field 'params': expected an object");
      it.params = *p;
    }
    if (auto e = j.find("endpoint"); e != j.end()) {
      if (!e->is_string()) throw Error(where + ": field 'endpoint': expected a string");
      const std::string ep = *e;
      if (ep != "/v1/chat/completions" && ep != "/v1/completions")
        throw Error(where + ": field 'endpoint': expected /v1/chat/completions or /v1/completions, got '" + ep + "'");
    }
    if (auto m = j.find("messages"); m != j.end()) {
      if (!m->is_array() || m->empty()) throw Error(where + ": field 'messages': expected a non-empty array");
      for (const auto& msg : *m)
        if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string() || !msg.contains("content"))
          throw Error(where + ": field 'messages': each entry needs 'role' and 'content'");
      it.chat = true;
      it.messages = *m;
    } else if (auto p = j.find("prompt"); p != j.end() && !p->is_null()) {
      if (!p->is_string() && !p->is_array()) throw Error(where + ": field 'prompt': expected a string or an array of token ids");
      if (p->is_string() && p->get<std::string>().empty()) throw Error(where + ": field 'prompt': empty");
      it.prompt = *p;
    } else if (auto t = j.find("prompt_text"); t != j.end()) {
      if (!t->is_string() || t->get<std::string>().empty()) throw Error(where + ": field 'prompt_text': expected a non-empty string");
      it.prompt = *t;
    } else if (auto ids = j.find("prompt_ids"); ids != j.end()) {
      if (!ids->is_array() || ids->empty()) throw Error(where + ": field 'prompt_ids': expected a non-empty array");
      it.prompt = *ids;
    } else {
      throw Error(where + ": needs one of 'prompt', 'messages', 'prompt_text' or 'prompt_ids'");
    }
    if (it.prompt.is_array())
      for (const auto& id : it.prompt)
        if (!id.is_number_integer() || id.get<int64_t>() < 0) throw Error(where + ": prompt ids must be non-negative integers");
    const json* mt = nullptr;
    if (j.contains("max_tokens")) mt = &j["max_tokens"];
    else if (it.params.contains("max_tokens")) mt = &it.params["max_tokens"];
    if (mt && !mt->is_null()) {
      if (!mt->is_number_integer() || mt->get<int64_t>() < 1 || mt->get<int64_t>() > (1 << 24))
        throw Error(where + ": field 'max_tokens': expected a positive integer");
      it.max_tokens = mt->get<int>();
    }
    // Fields that the request body sets itself.
    for (const char* k : {"max_tokens", "max_completion_tokens", "stream", "stream_options", "model"}) it.params.erase(k);
    if (auto a = j.find("arrival_unix_s"); a != j.end() && a->is_number()) {
      if (first_arrival < 0) first_arrival = a->get<double>();
      it.arrival_offset_s = std::max(0.0, a->get<double>() - first_arrival);
    }
    if (auto e = j.find("e2e_s"); e != j.end() && e->is_number()) it.recorded_e2e_s = e->get<double>();
    w.items.push_back(std::move(it));
  }
  if (w.items.empty()) throw Error(flag + ": '" + path + "' holds no requests");
  return w;
}

std::string find_eval_dir(const std::string& dir) {
  if (!dir.empty()) {
    if (!file_exists(dir + "/heldout_prose.jsonl")) throw Error("--data-dir: " + dir + "/heldout_prose.jsonl not found");
    return dir;
  }
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DSINFER_EVAL_DIR"); env && *env) candidates.push_back(env);
  const std::string ed = exe_dir();
  if (!ed.empty()) {
    candidates.push_back(ed + "/../models/eval");
    candidates.push_back(ed + "/../share/dsinfer/models/eval");
  }
  candidates.push_back("models/eval");
  for (const std::string& c : candidates)
    if (file_exists(c + "/heldout_prose.jsonl")) return c;
  throw Error("--preset: the held-out data (models/eval/heldout_*.jsonl) was not found; pass --data-dir DIR or --dataset FILE");
}

Workload make_preset(const std::string& name, const std::string& eval_dir) {
  Workload w;
  w.name = name;
  if (name == "chat") {
    w.default_max_tokens = 128;
    std::vector<std::string> all;
    for (const char* f : {"heldout_prose", "heldout_code", "heldout_python"})
      for (std::string& p : read_prompts(eval_dir + "/" + f + ".jsonl")) all.push_back(std::move(p));
    for (const std::string& p : all) {
      WorkItem it;
      it.chat = true;
      it.messages = json::array({{{"role", "user"}, {"content", "Continue this:\n" + cut(p, 300)}}});
      w.items.push_back(std::move(it));
    }
  } else if (name == "summarize") {
    w.default_max_tokens = 512;
    const std::vector<std::string> docs = read_prompts(eval_dir + "/heldout_prose.jsonl");
    const size_t target_chars = static_cast<size_t>(1280 * kCharsPerToken);
    for (size_t start = 0; start < docs.size(); ++start) {
      std::string doc;
      for (size_t k = 0; doc.size() < target_chars && k < docs.size(); ++k) doc += docs[(start + k) % docs.size()] + "\n\n";
      doc = cut(doc, target_chars - 60);
      WorkItem it;
      it.prompt = "Summarize the following document.\n\n" + doc + "\n\nSummary:";
      w.items.push_back(std::move(it));
    }
  } else if (name == "code") {
    w.default_max_tokens = 256;
    for (const char* f : {"heldout_code", "heldout_python"})
      for (std::string& p : read_prompts(eval_dir + "/" + f + ".jsonl")) {
        WorkItem it;
        it.prompt = std::move(p);
        w.items.push_back(std::move(it));
      }
    // Interleave C and Python so any prefix of the list mixes both.
    std::vector<WorkItem> mixed;
    const size_t half = w.items.size() / 2;
    for (size_t i = 0; i < half || half + i < w.items.size(); ++i) {
      if (i < half) mixed.push_back(w.items[i]);
      if (half + i < w.items.size()) mixed.push_back(w.items[half + i]);
    }
    w.items = std::move(mixed);
  } else {
    throw Error("--preset: expected chat, summarize or code, got '" + name + "'");
  }
  return w;
}

std::string request_path(const WorkItem& item) { return item.chat ? "/v1/chat/completions" : "/v1/completions"; }

std::string request_body(const WorkItem& item, const Workload& w, const RequestOptions& o) {
  json b = item.params.is_object() ? item.params : json::object();
  if (!o.model.empty()) b["model"] = o.model;
  if (item.chat) b["messages"] = item.messages;
  else b["prompt"] = item.prompt;
  const int max_tokens = o.max_tokens > 0 ? o.max_tokens : item.max_tokens > 0 ? item.max_tokens : w.default_max_tokens;
  if (max_tokens > 0) b["max_tokens"] = max_tokens;
  if (o.temperature >= 0) b["temperature"] = o.temperature;
  else if (!b.contains("temperature")) b["temperature"] = 0.0;
  if (o.ignore_eos) b["ignore_eos"] = true;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  return b.dump(-1, ' ', false, json::error_handler_t::replace);
}

int recorded_peak_concurrency(const Workload& w) {
  std::vector<std::pair<double, int>> ev;
  for (const WorkItem& it : w.items)
    if (it.arrival_offset_s >= 0 && it.recorded_e2e_s >= 0) {
      ev.emplace_back(it.arrival_offset_s, +1);
      ev.emplace_back(it.arrival_offset_s + it.recorded_e2e_s, -1);
    }
  if (ev.empty()) return 1;
  std::sort(ev.begin(), ev.end());  // an end and a start at the same instant: end first
  int cur = 0, peak = 1;
  for (auto& [t, d] : ev) peak = std::max(peak, cur += d);
  return peak;
}

}  // namespace dsinfer::harness
