// dsinfer harness: what the load generator sends — a list of OpenAI requests, from a file or
// from a built-in preset.
//
// Data flow: --dataset FILE (JSON lines: {"prompt": text | [ids]}, {"messages": [...]}, or a
// `dsinfer serve --record-requests` log line with endpoint / messages / prompt_text /
// prompt_ids / params) or --preset chat|summarize|code (built from the held-out text
// shipped in models/eval/heldout_*.jsonl) --> Workload (WorkItems) --request_body-->
// the JSON body of one streaming request (stream + stream_options.include_usage, so token
// counts come from the server's own usage figures).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsinfer::harness {

struct WorkItem {
  bool chat = false;            // /v1/chat/completions, else /v1/completions
  nlohmann::json messages;      // chat: array of {role, content}
  nlohmann::json prompt;        // completions: string or array of token ids
  int max_tokens = 0;           // 0: not given (the workload default or the server's)
  nlohmann::json params = nlohmann::json::object();  // other sampling fields (recorded logs)
  double arrival_offset_s = -1;  // recorded logs: seconds after the first request; else -1
  double recorded_e2e_s = -1;    // recorded logs: the latency the server recorded
};

struct Workload {
  std::string name;             // "chat", "summarize", "code" or the file name
  std::vector<WorkItem> items;
  int default_max_tokens = 0;   // applied when an item gives none (0: leave to the server)
};

// Reads JSON lines. Errors name FILE:LINE and the field (or `flag` when the file cannot be
// opened); an empty file is an error.
Workload load_dataset(const std::string& path, const std::string& flag = "--dataset");

// Where the held-out data lives: `dir` if given, else $DSINFER_EVAL_DIR, else
// <binary>/../models/eval, else ./models/eval. Throws Error naming --data-dir.
std::string find_eval_dir(const std::string& dir);

// chat: short chat turns (the first ~60 words of a held-out text, "continue this"), 128
// tokens out. summarize: ~1280 prompt tokens (held-out prose documents joined; 3.4
// characters per token, the embedded tokenizer's rate on that prose) asking for a
// summary, 512 out (the article's shape). code: held-out C and Python as raw completions,
// 256 out.
Workload make_preset(const std::string& name, const std::string& eval_dir);

struct RequestOptions {
  std::string model;         // "" : omitted (servers with one model accept that)
  int max_tokens = 0;        // > 0: overrides every item
  bool ignore_eos = false;   // send "ignore_eos": true (vLLM / llama.cpp / dsinfer extension)
  double temperature = -1;   // >= 0: overrides; < 0: the item's or greedy (0) when absent
};

// The request path and body for one item.
std::string request_path(const WorkItem& item);
std::string request_body(const WorkItem& item, const Workload& w, const RequestOptions& o);

// Peak number of requests in flight in a recorded log (from arrival and e2e); 1 when the
// log has no timing.
int recorded_peak_concurrency(const Workload& w);

}  // namespace dsinfer::harness
