// dsinfer CLI: `dsinfer draft-vocab` ranks a tokenizer's ids by their frequency in a text
// corpus and writes the draft_vocab.json that --draft-vocab reads (spec/draft_vocab.h).
//
// Data flow: each --input file → documents (a .jsonl file: one JSON object per line, its
// "text" field, else its "prompt" field; any other file: its whole content) → the model
// directory's tokenizer (no special-token parsing: corpus text is plain text) → counts per id
// → rank_token_counts → --output, with --default-size as the size drafters use by default.
// Prints how much of the counted text the top N ids cover for N = 256, 512, ... so the
// default can be chosen against the measured acceptance.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json_util.h"
#include "core/mapped_file.h"
#include "model/config.h"
#include "spec/draft_vocab.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

struct DraftVocabArgs {
  std::string model_path;
  std::vector<std::string> inputs;
  std::string output;
  int default_size = 0;
  std::string source;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int run_draft_vocab(const DraftVocabArgs& a) {
  auto tok = Tokenizer::load(a.model_path);
  // The model's vocabulary when the directory has a config (the LM head's rows), else the
  // tokenizer's.
  const int V = file_exists(a.model_path + "/config.json") ? load_model_config(a.model_path).vocab_size : tok->vocab_size();
  if (a.default_size > V)
    throw Error("--default-size: " + std::to_string(a.default_size) + " exceeds the vocabulary (" + std::to_string(V) + " ids)");
  std::vector<uint64_t> counts(static_cast<size_t>(V), 0);
  uint64_t docs = 0, bytes = 0;
  const auto count = [&](std::string_view text) {
    for (int32_t id : tok->encode(text, /*parse_special=*/false)) {
      if (id < 0 || id >= V)
        throw Error(a.model_path + ": the tokenizer produced id " + std::to_string(id) + ", outside the model's vocabulary [0, " +
                    std::to_string(V) + ")");
      ++counts[static_cast<size_t>(id)];
    }
    ++docs;
    bytes += text.size();
  };
  for (const std::string& path : a.inputs) {
    if (!ends_with(path, ".jsonl")) {
      count(read_text_file(path));
      continue;
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("--input " + path + ": cannot open: " + std::strerror(errno));
    std::string line;
    for (int64_t n = 1; std::getline(f, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = path + ":" + std::to_string(n);
      const nlohmann::json j = parse_json(line, where);
      const char* field = j.is_object() && j.contains("text") ? "text" : "prompt";
      if (!j.is_object() || !j.contains(field) || !j.at(field).is_string())
        throw Error(where + ": expected an object with a string field 'text' or 'prompt'");
      count(j.at(field).get_ref<const std::string&>());
    }
  }
  DraftVocabRanking r = rank_token_counts(counts);
  if (r.total_tokens == 0) throw Error("--input: no tokens counted (empty input)");
  r.default_size = a.default_size;
  if (!a.source.empty()) {
    r.source = a.source;
  } else {
    for (const std::string& p : a.inputs) r.source += (r.source.empty() ? "" : ", ") + p;
  }
  write_draft_vocab(a.output, r);
  std::fprintf(stderr, "draft-vocab: %llu documents, %.1f MB, %llu tokens; ids seen: %d of %d\n",
               static_cast<unsigned long long>(docs), static_cast<double>(bytes) / 1e6,
               static_cast<unsigned long long>(r.total_tokens),
               static_cast<int>(std::count_if(counts.begin(), counts.end(), [](uint64_t c) { return c > 0; })), V);
  for (int n = 256; n < V; n *= 2)
    std::fprintf(stderr, "draft-vocab: top %5d ids cover %.2f %% of the tokens\n", n, 100.0 * draft_vocab_coverage(r, n));
  std::fprintf(stderr, "draft-vocab: wrote %s (default size %d)\n", a.output.c_str(), r.default_size);
  return 0;
}

}  // namespace

Runner register_draft_vocab(CLI::App& app) {
  auto a = std::make_shared<DraftVocabArgs>();
  CLI::App* sub = app.add_subcommand(
      "draft-vocab", "Rank token ids by frequency in a corpus: the draft_vocab.json that --draft-vocab reads");
  sub->add_option("--model-path", a->model_path, "Model (or tokenizer) directory whose tokenizer to count with")->required();
  sub->add_option("--input", a->inputs, "Text files: .jsonl (a 'text' or 'prompt' field per line) or plain text")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--output", a->output, "Where to write the ranking (draft_vocab.json)")->required();
  sub->add_option("--default-size", a->default_size,
                  "Ids a drafter uses when --draft-vocab is not given (0 = the whole vocabulary)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--source", a->source, "What the corpus is, recorded in the file (default: the input paths)");
  return [a] { return run_draft_vocab(*a); };
}

}  // namespace dsinfer::cli
