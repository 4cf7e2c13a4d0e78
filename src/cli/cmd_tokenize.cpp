// dsinfer CLI: `dsinfer tokenize` prints the token ids of a text with the model directory's
// tokenizer (only tokenizer.json / tokenizer_config.json are read, so DIR may hold nothing
// else). No BOS/EOS is added; special-token strings in the text map to their ids unless
// --no-parse-special. Output: ids separated by spaces, or with --json
// {"ids":[...],"tokens":[...]} where tokens are the vocabulary strings of the ids.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

struct TokenizeSettings {
  std::string model_path;
  std::string text;
  std::string file;
  bool json = false;
  bool no_parse_special = false;
};

int run_tokenize(const TokenizeSettings& s, bool have_text) {
  std::string input;
  if (have_text) {
    input = s.text;
  } else {
    std::ifstream f(s.file, std::ios::binary);
    if (!f) throw Error("--file " + s.file + ": cannot open: " + std::strerror(errno));
    std::ostringstream ss;
    ss << f.rdbuf();
    input = ss.str();
  }
  auto tok = Tokenizer::load(s.model_path);
  std::vector<int32_t> ids = tok->encode(input, !s.no_parse_special);
  std::string out;
  if (s.json) {
    nlohmann::json j;
    j["ids"] = ids;
    nlohmann::json toks = nlohmann::json::array();
    // Vocabulary strings are not always valid UTF-8 on their own (byte fallback tokens);
    // dump with replacement so the output is always valid JSON.
    for (int32_t id : ids) toks.push_back(tok->id_to_token(id));
    j["tokens"] = toks;
    out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  }
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

Runner register_tokenize(CLI::App& app) {
  auto s = std::make_shared<TokenizeSettings>();
  auto* sub = app.add_subcommand("tokenize", "Print the token ids of a text (no BOS/EOS added)");
  sub->add_option("--model-path", s->model_path, "Model directory holding tokenizer.json")->required();
  auto* text = sub->add_option("--text", s->text, "Text to tokenize");
  auto* file = sub->add_option("--file", s->file, "File whose bytes are tokenized");
  text->excludes(file);
  file->excludes(text);
  sub->add_flag("--json", s->json, "Print {\"ids\":[...],\"tokens\":[...]}");
  sub->add_flag("--no-parse-special", s->no_parse_special,
                "Tokenize special-token strings in the text as plain text");
  return [s, text, file] {
    if (text->count() == 0 && file->count() == 0) throw Error("tokenize: one of --text or --file is required");
    return run_tokenize(*s, text->count() > 0);
  };
}

}  // namespace dsinfer::cli
