// dsinfer core: JSON parsing with the project's error convention. Every file or request
// that holds JSON (config.json, tokenizer.json, safetensors headers and indexes,
// calibration.json, SPS caches, prompt files) goes through here, so a syntax error always
// reads "WHERE: invalid JSON: <parser message with its byte position>".
// Header-only, included only by the .cpp files that already use nlohmann::json, to keep
// the heavy header out of the others.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/mapped_file.h"

namespace dsinfer {

inline nlohmann::json parse_json(std::string_view text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": invalid JSON: " + e.what());
  }
}

// Reads and parses a JSON file; errors name the path.
inline nlohmann::json read_json_file(const std::string& path) { return parse_json(read_text_file(path), path); }

}  // namespace dsinfer
