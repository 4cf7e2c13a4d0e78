// Shared by the CPU and CUDA DeepSeek-V4 tests (test_model_deepseek_v4, test_cuda_v4): the
// committed transformers golden cases under tests/data/deepseek_v4/<case>/ and the helpers
// that read and compare them.
//   golden.safetensors  F32 logits.prefill / logits.decode / logits.chunked [S, vocab]
//   golden.json         {"prompt", "chunks", "greedy", ...}
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace dsinfer::test {

inline const std::filesystem::path& v4_golden_root() {
  static const std::filesystem::path root = std::filesystem::path(DSINFER_TEST_DATA) / "deepseek_v4";
  return root;
}

// Every case directory (those with a golden.json), sorted.
inline std::vector<std::string> v4_case_dirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  if (!std::filesystem::is_directory(v4_golden_root(), ec)) return dirs;
  for (const auto& e : std::filesystem::directory_iterator(v4_golden_root()))
    if (e.is_directory() && std::filesystem::exists(e.path() / "golden.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

struct V4Golden {
  std::vector<int32_t> prompt, greedy;
  std::vector<int> chunks;
  std::map<std::string, std::vector<float>> logits;
};

// V > 0: every logits tensor must be [prompt length, V] (a gtest failure otherwise).
inline V4Golden read_v4_golden(const std::string& dir, int V = 0) {
  V4Golden g;
  const auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  g.prompt = j.at("prompt").get<std::vector<int32_t>>();
  g.greedy = j.at("greedy").get<std::vector<int32_t>>();
  g.chunks = j.at("chunks").get<std::vector<int>>();
  SafetensorsFile f(dir + "/golden.safetensors");
  for (const auto& t : f.header().tensors) {
    if (t.dtype != DType::F32) continue;
    if (V > 0) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{static_cast<int64_t>(g.prompt.size()), V})) << t.name;
    }
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), f.tensor_data(t), v.size() * 4);
    g.logits[t.name] = std::move(v);
  }
  return g;
}

// Worst (|diff| / row scale) over rows [0, n), the row scale being max(1, max |ref| of the row).
inline double worst_rel(const float* ours, const float* ref, int n, int V, int* at = nullptr) {
  double worst = 0;
  for (int t = 0; t < n; ++t) {
    double scale = 1.0, w = 0.0;
    for (int j = 0; j < V; ++j) scale = std::max(scale, std::abs(double(ref[size_t(t) * V + j])));
    for (int j = 0; j < V; ++j) w = std::max(w, std::abs(double(ours[size_t(t) * V + j]) - ref[size_t(t) * V + j]));
    if (w / scale > worst) {
      worst = w / scale;
      if (at) *at = t;
    }
  }
  return worst;
}

// Runs `tokens` through slot `slot` in chunks; returns the logits of every row.
inline std::vector<float> run_chunks(Model& m, KVCache& kv, int slot, const std::vector<int32_t>& tokens,
                                     const std::vector<int>& chunks) {
  std::vector<float> all;
  size_t at = 0;
  ForwardOutput out;
  for (int c : chunks) {
    ForwardBatch b;
    ForwardEntry e{slot, std::vector<int32_t>(tokens.begin() + at, tokens.begin() + at + c), {}};
    for (int i = 0; i < c; ++i) e.logit_rows.push_back(i);
    b.entries.push_back(e);
    m.forward(kv, b, out);
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    at += c;
  }
  return all;
}

}  // namespace dsinfer::test
